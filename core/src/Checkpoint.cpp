// Checkpoint writing, verification and loading (see Checkpoint.h).
#include "Checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ExactGradients.h"
#include "Files.h"
#include "Manifest.h"
#include "trainer/Errors.h"
#include "trainer/JsonSupport.h"
#include "trainer/Log.h"
#include "trainer/Safetensors.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace manifest;

namespace {

const char* kStateNames[] = {"values", "exp_avg", "exp_avg_sq"};

struct Chunk {
  int64_t begin = 0, end = 0;
};
// Rank r's canonical chunk of a group of n elements.
Chunk canonical(int64_t n, int rank, int world) {
  const int64_t c = (n + world - 1) / world;
  return Chunk{std::min(n, rank * c), std::min(n, (rank + 1) * c)};
}

// How many elements of `chunk` of group `group` the pieces [offset, offset +
// length) cover, or -1 when a piece lies outside the group or is not 1-D.
int64_t covered(const std::vector<std::tuple<size_t, int64_t, const torch::Tensor*>>& pieces, size_t group,
                int64_t group_numel, Chunk chunk) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [g, offset, tensor] : pieces) {
    if (g != group) continue;
    if (tensor->dim() != 1 || offset < 0 || offset + tensor->numel() > group_numel) return -1;
    const int64_t begin = std::max(chunk.begin, offset), end = std::min(chunk.end, offset + tensor->numel());
    if (end > begin) ranges.emplace_back(begin, end);
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t total = 0, reached = chunk.begin;
  for (const auto& [begin, end] : ranges) {  // overlapping (replicated) pieces count once
    total += std::max<int64_t>(0, end - std::max(begin, reached));
    reached = std::max(reached, end);
  }
  return total;
}

}  // namespace

std::vector<int64_t> group_sizes(Model& model) {
  int64_t numel[2] = {0, 0};
  for (const NamedParameter& p : model.parameters()) numel[p.decay ? 0 : 1] += p.tensor.numel();
  std::vector<int64_t> sizes;
  for (const int64_t n : numel) {
    if (n > 0) sizes.push_back(n);
  }
  return sizes;
}

void check_state_coverage(Strategy& strategy, Model& model, Comm& comm, torch::Device device,
                          const std::string& strategy_name) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::vector<int64_t> sizes = group_sizes(model);
  const std::vector<StateSlice> states = strategy.state_slices();
  const std::vector<FlatSlice> parameters = strategy.parameter_slices();
  std::vector<std::tuple<size_t, int64_t, const torch::Tensor*>> state_pieces, parameter_pieces;
  bool lengths_agree = true;
  for (const StateSlice& s : states) {
    state_pieces.emplace_back(s.group, s.offset, &s.values);
    lengths_agree = lengths_agree && s.exp_avg.numel() == s.values.numel() && s.exp_avg_sq.numel() == s.values.numel();
  }
  for (const FlatSlice& s : parameters) parameter_pieces.emplace_back(s.group, s.offset, &s.values);
  // Per group: [state elements missing, parameter elements missing], -1 for
  // a piece out of bounds; then one flag for unequal state lengths.
  std::vector<int64_t> local;
  bool unknown_group = false;
  for (const StateSlice& s : states) unknown_group = unknown_group || s.group >= sizes.size();
  for (const FlatSlice& s : parameters) unknown_group = unknown_group || s.group >= sizes.size();
  for (size_t g = 0; g < sizes.size(); ++g) {
    const Chunk mine = canonical(sizes[g], rank, world);
    const int64_t want = mine.end - mine.begin;
    for (const auto* pieces : {&state_pieces, &parameter_pieces}) {
      const int64_t have = covered(*pieces, g, sizes[g], mine);
      local.push_back(have < 0 ? -1 : want - have);
    }
  }
  local.push_back(lengths_agree && !unknown_group ? 0 : 1);
  const int64_t width = static_cast<int64_t>(local.size());
  torch::Tensor mine = torch::tensor(local, torch::kInt64).to(device);
  torch::Tensor all = torch::zeros({width * world}, mine.options());
  if (world > 1) {
    comm.all_gather(mine, all);
  } else {
    all.copy_(mine);
  }
  all = all.cpu();
  for (int r = 0; r < world; ++r) {
    const auto at = [&](int64_t k) { return all[r * width + k].item<int64_t>(); };
    if (at(width - 1) != 0) {
      throw InputError(
          fmt::format("strategy '{}': rank {}'s state slices name a group beyond the model's {} or "
                      "have values and moments of unequal lengths (trainer/Strategy.h, state_slices)",
                      strategy_name, r, sizes.size()));
    }
    for (size_t g = 0; g < sizes.size(); ++g) {
      for (int k = 0; k < 2; ++k) {
        const int64_t missing = at(static_cast<int64_t>(2 * g) + k);
        if (missing == 0) continue;
        const Chunk chunk = canonical(sizes[g], r, world);
        const char* what = k == 0 ? "state_slices" : "parameter_slices";
        if (missing < 0) {
          throw InputError(
              fmt::format("strategy '{}': rank {}'s {} hold a piece of group {} outside its {} "
                          "elements, or not 1-D",
                          strategy_name, r, what, g, sizes[g]));
        }
        throw InputError(
            fmt::format("strategy '{}': rank {}'s {} leave {} of the elements [{}, {}) of group {} "
                        "uncovered; rank r must hold chunk r of ceil(n / world size) elements of "
                        "every group (trainer/Strategy.h), which checkpoints and the final weights "
                        "are assembled from",
                        strategy_name, r, what, missing, chunk.begin, chunk.end, g));
      }
    }
  }
}

Checkpointer::Checkpointer(std::string root, int64_t keep, std::string fingerprint, std::string strategy_name)
    : root_(std::move(root)),
      keep_(keep),
      fingerprint_(std::move(fingerprint)),
      strategy_name_(std::move(strategy_name)) {}

std::string Checkpointer::save(Strategy& strategy, Model& model, Comm& comm, const TrainingPosition& position) {
  const int rank = comm.rank(), world = comm.world_size();
  const fs::path final_dir = fs::path(root_) / fmt::format("step-{:08d}", position.step);
  const fs::path temporary = fs::path(root_) / fmt::format("step-{:08d}.tmp", position.step);
  if (rank == 0) {
    remove_tree(temporary.string());
    fs::create_directories(temporary);
  }
  comm.barrier();

  // This rank's canonical chunks, filled from the state it holds.
  const std::vector<StateSlice> slices = strategy.state_slices();
  const std::vector<int64_t> group_numel = group_sizes(model);  // covered: check_state_coverage at setup
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < group_numel.size(); ++g) {
    const Chunk mine = canonical(group_numel[g], rank, world);
    for (int k = 0; k < 3; ++k) {
      torch::Tensor chunk = torch::zeros({mine.end - mine.begin});
      int64_t covered = 0;
      for (const StateSlice& s : slices) {
        if (s.group != g) continue;
        const torch::Tensor& source = k == 0 ? s.values : (k == 1 ? s.exp_avg : s.exp_avg_sq);
        const int64_t begin = std::max(mine.begin, s.offset), end = std::min(mine.end, s.offset + source.numel());
        if (end <= begin) continue;
        chunk.narrow(0, begin - mine.begin, end - begin).copy_(source.narrow(0, begin - s.offset, end - begin));
        covered += end - begin;
      }
      if (covered < mine.end - mine.begin) {
        throw std::logic_error(fmt::format("strategy '{}' holds {} of the {} elements of group {} that rank {} saves",
                                           strategy_name_, covered, mine.end - mine.begin, g, rank));
      }
      tensors.emplace_back(fmt::format("group{}.{}", g, kStateNames[k]), chunk);
    }
  }
  const fs::path shard = temporary / fmt::format("rank-{:05d}.safetensors", rank);
  write_safetensors(shard.string(), tensors);
  if (const char* fault = std::getenv("TRAINER_FAULT_INJECT"); fault && std::string(fault) == "checkpoint-write") {
    _exit(9);  // tests: die with a checkpoint half written
  }
  const Hash128 hash = file_xxh3(shard);
  const torch::Tensor local = torch::tensor(
      {static_cast<int64_t>(hash.high), static_cast<int64_t>(hash.low), static_cast<int64_t>(fs::file_size(shard))},
      torch::kInt64);
  torch::Tensor all = torch::zeros({3 * world}, torch::kInt64);
  const torch::Device device = slices.empty() ? torch::Device(torch::kCPU) : slices.front().values.device();
  torch::Tensor all_device = all.to(device);
  comm.all_gather(local.to(device), all_device);
  all = all_device.cpu();

  if (rank == 0) {
    Json files = Json::array(), parameters = Json::array();
    for (int r = 0; r < world; ++r) {
      const Hash128 h{static_cast<uint64_t>(all[3 * r].item<int64_t>()),
                      static_cast<uint64_t>(all[3 * r + 1].item<int64_t>())};
      files.push_back(Json{{"name", fmt::format("rank-{:05d}.safetensors", r)},
                           {"xxh3_128", h.hex()},
                           {"bytes", all[3 * r + 2].item<int64_t>()}});
    }
    for (const NamedParameter& p : model.parameters()) {
      parameters.push_back(
          Json{{"name", p.name}, {"numel", p.tensor.numel()}, {"shape", p.tensor.sizes().vec()}, {"decay", p.decay}});
    }
    Json manifest{{"format", kFormat},
                  {"step", position.step},
                  {"applied_updates", position.applied_updates},
                  {"world_size", world},
                  {"strategy", strategy_name_},
                  {"fingerprint", fingerprint_},
                  {"sampler", fmt::format("a function of (seed, step): resumes at step {}", position.step)},
                  {"rng", "none used by training"},
                  {"group_numel", group_numel},
                  {"files", files},
                  {"parameters", parameters}};
    if (!position.gradient_exponents.empty()) {
      Json exponents = Json::array();
      for (const int64_t e : position.gradient_exponents) {
        exponents.push_back(e == ExactGradients::kUnknown ? Json(nullptr) : Json(e));
      }
      manifest["gradient_exponents"] = exponents;
    }
    const std::string manifest_text = manifest.dump(1) + "\n";
    write_file_atomically(temporary / "manifest.json", manifest_text);
    write_file_atomically(temporary / "manifest.xxh3", text_xxh3(manifest_text) + "\n");
    if (const std::string config = model.hf_config(); !config.empty())
      write_file_atomically(temporary / "config.json", config);
    fsync_path(temporary);
    remove_tree(final_dir.string());
    fs::rename(temporary, final_dir);
    fsync_path(root_);
    // Keep the newest `keep` complete checkpoints.
    std::vector<fs::path> complete;
    for (const auto& entry : fs::directory_iterator(root_)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) == 0 && entry.path().extension() != ".tmp") complete.push_back(entry.path());
    }
    std::sort(complete.begin(), complete.end());
    for (size_t i = 0; i + static_cast<size_t>(keep_) < complete.size(); ++i) remove_tree(complete[i].string());
  }
  comm.barrier();
  return final_dir.string();
}

void Checkpointer::verify(const std::string& dir) {
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";
  for (const Json& f : member(manifest, "files", file)) {
    const fs::path shard = fs::path(dir) / member(f, "name", file).get<std::string>();
    if (!fs::exists(shard)) throw InputError(fmt::format("{}: missing (listed in {})", shard.string(), file.string()));
    const int64_t bytes = static_cast<int64_t>(fs::file_size(shard));
    if (bytes != member(f, "bytes", file).get<int64_t>()) {
      throw InputError(fmt::format("{}: {} bytes, the manifest says {} (truncated?)", shard.string(), bytes,
                                   member(f, "bytes", file).get<int64_t>()));
    }
    const bool old_format = member(manifest, "format", file).get<std::string>() == kFormat1;
    const char* key = old_format ? "fnv1a" : "xxh3_128";
    const std::string hash = old_format ? fmt::format("{:016x}", file_fnv1a(shard)) : file_xxh3(shard).hex();
    if (hash != member(f, key, file).get<std::string>()) {
      throw InputError(fmt::format("{}: checksum {} differs from the manifest's {} (the file is corrupt)",
                                   shard.string(), hash, member(f, key, file).get<std::string>()));
    }
  }
}

std::string Checkpointer::resolve(const std::string& resume) const {
  if (resume.empty()) return "";
  if (resume != "auto") {
    verify(resume);
    return resume;
  }
  std::vector<fs::path> candidates;
  std::error_code error;
  if (fs::is_directory(root_, error)) {
    for (const auto& entry : fs::directory_iterator(root_)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) != 0) continue;
      if (entry.path().extension() == ".tmp") {
        log::warn(fmt::format("{}: an incomplete checkpoint (a run stopped while writing it); ignored",
                              entry.path().string()));
        continue;
      }
      candidates.push_back(entry.path());
    }
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (const fs::path& candidate : candidates) {
    try {
      verify(candidate.string());
      return candidate.string();
    } catch (const InputError& bad) {
      log::warn(fmt::format("checkpoint {} is not usable ({}); trying an older one", candidate.string(), bad.what()));
    }
  }
  // Starting over would overwrite them (and the metrics they belong to).
  if (!candidates.empty()) {
    throw InputError(
        fmt::format("checkpoint.resume = 'auto': none of the {} checkpoints under {} verifies (see the "
                    "warnings above); repair or move them, or point checkpoint.dir elsewhere",
                    candidates.size(), root_));
  }
  return "";
}

std::vector<torch::Tensor> checkpoint_state(const std::string& dir, const char* name) {
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";
  const int world_size = static_cast<int>(member(manifest, "world_size", file).get<int64_t>());
  const size_t groups = member(manifest, "group_numel", file).size();
  std::vector<torch::Tensor> out;
  for (size_t g = 0; g < groups; ++g) {
    std::vector<torch::Tensor> chunks;
    for (int r = 0; r < world_size; ++r) {
      const SafetensorsReader reader((fs::path(dir) / fmt::format("rank-{:05d}.safetensors", r)).string());
      chunks.push_back(reader.read(fmt::format("group{}.{}", g, name)));
    }
    out.push_back(torch::cat(chunks));
  }
  return out;
}

void export_checkpoint(const std::string& dir, const std::string& to) {
  Checkpointer::verify(dir);
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";
  std::vector<int64_t> group_numel;
  for (const Json& n : member(manifest, "group_numel", file)) group_numel.push_back(n.get<int64_t>());
  const std::vector<torch::Tensor> groups = checkpoint_state(dir, "values");
  // Parameters sit in their group (decay first) in model order.
  std::vector<std::pair<std::string, torch::Tensor>> named;
  int64_t offset[2] = {0, 0};
  const int decay_group = 0, plain_group = group_numel.size() > 1 ? 1 : 0;
  for (const Json& p : member(manifest, "parameters", file)) {
    const bool decay = member(p, "decay", file).get<bool>();
    const int kind = decay ? 0 : 1;
    std::vector<int64_t> shape;
    for (const Json& d : member(p, "shape", file)) shape.push_back(d.get<int64_t>());
    const int64_t numel = member(p, "numel", file).get<int64_t>();
    named.emplace_back(member(p, "name", file).get<std::string>(),
                       groups.at(decay ? decay_group : plain_group).narrow(0, offset[kind], numel).view(shape));
    offset[kind] += numel;
  }
  fs::create_directories(to);
  write_safetensors((fs::path(to) / "model.safetensors").string(), named);
  if (fs::exists(fs::path(dir) / "config.json")) {
    fs::copy_file(fs::path(dir) / "config.json", fs::path(to) / "config.json", fs::copy_options::overwrite_existing);
  }
}

TrainingPosition Checkpointer::load(const std::string& dir, Strategy& strategy, Model& model, Comm& comm) {
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";
  if (member(manifest, "fingerprint", file).get<std::string>() != fingerprint_) {
    throw InputError(
        fmt::format("{}: written by a run with another model, dataset, optimizer or global batch size; "
                    "resume only what the checkpoint was made of",
                    file.string()));
  }
  const std::vector<NamedParameter> params = model.parameters();
  const Json& saved = member(manifest, "parameters", file);
  bool same = saved.size() == params.size();
  for (size_t i = 0; same && i < params.size(); ++i) {
    same =
        member(saved[i], "name", file) == params[i].name && member(saved[i], "numel", file) == params[i].tensor.numel();
  }
  if (!same) throw InputError(fmt::format("{}: the model's parameters differ from the checkpoint's", file.string()));
  const int saved_world = static_cast<int>(member(manifest, "world_size", file).get<int64_t>());
  std::vector<int64_t> group_numel;
  for (const Json& n : member(manifest, "group_numel", file)) group_numel.push_back(n.get<int64_t>());
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  for (const Json& f : member(manifest, "files", file)) {
    readers.push_back(
        std::make_unique<SafetensorsReader>((fs::path(dir) / member(f, "name", file).get<std::string>()).string()));
  }
  torch::NoGradGuard no_grad;
  for (StateSlice& s : strategy.state_slices()) {
    for (int k = 0; k < 3; ++k) {
      torch::Tensor& target = k == 0 ? s.values : (k == 1 ? s.exp_avg : s.exp_avg_sq);
      for (int r = 0; r < saved_world; ++r) {
        const Chunk chunk = canonical(group_numel.at(s.group), r, saved_world);
        const int64_t begin = std::max(chunk.begin, s.offset), end = std::min(chunk.end, s.offset + target.numel());
        if (end <= begin) continue;
        const std::string tensor = fmt::format("group{}.{}", s.group, kStateNames[k]);
        const torch::Tensor source = readers.at(r)->read(tensor);
        if (source.dim() != 1 || source.numel() != chunk.end - chunk.begin) {
          throw InputError(fmt::format("{}: tensor '{}' has {} elements, the manifest's layout needs {}",
                                       readers.at(r)->path(), tensor, source.numel(), chunk.end - chunk.begin));
        }
        target.narrow(0, begin - s.offset, end - begin).copy_(source.narrow(0, begin - chunk.begin, end - begin));
      }
    }
  }
  strategy.state_loaded();
  comm.barrier();
  TrainingPosition position;
  position.step = member(manifest, "step", file).get<int64_t>();
  position.applied_updates = member(manifest, "applied_updates", file).get<int64_t>();
  if (const auto found = manifest.find("gradient_exponents"); found != manifest.end()) {
    if (!found->is_array() || found->size() != params.size()) {
      throw InputError(
          fmt::format("{}: 'gradient_exponents' must be an array of one integer (or null) per "
                      "parameter, {} of them",
                      file.string(), params.size()));
    }
    for (const Json& e : *found) {
      // Scales beyond 2^±1100 fit no fp32 gradient: a damaged or foreign manifest.
      if (!e.is_null() && (!e.is_number_integer() || e.get<int64_t>() < -1100 || e.get<int64_t>() > 1100)) {
        throw InputError(fmt::format("{}: 'gradient_exponents' holds {}; expected an integer in [-1100, 1100] or null",
                                     file.string(), e.dump()));
      }
      position.gradient_exponents.push_back(e.is_null() ? ExactGradients::kUnknown : e.get<int64_t>());
    }
  }
  log::info(fmt::format("resumed from {} (step {}, written by {} at world size {})", dir, position.step,
                        member(manifest, "strategy", file).get<std::string>(), saved_world));
  return position;
}

}  // namespace trainer
