// The conformance kit's driver: the splits, one split's worker (the checks
// of Checks.h in order, its row written), and `trainer check-plugin`, which
// spawns each split's workers and prints the table. Why the fixture makes
// the checks sharp: micro-batches of every split differ by at least 20x in
// target tokens (Reference.h), so averaging per micro-batch, dropping
// micro-batches or dividing twice all move the gradient far beyond rounding.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distributed/Rendezvous.h"
#include "kit/Checks.h"
#include "kit/Conformance.h"
#include "kit/Reference.h"
#include "recipe/Recipe.h"
#include "tools/Metrics.h"
#include "trainer/Errors.h"
#include "trainer/sharding/ShardGroups.h"
#include "trainer/util/JsonSupport.h"
#include "util/FaultInjection.h"
#include "util/FileLock.h"
#include "util/Files.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace kit;

std::string Split::text() const {
  return shard_group > 0 ? fmt::format("{}x{}x{}g{}", micro, accum, world, shard_group)
                         : fmt::format("{}x{}x{}", micro, accum, world);
}

std::string Split::argument() const {
  return shard_group > 0 ? fmt::format("{},{},{},{}", micro, accum, world, shard_group)
                         : fmt::format("{},{},{}", micro, accum, world);
}

std::string Split::options() const {
  return shard_group > 0 ? fmt::format("shard_group_size = {}\n", shard_group) : "";
}

Split parse_split(const std::string& text) {
  Split s;
  char extra = 0;
  const int fields = std::sscanf(text.c_str(), "%ld,%ld,%d,%d%c", &s.micro, &s.accum, &s.world, &s.shard_group, &extra);
  if ((fields != 3 && fields != 4) || s.micro < 1 || s.accum < 1 || s.world < 1 ||
      s.micro * s.accum * s.world != kGlobalBatch || (fields == 4 && (s.shard_group < 1 || s.world % s.shard_group))) {
    throw InputError(fmt::format(
        "--split {}: expected micro,accum,world with micro x accum x world = {}, or micro,accum,world,shard_group_size "
        "with a shard group size that divides the world size",
        text, kGlobalBatch));
  }
  return s;
}

std::vector<Split> default_splits(const LoadedPlugin& strategy) {
  std::vector<Split> splits = {{8, 1, 1}, {2, 4, 1}, {1, 8, 1}, {4, 1, 2}, {2, 2, 2}, {1, 2, 4}};
  for (size_t k = 0; k < strategy.descriptor->num_keys; ++k) {
    if (std::string(strategy.descriptor->keys[k].name) == kShardGroupSizeKey.name) {
      splits.push_back({1, 2, 4, 2});
      splits.push_back({2, 2, 2, 1});
    }
  }
  return splits;
}

void run_conformance_worker(PluginRegistry& registry, const ConformanceRequest& request, const Split& split,
                            const WorldInfo& world, const std::string& rank_report) {
  const torch::Device device = bind_rank_device(request.device == "cuda", world);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(request.timeout_s * 1000));
  std::unique_ptr<Comm> comm = connect_world(registry, request.backend, world, timeout, device,
                                             request.strategy + "/" + split.text(), request.backend_at_one_rank);
  Context context;
  context.rank = world.rank;
  context.world_size = world.world_size;
  const std::unique_ptr<Optimizer> optimizer =
      make_optimizer(registry, request.optimizer, context, request.optimizer_settings);
  const KitRun run{registry,
                   registry.find(PluginKind::Strategy, request.strategy),
                   *comm,
                   device,
                   split,
                   world,
                   context,
                   *optimizer,
                   request.optimizer,
                   request.optimizer_settings};

  ConformanceRow row;
  row.split = split.text();
  row.rank = world.rank;
  row.param_tolerance = optimizer->state_dtype() == torch::kFloat32 ? kParamTolerance : kBf16StateParamTolerance;
  Reference reference(registry, *optimizer, device);
  const Fixture first = fixture(0);
  const double reference_norm = reference.gradient(first);
  check_gradient(run, reference, first, reference_norm, row);
  check_reproducible(run, reference, first, row);
  {
    // Parameters after 5 AdamW steps with clipping at a tenth of the raw norm.
    const double max_norm = 0.1 * reference_norm;
    const Trained trained = train_against_reference(run, max_norm);
    check_parameters(trained, row);
    check_identical_to_ddp(run, trained, max_norm, row);
    check_final_weights(run, trained, row);
    check_checkpoints(run, trained, (fs::path(rank_report).parent_path() / "checkpoints").string(),
                      request.load_checkpoint, row);
  }
  row.bf16_error = row.bf16_bound = -1;
  if (request.bf16 && world.world_size == 1) check_bf16_accumulation(run, row);

  const Json report{{"rank", row.rank},
                    {"grad_error", row.grad_error},
                    {"norm_error", row.norm_error},
                    {"param_error", row.param_error},
                    {"param_tolerance", row.param_tolerance},
                    {"masked", row.masked},
                    {"identical_to_ddp", row.identical_to_ddp},
                    {"bf16_error", row.bf16_error},
                    {"bf16_bound", row.bf16_bound},
                    {"checkpoint_saved", row.checkpoint_saved},
                    {"checkpoint_loaded", row.checkpoint_loaded},
                    {"final_weights_error", row.final_weights_error},
                    {"unchanged_parameters", row.unchanged_parameters},
                    {"wrong_parameters", row.wrong_parameters},
                    {"resumed_identical", row.resumed_identical},
                    {"reproducible_error", row.reproducible_error},
                    {"reproducible_hash", row.reproducible_hash}};
  if (fault_injected("kit-no-report")) return;               // tests: a worker that ends without its result
  write_file_atomically(rank_report, report.dump() + "\n");  // a failed write is a fault naming the file
}

namespace {

// --report names a file to write, checked before any work (exit 2 naming
// it): a directory, the plugin file under test or a missing directory would
// otherwise lose every row without a word, or replace the plugin. The rows
// are kept until the check ends and then written whole over the file: a
// check stopped part-way (Ctrl-C, a crash) leaves an earlier report as it
// was, and no partial one.
struct Report {
  std::string path;  // empty: none asked for
  std::string rows;
  bool wanted() const { return !path.empty(); }
  void add(const Json& row) { rows += row.dump() + "\n"; }
};

Report open_report(const std::string& path, const std::string& plugin_file) {
  if (path.empty()) return {};
  check_destination("--report", path, path, {{"plugin under test", plugin_file}}, "the report would replace it");
  try {  // the directory takes a new file: found now, not after the work
    const FileBeside probe = create_file_beside(path);
    close(probe.fd);
    std::error_code ignored;
    fs::remove(probe.path, ignored);
  } catch (const InputError& error) {
    throw InputError(fmt::format("--report {}: cannot be written ({})", path, error.what()));
  }
  return {path, ""};
}

// The rows reach the file whole (a full disk is a fault naming it, the
// earlier report as it was).
void close_report(const Report& report) {
  if (!report.wanted()) return;
  try {
    write_file_atomically(report.path, report.rows);
  } catch (const std::exception& error) {
    throw TrainingError(fmt::format("--report {}: {}", report.path, error.what()));
  }
}

}  // namespace

// A directory of the kit's own under the temporary directory: a new one
// (PREFIX-PID-XXXXXX), held by a lock file inside while the check runs and
// removed on every way out but a signal (a split that throws, a plugin not
// found, included). What a check killed by a signal left goes with the next
// check's start: directories of the kit's names whose lock file it can take
// with its holder's record in it (a lock goes with the process that held
// it). One without a lock file, or with an empty one, is left alone for an
// hour (its maker may be between making it and locking it; an older
// build's directories have none).
struct ScratchDir {
  static constexpr const char* kLockFile = ".check.lock";

  explicit ScratchDir(const std::string& prefix) : path(make(prefix)), lock(take(path)) {}
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() { remove_tree(path.string()); }  // the lock file with it, while held; the lock goes after

  // Best effort: a directory another check removes at the same moment, or
  // one that cannot be read, is passed over.
  static void remove_abandoned(const fs::path& tmp, const std::string& prefix) try {
    std::error_code error;
    for (const fs::directory_entry& entry : fs::directory_iterator(tmp, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix + "-", 0) != 0 || !kit_name(name.substr(prefix.size() + 1))) continue;
      std::error_code ignored;
      if (!entry.is_directory(ignored) || entry.is_symlink(ignored)) continue;
      const fs::path lock_file = entry.path() / kLockFile;
      try {
        if (!fs::exists(lock_file, ignored) || fs::file_size(lock_file, ignored) == 0) {
          const auto age = fs::file_time_type::clock::now() - fs::last_write_time(entry.path());
          if (age > std::chrono::hours(1)) remove_tree(entry.path().string());
          continue;
        }
        // Taken with its holder's record in it: that holder is gone. Taken
        // empty: its maker may have opened it and not yet locked it.
        std::string holder;
        const std::optional<FileLock> left = FileLock::take(lock_file, false, &holder);
        if (left && !left->left_record().empty()) remove_tree(entry.path().string());
      } catch (const std::exception&) {  // removed meanwhile, or not ours to open
      }
    }
  } catch (const std::exception&) {  // the listing itself failed part-way
  }
  // PID-XXXXXX (this build's names) or PID (an older build's).
  static bool kit_name(const std::string& rest) {
    const size_t dash = rest.find('-');
    const std::string pid = rest.substr(0, dash);
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
    return dash == std::string::npos || rest.size() - dash - 1 == 6;
  }

  static fs::path make(const std::string& prefix) {
    const fs::path tmp = fs::temp_directory_path();
    remove_abandoned(tmp, prefix);
    std::string name = (tmp / fmt::format("{}-{}-XXXXXX", prefix, getpid())).string();
    if (mkdtemp(name.data()) == nullptr) {
      throw TrainingError(
          fmt::format("{}: cannot make the check's scratch directory ({})", name, std::strerror(errno)));
    }
    return name;
  }
  // The lock of a directory made just now; where it cannot be taken the
  // directory goes (the constructor did not finish: no destructor removes it).
  static FileLock take(const fs::path& dir) {
    try {
      std::string holder;
      std::optional<FileLock> taken = FileLock::take(dir / kLockFile, /*remove_when_released=*/false, &holder);
      if (!taken) throw TrainingError(fmt::format("{}: its new lock file is held ({})", dir.string(), holder));
      return std::move(*taken);
    } catch (...) {
      remove_tree(dir.string());
      throw;
    }
  }

  const fs::path path;
  const FileLock lock;
};

int check_optimizer(PluginRegistry& registry, const ConformanceRequest& request,
                    const std::vector<std::string>& strategies, const std::string& executable) {
  // Every plugin named before the report is opened: bad input leaves an earlier report as it was.
  for (const std::string& strategy : strategies) registry.find(PluginKind::Strategy, strategy);
  Report report = open_report(request.report, registry.find(PluginKind::Optimizer, request.optimizer).file);
  std::vector<std::string> failed;
  // Each strategy's first split loads the checkpoint the previous
  // strategy's last split wrote: the optimizer's state across strategies.
  const ScratchDir kit("trainer-optimizer-kit");
  const fs::path& carried = kit.path;
  std::string previous;
  int rows_file = 0;
  for (const std::string& strategy : strategies) {
    ConformanceRequest one = request;
    one.strategy = strategy;
    one.load_checkpoint = previous;
    one.keep_last_checkpoint = (carried / strategy / "checkpoints" / fmt::format("step-{:08d}", kSteps)).string();
    const std::vector<Split> defaults = default_splits(registry.find(PluginKind::Strategy, strategy));
    if (one.splits.empty()) {
      one.splits = defaults;
    } else {  // hybrid splits only for a strategy that has them (declares shard_group_size)
      const bool hybrid =
          std::any_of(defaults.begin(), defaults.end(), [](const Split& s) { return s.shard_group > 0; });
      one.splits.erase(std::remove_if(one.splits.begin(), one.splits.end(),
                                      [&](const Split& s) { return s.shard_group > 0 && !hybrid; }),
                       one.splits.end());
    }
    if (!request.report.empty()) {  // this strategy's rows, in the kit's own directory until merged below
      one.report = (carried / fmt::format("report-{}.jsonl", rows_file++)).string();
    }
    if (check_plugin(registry, one, executable) != 0) failed.push_back(strategy);
    previous = fs::exists(one.keep_last_checkpoint) ? one.keep_last_checkpoint : "";
    if (!request.report.empty()) {  // one report: each row names its strategy
      std::ifstream rows(one.report);
      for (std::string line; std::getline(rows, line);) {
        Json row = Json::parse(line);
        row["strategy"] = strategy;
        report.add(row);
      }
      rows.close();
      fs::remove(one.report);
    }
  }
  close_report(report);
  fmt::print("optimizer '{}': {}\n", request.optimizer,
             failed.empty() ? fmt::format("passes under {}", fmt::join(strategies, ", "))
                            : fmt::format("FAILED under {}", fmt::join(failed, ", ")));
  return failed.empty() ? 0 : 1;
}

int check_plugin(PluginRegistry& registry, const ConformanceRequest& request, const std::string& executable) {
  const LoadedPlugin& plugin = registry.find(PluginKind::Strategy, request.strategy);
  registry.find(PluginKind::Optimizer, request.optimizer);  // named before the table begins
  const ScratchDir kit("trainer-conformance");
  const fs::path& scratch = kit.path;
  Report report = open_report(request.report, plugin.file);
  fmt::print(
      "conformance of strategy '{}' ({}) with optimizer '{}'\n{:<8} {:>4} {:>12} {:>12} {:>12} {:>8} {:>8}  "
      "result\n",
      plugin.descriptor->name, plugin.file, request.optimizer, "split", "rank", "grad err", "norm err", "param err",
      "masked", "=ddp");
  bool all_pass = true;
  double reproducible_hash = -1;  // every split and rank must report the first one's
  // Each split loads the one the split before it wrote; the first, the one
  // the caller names (the previous strategy's, under check_optimizer).
  std::string previous_checkpoint = request.load_checkpoint;
  for (const Split& split : request.splits) {
    const fs::path dir = scratch / split.text();
    fs::create_directories(dir);
    ConformanceRequest this_split = request;
    this_split.load_checkpoint = previous_checkpoint;
    const fs::path checkpoint = dir / "checkpoints" / fmt::format("step-{:08d}", kSteps);
    if (split.world == 1) {
      run_conformance_worker(registry, this_split, split, WorldInfo{}, (dir / "rank0.jsonl").string());
    } else {
      // Workers find plugins where this process found them (a third party's
      // strategy is often known only through --plugin-dir).
      std::vector<std::string> args = {executable};
      for (const std::string& plugin_dir : request.plugin_dirs) args.insert(args.end(), {"--plugin-dir", plugin_dir});
      args.insert(args.end(), {"check-plugin", request.strategy, "--optimizer", request.optimizer, "--split",
                               split.argument(), "--device", request.device, "--backend", request.backend, "--timeout",
                               fmt::format("{}", request.timeout_s), "--rank-report", dir.string()});
      if (!previous_checkpoint.empty()) args.insert(args.end(), {"--load-checkpoint", previous_checkpoint});
      for (const std::string& line : request.optimizer_settings) args.insert(args.end(), {"--optimizer-set", line});
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int code = launch_local_workers(static_cast<int>(args.size()), argv.data(), split.world, request.timeout_s);
      if (code != 0) {
        fmt::print("{:<8} workers failed (exit code {})  FAIL\n", split.text(), code);
        all_pass = false;
        previous_checkpoint.clear();
        continue;
      }
    }
    const std::string loaded_from = previous_checkpoint;
    previous_checkpoint = fs::exists(checkpoint) ? checkpoint.string() : "";
    for (int rank = 0; rank < split.world; ++rank) {
      const fs::path rank_file = dir / fmt::format("rank{}.jsonl", rank);
      const std::vector<MetricsRow> rows =
          fs::exists(rank_file) ? read_metrics(rank_file.string()) : std::vector<MetricsRow>{};
      if (rows.empty()) {  // the worker's own file: a fault of the kit, not the user's input
        throw TrainingError(
            fmt::format("{}: rank {} of split {} ended without its result", rank_file.string(), rank, split.text()));
      }
      const MetricsRow& r = rows.front();
      const bool pass = r.at("grad_error") <= kGradTolerance && r.at("norm_error") <= kGradTolerance &&
                        r.at("param_error") <= r.at("param_tolerance") && r.at("identical_to_ddp") != 0 &&
                        r.at("bf16_error") <= r.at("bf16_bound") && r.at("checkpoint_saved") == 1 &&
                        r.at("checkpoint_loaded") != 0 && r.at("final_weights_error") <= r.at("param_tolerance") &&
                        r.at("unchanged_parameters") <= 0 && r.at("wrong_parameters") <= 0 &&
                        r.at("resumed_identical") == 1;
      if (reproducible_hash < 0) reproducible_hash = r.at("reproducible_hash");
      const bool reproducible = r.at("reproducible_error") >= 0 && r.at("reproducible_error") <= kGradTolerance &&
                                r.at("reproducible_hash") == reproducible_hash;
      all_pass = all_pass && pass && reproducible;
      const double identical = r.at("identical_to_ddp");
      fmt::print("{:<8} {:>4} {:>12.3e} {:>12.3e} {:>12.3e} {:>7.3f}% {:>8}  {}\n", split.text(), rank,
                 r.at("grad_error"), r.at("norm_error"), r.at("param_error"), 100 * r.at("masked"),
                 identical < 0 ? "-" : (identical > 0 ? "bits" : "DIFFER"), pass ? "pass" : "FAIL");
      if (r.at("bf16_bound") >= 0) {
        fmt::print("{:<8} {:>4} bf16 x16 accumulation error {:.3e}, fp32-accumulation bound {:.3e}  {}\n", split.text(),
                   rank, r.at("bf16_error"), r.at("bf16_bound"),
                   r.at("bf16_error") <= r.at("bf16_bound") ? "pass" : "FAIL");
      }
      if (rank == 0 || r.at("checkpoint_saved") != 1 || r.at("checkpoint_loaded") == 0 ||
          r.at("resumed_identical") != 1) {
        const double loaded = r.at("checkpoint_loaded");
        const std::string parameters =
            rank != 0 ? std::string()
                      : fmt::format(" ({} parameters did not move, {} moved otherwise than the reference)",
                                    r.at("unchanged_parameters"), r.at("wrong_parameters"));
        fmt::print(
            "{:<8} {:>4} final weights err {:.3e}{}; checkpoint saved {}, {}; resumed step {}  {}\n", split.text(),
            rank, r.at("final_weights_error"), parameters, r.at("checkpoint_saved") == 1 ? "bit for bit" : "WRONG",
            loaded < 0
                ? std::string("nothing to load")
                : fmt::format("{} loaded {}", fs::path(loaded_from).parent_path().parent_path().filename().string(),
                              loaded > 0 ? "bit for bit" : "WRONG"),
            r.at("resumed_identical") == 1 ? "bit for bit" : "DIFFERS", pass ? "pass" : "FAIL");
      }
      if (rank == 0 || !reproducible) {
        const double hash = r.at("reproducible_hash");
        fmt::print(
            "{:<8} {:>4} reproducible: grad err {:.3e}, gradient {} ({} the first split's)  {}\n", split.text(), rank,
            r.at("reproducible_error"),
            hash < 0 ? std::string("none: the mode stopped") : fmt::format("{:013x}", static_cast<uint64_t>(hash)),
            hash == reproducible_hash ? "bits of" : "DIFFERS from", reproducible ? "pass" : "FAIL");
      }
      if (report.wanted()) {
        const Json line{{"split", split.text()},
                        {"micro", split.micro},
                        {"accum", split.accum},
                        {"world", split.world},
                        {"rank", rank},
                        {"grad_error", r.at("grad_error")},
                        {"norm_error", r.at("norm_error")},
                        {"param_error", r.at("param_error")},
                        {"param_tolerance", r.at("param_tolerance")},
                        {"masked", r.at("masked")},
                        {"identical_to_ddp", r.at("identical_to_ddp")},
                        {"bf16_error", r.at("bf16_error")},
                        {"bf16_bound", r.at("bf16_bound")},
                        {"checkpoint_saved", r.at("checkpoint_saved")},
                        {"checkpoint_loaded", r.at("checkpoint_loaded")},
                        {"final_weights_error", r.at("final_weights_error")},
                        {"unchanged_parameters", r.at("unchanged_parameters")},
                        {"wrong_parameters", r.at("wrong_parameters")},
                        {"resumed_identical", r.at("resumed_identical")},
                        {"reproducible_error", r.at("reproducible_error")},
                        {"reproducible_identical", r.at("reproducible_hash") == reproducible_hash ? 1 : 0},
                        {"pass", pass && reproducible}};
        report.add(line);
      }
    }
  }
  if (!request.keep_last_checkpoint.empty()) {
    remove_tree(request.keep_last_checkpoint);
    if (!previous_checkpoint.empty()) {
      fs::create_directories(fs::path(request.keep_last_checkpoint).parent_path());
      fs::copy(previous_checkpoint, request.keep_last_checkpoint, fs::copy_options::recursive);
    }
  }
  close_report(report);
  fmt::print("tolerances: gradient and norm {:.0e}, parameter change {:.0e} ({:.0e} with bf16 optimizer state); {}\n",
             kGradTolerance, kParamTolerance, kBf16StateParamTolerance, all_pass ? "all pass" : "FAILED");
  return all_pass ? 0 : 1;
}

}  // namespace trainer
