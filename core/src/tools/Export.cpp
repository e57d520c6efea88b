// `trainer export`: a run's final weights, or a checkpoint consolidated
// from its shards, as a Hugging Face model directory.
#include "tools/Export.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "checkpoint/Checkpoint.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Safetensors.h"
#include "util/FaultInjection.h"
#include "util/FileLock.h"
#include "util/Files.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace manifest;

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
  write_safetensors((fs::path(to) / "model.safetensors").string(), named);
  if (fs::exists(fs::path(dir) / "config.json")) {
    copy_file_atomically(fs::path(dir) / "config.json", fs::path(to) / "config.json");
  }
}

namespace {

// The files an export writes into --to.
constexpr const char* kExported[] = {"model.safetensors", "config.json"};
// Its lock's record while it writes them.
constexpr const char kWriting[] = ", writing model.safetensors and config.json";

void export_into(const std::string& run_dir, const std::string& to) {
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
  std::error_code error;
  const bool has_config = fs::exists(fs::symlink_status(config, error));
  if (has_config && !fs::is_regular_file(config, error)) {
    throw InputError(fmt::format("{}: not a regular file; expected the model's config.json", config.string()));
  }
  // Each file whole or absent (the weights first: a copy stopped part-way leaves only a file of its own).
  copy_file_atomically(weights, fs::path(to) / "model.safetensors");
  if (fault_injected("export-killed")) raise(SIGKILL);  // tests: stopped between the two files
  if (fault_injected("export-config")) {                // tests: the second file fails, as on a full disk
    throw TrainingError(fmt::format("{}: write failed (injected)", (fs::path(to) / "config.json").string()));
  }
  if (has_config) copy_file_atomically(config, fs::path(to) / "config.json");
  fmt::print("exported {} tensors to {}\n", check.names().size(), to);
}

}  // namespace

void export_run(const std::string& run_dir, const std::string& to) {
  // Export never replaces weights already written: not the source's own, not another export's.
  if (fs::weakly_canonical(to) == fs::weakly_canonical(run_dir)) {
    throw InputError(fmt::format("trainer export: --to {} is the directory exported from; choose another", to));
  }
  if (!fs::exists(run_dir)) throw InputError(fmt::format("trainer export: {} does not exist", run_dir));
  // The destination is made (or found) a writable directory before anything is read or written.
  std::error_code error;
  MadeDirectories made;  // removed again (after the lock goes) unless the export succeeds
  made.create(to, error);
  if (error || !fs::is_directory(to) || access(to.c_str(), W_OK) != 0) {
    throw InputError(fmt::format("trainer export: --to {}: expected a directory to write into ({})", to,
                                 error                  ? error.message()
                                 : fs::is_directory(to) ? "not writable"
                                                        : "not a directory"));
  }
  // One export at a time into --to (the hidden lock file goes with the lock): what one checks
  // absent, another would not write meanwhile, and the files a killed export left are its own.
  std::string holder;
  std::optional<FileLock> lock = FileLock::take(fs::path(to) / ".export.lock", true, &holder);
  if (!lock) {
    throw InputError(
        fmt::format("trainer export: --to {} is being written by another trainer export ({}); wait for "
                    "it to end or choose another directory",
                    to, holder));
  }
  for (const char* name : kExported) remove_files_left_beside(fs::path(to) / name, "an export");
  // Export never replaces another model's files (a directory holding pytorch_model.bin and its config),
  // but those an export killed between its files left are its own: its record says it was writing
  // them, having found neither there.
  const bool killed_writing = lock->left_record().find(kWriting) != std::string::npos;
  for (const char* name : kExported) {
    const fs::path file = fs::path(to) / name;
    if (!fs::exists(fs::symlink_status(file, error))) continue;
    if (!killed_writing) {
      throw InputError(fmt::format("trainer export: {} already holds a {}; choose an empty directory", to, name));
    }
    fs::remove(file, error);
    log::warn(
        fmt::format("{}: left by an export stopped before it ended ({}); removed", file.string(), lock->left_record()));
  }
  lock->record(kWriting);  // from here until both files are in place, the files are this export's
  try {
    export_into(run_dir, to);
  } catch (...) {
    // All or nothing: the files found absent above that are there now are this export's.
    for (const char* name : kExported) fs::remove(fs::path(to) / name, error);
    throw;
  }
  lock->record("");
  made.keep();
}

}  // namespace trainer
