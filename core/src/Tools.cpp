// trainer export and trainer forward.
#include "Tools.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "Checkpoint.h"
#include "TrainingLoop.h"
#include "trainer/Errors.h"
#include "trainer/JsonSupport.h"
#include "trainer/Model.h"
#include "trainer/Safetensors.h"

namespace trainer {

namespace fs = std::filesystem;

void export_run(const std::string& run_dir, const std::string& to) {
  // Export never replaces weights already written: not the source's own, not another export's.
  if (fs::weakly_canonical(to) == fs::weakly_canonical(run_dir)) {
    throw InputError(fmt::format("trainer export: --to {} is the directory exported from; choose another", to));
  }
  if (fs::exists(fs::path(to) / "model.safetensors")) {
    throw InputError(fmt::format("trainer export: {} already holds a model.safetensors; choose an empty directory", to));
  }
  if (fs::exists(fs::path(run_dir) / "manifest.json")) {  // a checkpoint
    export_checkpoint(run_dir, to);
    fmt::print("exported checkpoint {} to {}\n", run_dir, to);
    return;
  }
  const fs::path weights = fs::path(run_dir) / "model.safetensors";
  const fs::path config = fs::path(run_dir) / "config.json";
  if (!fs::exists(weights)) {
    throw InputError(fmt::format("{}: no model.safetensors (a run writes it when it finishes)", run_dir));
  }
  const SafetensorsReader check(weights.string());  // throws on a truncated or malformed file
  fs::create_directories(to);
  fs::copy_file(weights, fs::path(to) / "model.safetensors", fs::copy_options::overwrite_existing);
  if (fs::exists(config)) fs::copy_file(config, fs::path(to) / "config.json", fs::copy_options::overwrite_existing);
  fmt::print("exported {} tensors to {}\n", check.names().size(), to);
}

void write_logits(const Recipe& recipe, const std::string& tokens_file, const std::string& out_file) {
  std::ifstream in(tokens_file);
  if (!in) throw InputError(fmt::format("{}: cannot open", tokens_file));
  std::vector<std::vector<int64_t>> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::stringstream fields(line);
    std::vector<int64_t> row;
    for (int64_t id; fields >> id;) row.push_back(id);
    if (row.empty()) continue;
    if (!rows.empty() && row.size() != rows.front().size()) {
      throw InputError(fmt::format("{}:{}: {} ids, the first line has {}", tokens_file, number, row.size(), rows.front().size()));
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw InputError(fmt::format("{}: no token ids", tokens_file));
  Context context;
  context.seed = static_cast<uint64_t>(recipe.run.integer("seed"));
  context.device = recipe.run.text("device");
  context.output_dir = output_dir_of(recipe);
  auto model = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  const torch::Device device = context.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::NoGradGuard no_grad;
  for (const NamedParameter& p : model->parameters()) p.tensor.set_data(p.tensor.to(device));
  torch::Tensor ids = torch::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, torch::kInt64);
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
