// `trainer forward`: a model's fp32 logits for given token ids, for
// checking it against another implementation.
#include "tools/Forward.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "plugin/PluginRegistry.h"
#include "run/RunConfig.h"
#include "tools/TokenRows.h"
#include "trainer/Errors.h"
#include "trainer/Model.h"
#include "trainer/util/JsonSupport.h"
#include "util/Files.h"

namespace trainer {

namespace {

// --out names a file to write, never a directory nor one of the command's
// inputs (the recipe, the token ids, a file a [model] key reads such as
// init_from): the logits would replace it. Checked before the model is built.
void check_logits_destination(const Recipe& recipe, const std::string& tokens_file, const std::string& out_file) {
  std::vector<std::pair<std::string, std::string>> inputs = {{"--tokens file", tokens_file},
                                                             {"recipe file", recipe.file}};
  for (const Options::Entry& e : recipe.model.options.entries()) {
    if (const auto* text = std::get_if<std::string>(&e.value); text && !text->empty()) {
      inputs.emplace_back(fmt::format("[model] {} ({}) file", e.key, e.origin), *text);
    }
  }
  check_destination("--out", out_file, out_file, inputs, "writing the logits would replace it");
}

}  // namespace

void write_logits(const Recipe& recipe, const std::string& tokens_file, const std::string& out_file) {
  check_logits_destination(recipe, tokens_file, out_file);
  // A regular file or a pipe (`--tokens <(...)`); a device such as /dev/zero
  // would be read without end. Token ids for a forward pass are small: at
  // most kMaxBytes are read.
  constexpr size_t kMaxBytes = size_t(1) << 30;
  struct stat kind {};
  if (stat(tokens_file.c_str(), &kind) == 0 && !S_ISREG(kind.st_mode) && !S_ISFIFO(kind.st_mode)) {
    throw InputError(fmt::format("--tokens {}: expected a file of token ids (or a pipe); it is not one", tokens_file));
  }
  std::ifstream in(tokens_file, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open", tokens_file));
  std::string bytes;
  std::vector<char> chunk(size_t(1) << 16);
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
    bytes.append(chunk.data(), static_cast<size_t>(in.gcount()));
    if (bytes.size() > kMaxBytes) {
      throw InputError(fmt::format("--tokens {}: more than {} bytes; expected token ids for one forward pass",
                                   tokens_file, kMaxBytes));
    }
  }
  Context context;
  context.seed = static_cast<uint64_t>(recipe.run.integer("seed"));
  context.device = recipe.run.text("device");
  context.output_dir = output_dir_of(recipe);
  auto model = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  const std::vector<std::vector<int64_t>> rows = parse_token_rows(bytes, tokens_file, model->vocab_size());
  const torch::Device device = context.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::NoGradGuard no_grad;
  for (const NamedParameter& p : model->parameters()) p.tensor.set_data(p.tensor.to(device));
  torch::Tensor ids =
      torch::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, torch::kInt64);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < rows[r].size(); ++i) ids[r][i] = rows[r][i];
  }
  const torch::Tensor logits = model->logits(ids.to(device)).to(torch::kFloat32).cpu().contiguous();
  // Through OUT.tmp and a rename: a failed write leaves an earlier file whole.
  write_file_atomically(out_file, static_cast<const char*>(logits.data_ptr()),
                        static_cast<size_t>(logits.numel()) * sizeof(float));
  fmt::print("{}\n", Json{{"shape", logits.sizes().vec()}}.dump());
}

}  // namespace trainer
