// Checkpoint writing, verification and loading (see Checkpoint.h).
#include "checkpoint/Checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <random>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/Manifest.h"
#include "reproducible/ExactGradients.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Safetensors.h"
#include "util/FaultInjection.h"
#include "util/Files.h"
#include "util/Hash.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace manifest;
using manifest::Range;

namespace {

// File `reader`'s tensor of `state` for `group`: the ranges of the group it
// holds, one after the other; its length is checked against them.
torch::Tensor read_group(const SafetensorsReader& reader, size_t group, const std::string& state,
                         const std::vector<Range>& ranges) {
  const int64_t length = group_length(ranges, group);
  if (length == 0) return torch::zeros({0});
  const std::string name = fmt::format("group{}.{}", group, state);
  torch::Tensor held = reader.read(name);
  if (held.dim() != 1 || held.numel() != length) {
    throw InputError(fmt::format("{}: tensor '{}' has {} elements, the manifest's ranges need {}", reader.path(), name,
                                 held.numel(), length));
  }
  return held;
}

// Throws InputError when file `f` of the manifest at `dir` is missing, of
// another size or checksum.
void verify_file(const std::string& dir, const Json& manifest, const Json& f) {
  const fs::path file = fs::path(dir) / "manifest.json";
  const fs::path shard = fs::path(dir) / member(f, "name", file).get<std::string>();
  if (!fs::exists(shard)) throw InputError(fmt::format("{}: missing (listed in {})", shard.string(), file.string()));
  const int64_t bytes = static_cast<int64_t>(fs::file_size(shard));
  if (bytes != member(f, "bytes", file).get<int64_t>()) {
    throw InputError(fmt::format("{}: {} bytes, the manifest says {} (truncated?)", shard.string(), bytes,
                                 member(f, "bytes", file).get<int64_t>()));
  }
  const bool old_format = member(manifest, "format", file).get<std::string>() == kFormat1;
  const char* key = old_format ? "fnv1a" : "xxh3_128";
  std::string hash = old_format ? fmt::format("{:016x}", file_fnv1a(shard)) : file_xxh3(shard).hex();
  // Tests: this rank sees the file other than the others do (a stale cache).
  if (const char* fault = std::getenv("TRAINER_FAULT_INJECT"); fault && std::string(fault) == "stale-view") {
    if (const char* rank = std::getenv("RANK"); rank && std::string(rank) == "1") hash = "stale";
  }
  if (hash != member(f, key, file).get<std::string>()) {
    throw InputError(fmt::format("{}: checksum {} differs from the manifest's {} (the file is corrupt)", shard.string(),
                                 hash, member(f, key, file).get<std::string>()));
  }
}

// `text` of rank `root`, on every rank: its length, then its bytes, each
// byte in an int64 (every backend moves int64; texts here are short).
std::string broadcast_text(Comm& comm, torch::Device device, const std::string& text, int root) {
  torch::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64).to(device);
  comm.broadcast(length, root);
  const int64_t n = length.cpu().item<int64_t>();
  torch::Tensor bytes = torch::zeros({std::max<int64_t>(n, 1)}, torch::kInt64);
  if (comm.rank() == root) {
    for (int64_t i = 0; i < n; ++i) bytes[i] = static_cast<int64_t>(static_cast<unsigned char>(text[i]));
  }
  bytes = bytes.to(device);
  comm.broadcast(bytes, root);
  const torch::Tensor host = bytes.cpu();
  const int64_t* data = host.data_ptr<int64_t>();
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<char>(data[i]);
  return out;
}

// The step of a checkpoint directory's name step-NNNNNNNN; nullopt for any
// other name (a .tmp, a file of the user's).
std::optional<int64_t> step_of_name(const fs::path& path) {
  const std::string name = path.filename().string();
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  return trainer::manifest::step_of_digits(std::string_view(name).substr(5));
}

// The complete-looking checkpoints under `root` (step-N directories), by step.
std::vector<std::pair<int64_t, fs::path>> checkpoints_under(const std::string& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code error;
  if (!fs::is_directory(root, error)) return out;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::optional<int64_t> step = step_of_name(entry.path());
    if (step && entry.is_directory(error)) out.emplace_back(*step, entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A fresh run (checkpoint.resume = "") into a directory of checkpoints
// would mix its checkpoints and metrics with theirs.
void refuse_earlier_checkpoints(const std::string& root, const std::vector<std::pair<int64_t, fs::path>>& present) {
  if (present.empty()) return;
  throw InputError(
      fmt::format("checkpoint.dir {} holds checkpoints of an earlier run ({} of them, the newest {}); a fresh run "
                  "would mix its checkpoints and metrics with them: resume it with checkpoint.resume = 'auto', or "
                  "move them, or choose another checkpoint.dir",
                  root, present.size(), present.back().second.string()));
}

// A fresh lineage: 128 random bits.
std::string new_lineage() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", device(), device(), device(), device());
}

// The run_id a checkpoint's manifest names; "" for one written before
// lineages; nullopt when the manifest cannot be read (never pruned then).
std::optional<std::string> lineage_of(const fs::path& dir) {
  try {
    const Json manifest = trainer::manifest::read(dir.string());
    const auto found = manifest.find("run_id");
    if (found == manifest.end()) return std::string();
    if (!found->is_string()) return std::nullopt;
    return found->get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string run_fingerprint(const std::string& recipe_fingerprint, uint64_t seed, Model& model) {
  std::string text = fmt::format("{}|seed {}|order {}|", recipe_fingerprint, seed, kFeistelSampler);
  for (const NamedParameter& p : model.parameters()) {
    text += fmt::format("{}:{}:{};", p.name, fmt::join(p.tensor.sizes().vec(), "x"), p.decay ? "decay" : "no-decay");
  }
  return fmt::format("{:016x}", fnv1a(text));
}

void Checkpointer::prune(int64_t written_step) const {
  std::vector<fs::path> mine;  // older than the one just written, oldest first
  for (const auto& [step, dir] : checkpoints_under(root_)) {
    if (step < written_step && lineage_of(dir) == lineage_) mine.push_back(dir);
  }
  // `keep` counts the one just written.
  const size_t kept_older = static_cast<size_t>(std::max<int64_t>(keep_ - 1, 0));
  for (size_t i = 0; i + kept_older < mine.size(); ++i) remove_tree(mine[i].string());
}

Checkpointer::Checkpointer(std::string root, int64_t keep, std::string fingerprint, std::string legacy_fingerprint,
                           std::string strategy_name, torch::Device device, std::vector<std::string> state_names)
    : root_(std::move(root)),
      keep_(keep),
      fingerprint_(std::move(fingerprint)),
      legacy_fingerprint_(std::move(legacy_fingerprint)),
      strategy_name_(std::move(strategy_name)),
      device_(device) {
  names_.push_back("values");
  names_.insert(names_.end(), state_names.begin(), state_names.end());
}

std::string Checkpointer::save(Strategy& strategy, Model& model, Comm& comm, const TrainingPosition& position) {
  const int rank = comm.rank(), world = comm.world_size();
  const fs::path final_dir = fs::path(root_) / fmt::format("step-{:08d}", position.step);
  const fs::path temporary = fs::path(root_) / fmt::format("step-{:08d}.tmp", position.step);
  if (rank == 0) {
    remove_tree(temporary.string());
    fs::create_directories(temporary);
  }
  comm.barrier();

  // The ranges this rank writes (each element once, from one of the ranks
  // that hold it), filled from the state it holds.
  const std::vector<StateSlice> slices = strategy.state_slices();
  const std::vector<int64_t> group_numel = group_sizes(model);  // covered: check_state_coverage at setup
  const torch::Device device = device_;                         // also where a rank holding no slice meets the others
  std::vector<Range> problems;
  const std::vector<std::vector<Range>> written =
      assign_writers(held_ranges(slices), comm, device, group_numel, &problems);
  if (!problems.empty()) {
    throw std::logic_error(fmt::format("strategy '{}': no rank holds elements [{}, {}) of group {} to save",
                                       strategy_name_, problems[0].begin, problems[0].end, problems[0].group));
  }
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  torch::NoGradGuard no_grad;
  // Views of the values, then of each state tensor (saved as fp32: a bf16
  // state widens exactly, and loads back as the same bits).
  std::vector<std::vector<FlatSlice>> held(names_.size());
  for (const StateSlice& s : slices) {
    if (s.state.size() + 1 != names_.size()) {
      throw std::logic_error(fmt::format("strategy '{}': a state slice holds {} state tensors, the optimizer names {}",
                                         strategy_name_, s.state.size(), names_.size() - 1));
    }
    held[0].push_back({s.group, s.offset, s.values});
    for (size_t k = 0; k < s.state.size(); ++k) held[k + 1].push_back({s.group, s.offset, s.state[k]});
  }
  for (size_t g = 0; g < group_numel.size(); ++g) {
    for (size_t k = 0; k < names_.size(); ++k) {
      torch::Tensor out = torch::zeros({group_length(written[rank], g)});
      int64_t at = 0;
      for (const Range& range : written[rank]) {
        if (range.group != g) continue;
        fill_range(held[k], range, out.narrow(0, at, range.size()));
        at += range.size();
      }
      tensors.emplace_back(fmt::format("group{}.{}", g, names_[k]), out);
    }
  }
  const fs::path shard = temporary / fmt::format("rank-{:05d}.safetensors", rank);
  write_safetensors(shard.string(), tensors);
  if (const char* fault = std::getenv("TRAINER_FAULT_INJECT"); fault && std::string(fault) == "checkpoint-write") {
    _exit(9);  // tests: die with a checkpoint half written
  }
  if (rank == 0) inject_slow_write("slow-checkpoint-write");
  const Hash128 hash = file_xxh3(shard);
  const torch::Tensor local = torch::tensor(
      {static_cast<int64_t>(hash.high), static_cast<int64_t>(hash.low), static_cast<int64_t>(fs::file_size(shard))},
      torch::kInt64);
  torch::Tensor all = torch::zeros({3 * world}, torch::kInt64);
  torch::Tensor all_device = all.to(device);
  comm.all_gather(local.to(device), all_device);
  all = all_device.cpu();

  if (rank == 0) {
    Json files = Json::array(), parameters = Json::array();
    for (int r = 0; r < world; ++r) {
      const Hash128 h{static_cast<uint64_t>(all[3 * r].item<int64_t>()),
                      static_cast<uint64_t>(all[3 * r + 1].item<int64_t>())};
      Json ranges = Json::array();
      for (const Range& range : written[r]) ranges.push_back(Json::array({range.group, range.begin, range.end}));
      files.push_back(Json{{"name", fmt::format("rank-{:05d}.safetensors", r)},
                           {"xxh3_128", h.hex()},
                           {"bytes", all[3 * r + 2].item<int64_t>()},
                           {"ranges", ranges}});
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
                  {"fingerprint", order_ == SampleOrder::Feistel ? fingerprint_ : legacy_fingerprint_},
                  {"sampler", order_ == SampleOrder::Feistel
                                  ? std::string(kFeistelSampler)
                                  : fmt::format("a function of (seed, step): resumes at step {}", position.step)},
                  {"run_id", lineage_},
                  {"rng", "none used by training"},
                  {"group_numel", group_numel},
                  {"state", std::vector<std::string>(names_.begin() + 1, names_.end())},
                  {"files", files},
                  {"parameters", parameters}};
    // The Hugging Face config beside the shards, checksummed like them: export
    // copies it into a model directory, so a damaged one is refused there.
    const std::string config = model.hf_config();
    if (!config.empty()) {
      manifest["config"] = Json{
          {"name", "config.json"}, {"xxh3_128", text_xxh3(config)}, {"bytes", static_cast<int64_t>(config.size())}};
    }
    // The recipe the run was at when it wrote this step, checksummed too:
    // a resume under another recipe keeps it beside the run's outputs.
    if (!recipe_.empty()) {
      manifest["recipe"] = Json{
          {"name", "recipe.toml"}, {"xxh3_128", text_xxh3(recipe_)}, {"bytes", static_cast<int64_t>(recipe_.size())}};
    }
    if (dataset_samples_ >= 0) manifest["dataset_samples"] = dataset_samples_;
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
    if (!config.empty()) write_file_atomically(temporary / "config.json", config);
    if (!recipe_.empty()) write_file_atomically(temporary / "recipe.toml", recipe_);
    fsync_path(temporary);
    remove_tree(final_dir.string());
    fs::rename(temporary, final_dir);
    fsync_path(root_);
    prune(position.step);
  }
  comm.barrier();
  return final_dir.string();
}

void Checkpointer::verify(const std::string& dir) {
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";  // named: a temporary here warns (-Wdangling-reference)
  for (const Json& f : member(manifest, "files", file)) verify_file(dir, manifest, f);
  // Checkpoints written before config.json was checksummed list none.
  if (const Json* config = json_find(manifest, "config")) verify_file(dir, manifest, *config);
  if (const Json* recipe = json_find(manifest, "recipe")) verify_file(dir, manifest, *recipe);
}

void Checkpointer::remove_incomplete() const {
  std::error_code error;
  std::vector<fs::path> incomplete;
  for (const auto& entry : fs::directory_iterator(root_, error)) {
    const fs::path& path = entry.path();
    if (path.extension() == ".tmp" && step_of_name(path.stem()) && entry.is_directory(error))
      incomplete.push_back(path);
  }
  for (const fs::path& path : incomplete) {
    remove_tree(path.string());
    log::info(fmt::format("{}: an incomplete checkpoint (a run stopped while writing it); removed", path.string()));
  }
}

bool starts_at_step_zero(const std::string& root, const std::string& resume) {
  if (resume.empty()) {
    refuse_earlier_checkpoints(root, checkpoints_under(root));
    return true;
  }
  // "auto" resumes the newest of these (a step-N.tmp is none: run removes it and starts at step 0).
  return resume == "auto" && checkpoints_under(root).empty();
}

std::optional<std::string> Checkpointer::recipe_of(const std::string& dir) {
  if (!json_find(trainer::manifest::read(dir), "recipe")) return std::nullopt;
  const fs::path path = fs::path(dir) / "recipe.toml";
  std::optional<std::string> text = read_file(path);
  if (!text) throw InputError(fmt::format("{}: cannot be read", path.string()));
  return text;
}

std::string Checkpointer::resolve(const std::string& resume, Comm& comm, int64_t* step) {
  // Rank 0's answer: "ok" or "error", then the directory or the message.
  std::string chosen, status = "ok";
  std::exception_ptr failure;
  if (comm.rank() == 0) {
    try {
      remove_incomplete();
      chosen = resolve_here(resume);
    } catch (const std::exception& error) {
      failure = std::current_exception();
      status = "error";
      chosen = error.what();
    }
  }
  if (comm.world_size() > 1) {
    status = broadcast_text(comm, device_, status, 0);
    chosen = broadcast_text(comm, device_, chosen, 0);
  }
  if (failure) std::rethrow_exception(failure);
  if (status != "ok") {
    throw InputError(fmt::format("rank 0 could not resolve checkpoint.resume = '{}': {}", resume, chosen));
  }
  *step = chosen.empty()
              ? 0
              : member(trainer::manifest::read(chosen), "step", fs::path(chosen) / "manifest.json").get<int64_t>();
  // Only rank 0 writes manifests and prunes: the lineage is its.
  if (comm.rank() == 0) {
    lineage_ = chosen.empty() ? new_lineage() : lineage_of(chosen).value_or("");
  }
  torch::Tensor steps = torch::zeros({comm.world_size()}, torch::kInt64).to(device_);
  comm.all_gather(torch::tensor({*step}, torch::kInt64).to(device_), steps);
  const torch::Tensor seen = steps.cpu();
  for (int r = 0; r < comm.world_size(); ++r) {
    if (seen[r].item<int64_t>() != seen[0].item<int64_t>()) {
      throw InputError(
          fmt::format("{}: rank {} reads step {} in its manifest, rank 0 step {}: the ranks see the "
                      "checkpoint differently (a file-system cache, or a concurrent writer)",
                      chosen, r, seen[r].item<int64_t>(), seen[0].item<int64_t>()));
    }
  }
  return chosen;
}

std::string Checkpointer::resolve_here(const std::string& resume) const {
  const std::vector<std::pair<int64_t, fs::path>> present = checkpoints_under(root_);
  if (resume.empty()) {
    refuse_earlier_checkpoints(root_, present);
    return "";
  }
  if (resume != "auto") {
    verify(resume);
    const int64_t step =
        member(trainer::manifest::read(resume), "step", fs::path(resume) / "manifest.json").get<int64_t>();
    if (!present.empty() && present.back().first > step) {
      throw InputError(fmt::format(
          "checkpoint.resume = '{}' is step {}, but checkpoint.dir {} holds the newer {}: this run's checkpoints "
          "would interleave with that history (and checkpoint.resume = 'auto' would later pick either); move "
          "the newer checkpoints, or choose another checkpoint.dir",
          resume, step, root_, present.back().second.string()));
    }
    return resume;
  }
  // The newest first, by step (a step-N.tmp is none: remove_incomplete removed it).
  for (auto it = present.rbegin(); it != present.rend(); ++it) {
    const fs::path& candidate = it->second;
    try {
      verify(candidate.string());
      return candidate.string();
    } catch (const InputError& bad) {
      log::warn(fmt::format("checkpoint {} is not usable ({}); trying an older one", candidate.string(), bad.what()));
    }
  }
  // Starting over would overwrite them (and the metrics they belong to).
  if (!present.empty()) {
    throw InputError(
        fmt::format("checkpoint.resume = 'auto': none of the {} checkpoints under {} verifies (see the "
                    "warnings above); repair or move them, or point checkpoint.dir elsewhere",
                    present.size(), root_));
  }
  return "";
}

std::vector<torch::Tensor> checkpoint_state(const std::string& dir, const std::string& name) {
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";
  const std::vector<std::vector<Range>> ranges = manifest::file_ranges(manifest, file);
  std::vector<torch::Tensor> out;
  for (const Json& n : member(manifest, "group_numel", file)) out.push_back(torch::zeros({n.get<int64_t>()}));
  for (size_t r = 0; r < ranges.size(); ++r) {
    const SafetensorsReader reader(
        (fs::path(dir) / member(member(manifest, "files", file)[r], "name", file).get<std::string>()).string());
    for (size_t g = 0; g < out.size(); ++g) {
      const torch::Tensor held = read_group(reader, g, name, ranges[r]);
      int64_t at = 0;
      for (const Range& range : ranges[r]) {
        if (range.group != g) continue;
        out[g].narrow(0, range.begin, range.size()).copy_(held.narrow(0, at, range.size()));
        at += range.size();
      }
    }
  }
  return out;
}

TrainingPosition Checkpointer::load(const std::string& dir, Strategy& strategy, Model& model, Comm& comm) {
  const Json manifest = trainer::manifest::read(dir);
  const fs::path file = fs::path(dir) / "manifest.json";
  // The parameter table first: a difference there is named exactly. The
  // decay flag decides which flat group, and so which moments, a parameter
  // has; names and sizes alone would load moments into the wrong ones.
  const std::vector<NamedParameter> params = model.parameters();
  const Json& saved = member(manifest, "parameters", file);
  if (saved.size() != params.size()) {
    throw InputError(
        fmt::format("{}: the checkpoint has {} parameters, the model {}", file.string(), saved.size(), params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const NamedParameter& p = params[i];
    const Json& s = saved[i];
    std::string differs;
    if (member(s, "name", file) != p.name) {
      differs = fmt::format("is named '{}' in the checkpoint", member(s, "name", file).dump());
    } else if (member(s, "numel", file) != p.tensor.numel()) {
      differs = fmt::format("has {} elements in the checkpoint, {} in the model", member(s, "numel", file).dump(),
                            p.tensor.numel());
    } else if (s.contains("shape") && s["shape"] != Json(p.tensor.sizes().vec())) {
      differs = fmt::format("has shape {} in the checkpoint, {} in the model", s["shape"].dump(),
                            Json(p.tensor.sizes().vec()).dump());
    } else if (s.contains("decay") && s["decay"] != Json(p.decay)) {
      differs = fmt::format("is {}weight-decayed in the checkpoint, {}weight-decayed in the model",
                            s["decay"] == Json(true) ? "" : "not ", p.decay ? "" : "not ");
    }
    if (!differs.empty()) {
      throw InputError(fmt::format("{}: the model's parameter {} '{}' {}; resume only what the checkpoint was made of",
                                   file.string(), i, p.name, differs));
    }
  }
  // Checkpoints of before "feistel-1" keep their data order and fingerprint.
  const auto sampler = manifest.find("sampler");
  order_ = sampler != manifest.end() && *sampler == kFeistelSampler ? SampleOrder::Feistel : SampleOrder::FisherYates;
  const std::string& expected = order_ == SampleOrder::Feistel ? fingerprint_ : legacy_fingerprint_;
  if (member(manifest, "fingerprint", file).get<std::string>() != expected) {
    throw InputError(
        fmt::format("{}: written by a run with another model, dataset, seed, optimizer or global batch size; "
                    "resume only what the checkpoint was made of",
                    file.string()));
  }
  // Checkpoints written before the dataset's size was recorded hold none.
  if (const Json* samples = json_find(manifest, "dataset_samples"); samples && dataset_samples_ >= 0) {
    if (!json_is_int64(*samples) || samples->get<int64_t>() < 0) {
      throw InputError(fmt::format("{}: 'dataset_samples' must be an integer >= 0", file.string()));
    }
    if (samples->get<int64_t>() != dataset_samples_) {
      throw InputError(fmt::format(
          "{}: written by a run whose dataset gave {} samples; this run's gives {}: the data changed since "
          "(another file at the same path, or the same one grown or re-tokenized), and the data order would "
          "differ from the checkpoint's; resume with the data the checkpoint was made of",
          file.string(), samples->get<int64_t>(), dataset_samples_));
    }
  }
  const int saved_world = static_cast<int>(member(manifest, "world_size", file).get<int64_t>());
  const std::vector<std::vector<Range>> ranges = manifest::file_ranges(manifest, file);
  // Only the files that hold part of this rank's state are opened, each
  // checked against the manifest first (rank 0 verified every file, but
  // this rank may see them otherwise).
  const Json& files = member(manifest, "files", file);
  std::vector<std::unique_ptr<SafetensorsReader>> readers(ranges.size());
  auto reader = [&](size_t r) -> const SafetensorsReader& {
    if (!readers[r]) {
      try {
        verify_file(dir, manifest, files[r]);
      } catch (const InputError& error) {
        throw InputError(fmt::format("rank {}: {} (rank 0 verified this checkpoint: the ranks see it differently)",
                                     comm.rank(), error.what()));
      }
      readers[r] = std::make_unique<SafetensorsReader>(
          (fs::path(dir) / member(files[r], "name", file).get<std::string>()).string());
    }
    return *readers[r];
  };
  torch::NoGradGuard no_grad;
  // A checkpoint of before "state" (format 3) holds AdamW's moments.
  const auto saved_state = manifest.find("state");
  std::vector<std::string> saved_names = {"exp_avg", "exp_avg_sq"};
  if (saved_state != manifest.end()) {
    saved_names.clear();
    const bool strings = saved_state->is_array() && std::all_of(saved_state->begin(), saved_state->end(),
                                                                [](const Json& n) { return n.is_string(); });
    if (!strings) throw InputError(fmt::format("{}: 'state' must be an array of state names", file.string()));
    for (const Json& n : *saved_state) saved_names.push_back(n.get<std::string>());
  }
  if (saved_names != std::vector<std::string>(names_.begin() + 1, names_.end())) {
    throw InputError(
        fmt::format("{}: holds optimizer state [{}], this run's optimizer keeps [{}]; resume with the "
                    "optimizer that wrote it",
                    file.string(), fmt::join(saved_names, ", "), fmt::join(names_.begin() + 1, names_.end(), ", ")));
  }
  for (StateSlice& s : strategy.state_slices()) {
    for (size_t k = 0; k < names_.size(); ++k) {
      torch::Tensor& target = k == 0 ? s.values : s.state.at(k - 1);
      for (size_t r = 0; r < ranges.size(); ++r) {
        torch::Tensor held;  // read once the file turns out to hold some of the slice
        int64_t at = 0;
        for (const Range& range : ranges[r]) {
          int64_t begin = 0, end = 0;
          if (overlap(s, target.numel(), range, &begin, &end)) {
            if (!held.defined()) held = read_group(reader(r), s.group, names_[k], ranges[r]);
            target.narrow(0, begin - s.offset, end - begin)
                .copy_(held.narrow(0, at + begin - range.begin, end - begin));
          }
          if (range.group == s.group) at += range.size();
        }
      }
    }
  }
  strategy.state_loaded();
  comm.barrier();
  TrainingPosition position;
  position.step = member(manifest, "step", file).get<int64_t>();
  position.applied_updates = member(manifest, "applied_updates", file).get<int64_t>();
  position.order = order_;
  if (order_ == SampleOrder::FisherYates) {
    log::info(fmt::format("{} was written before data order '{}': the run keeps its Fisher-Yates order", dir,
                          kFeistelSampler));
  }
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
