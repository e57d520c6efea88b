// `trainer forward`: a model's fp32 logits for given token ids, for
// checking it against another implementation.
#include "tools/Forward.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "plugin/PluginRegistry.h"
#include "run/RunConfig.h"
#include "tools/TokenRows.h"
#include "trainer/Errors.h"
#include "trainer/Model.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {

void write_logits(const Recipe& recipe, const std::string& tokens_file, const std::string& out_file) {
  std::ifstream in(tokens_file, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open", tokens_file));
  std::stringstream text;
  text << in.rdbuf();
  Context context;
  context.seed = static_cast<uint64_t>(recipe.run.integer("seed"));
  context.device = recipe.run.text("device");
  context.output_dir = output_dir_of(recipe);
  auto model = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  const std::vector<std::vector<int64_t>> rows = parse_token_rows(text.str(), tokens_file, model->vocab_size());
  const torch::Device device = context.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::NoGradGuard no_grad;
  for (const NamedParameter& p : model->parameters()) p.tensor.set_data(p.tensor.to(device));
  torch::Tensor ids =
      torch::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, torch::kInt64);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < rows[r].size(); ++i) ids[r][i] = rows[r][i];
  }
  const torch::Tensor logits = model->logits(ids.to(device)).to(torch::kFloat32).cpu().contiguous();
  std::ofstream out(out_file, std::ios::binary);
  out.write(static_cast<const char*>(logits.data_ptr()), logits.numel() * 4);
  if (!out) throw InputError(fmt::format("{}: cannot write", out_file));
  fmt::print("{}\n", Json{{"shape", logits.sizes().vec()}}.dump());
}

}  // namespace trainer
