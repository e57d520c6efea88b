// The typed run configuration (see RunConfig.h).
#include "run/RunConfig.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/Manifest.h"
#include "ops/Dispatch.h"
#include "run/DeviceStats.h"
#include "run/ForwardBackward.h"
#include "trainer/Log.h"
#include "util/Files.h"

namespace trainer {

namespace fs = std::filesystem;

std::chrono::milliseconds CommSettings::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
}

std::string output_dir_of(const Recipe& recipe) {
  const std::string& dir = recipe.run.text("output_dir");
  return dir.empty() ? (fs::path("runs") / recipe.run.text("name")).string() : dir;
}

CommSettings comm_settings(const Recipe& recipe) {
  CommSettings comm;
  comm.backend = recipe.distributed.text("backend");
  comm.nproc = static_cast<int>(recipe.distributed.integer("nproc"));
  comm.timeout_s = recipe.distributed.real("timeout_s");
  return comm;
}

namespace {

// The text of a recipe.toml a run wrote (its first line
// Recipe::kResolvedHeader); nullopt for any other file, or none.
std::optional<std::string> resolved_recipe_at(const fs::path& path) {
  std::optional<std::string> text = read_file(path);
  if (text && text->rfind(std::string(Recipe::kResolvedHeader) + "\n", 0) != 0) return std::nullopt;
  return text;
}

// The files a run writes into its output directory can be written (none is
// a directory) and replace none it reads:
// the output directory is not a directory a key reads from (model.hf_dir's
// config.json and model.safetensors, a checkpoint's config.json), and none
// of the run's files is an input (init_from = "runs/a/model.safetensors"
// with run.output_dir = "runs/a"; a hand-written recipe.toml in the output
// directory). A recipe.toml a run wrote may be run again in place
// (`trainer run runs/a/recipe.toml --set checkpoint.resume=auto`).
void check_outputs_spare_inputs(const Recipe& recipe, const std::string& output_dir) {
  std::error_code error;
  for (const auto& [what, dir] : recipe.input_directories()) {
    if (fs::equivalent(output_dir, dir, error)) {
      recipe.run.fail("output_dir",
                      fmt::format("a directory for the run's outputs, not one it reads; {} is the directory {} "
                                  "names, whose files the run's config.json, model.safetensors and recipe.toml "
                                  "would replace",
                                  output_dir, what));
    }
  }
  const std::vector<std::pair<std::string, std::string>> inputs = recipe.input_files();
  for (const RunFile& file : kRunFiles) {
    const std::string name = file.name;
    const fs::path output = fs::path(output_dir) / name;
    // Found at the end, a directory in the way would cost the run its weights.
    if (fs::is_directory(output, error)) {
      recipe.run.fail("output_dir", fmt::format("a directory where the run can write its {}; {} is a directory", name,
                                                output.string()));
    }
    for (const auto& [what, input] : inputs) {
      if (!fs::equivalent(output, input, error)) continue;
      if (what == "the recipe" && resolved_recipe_at(input)) continue;
      const std::string spelled = input == output.string() ? "" : fmt::format(" ({})", input);
      recipe.run.fail("output_dir",
                      fmt::format("a directory where the run's files replace none it reads; {} is {}{}, which "
                                  "the run's own {} would replace",
                                  output.string(), what, spelled, name));
    }
  }
}

}  // namespace

std::vector<OutputClaim> own_outputs(const fs::path& output_dir) {
  std::vector<OutputClaim> own{{output_dir / ".trainer.lock", "the run's lock"},
                               {output_dir / "profile", "the profiler's directory", true}};
  for (const RunFile& file : kRunFiles) own.push_back({output_dir / file.name, file.what});
  return own;
}

void check_earlier_results(const Recipe& recipe, const std::string& output_dir) {
  if (recipe.run.boolean("overwrite")) return;
  std::vector<std::string> results;
  std::error_code error;
  for (const char* name : {"model.safetensors", "summary.json"}) {
    if (fs::exists(fs::path(output_dir) / name, error)) results.emplace_back(name);
  }
  if (results.empty()) return;
  const fs::path earlier = fs::path(output_dir) / "recipe.toml";
  std::string why;
  if (!fs::is_regular_file(earlier, error)) {
    why = fmt::format("of a run whose recipe is not there ({} is missing)", earlier.string());
  } else if (const std::optional<std::string> text = resolved_recipe_at(earlier); !text) {
    why = fmt::format("of a run whose recipe is unknown ({} was not written by a run)", earlier.string());
  } else {
    const std::string difference = recipe.result_difference(*text);
    if (difference.empty()) return;  // the same recipe again: its results are replaced by equal ones
    why = fmt::format("of a run with another recipe ({}: {})", earlier.string(), difference);
  }
  recipe.run.fail("output_dir",
                  fmt::format("a directory without another run's results; {} holds the {} {}, which this run "
                              "would replace: choose another run.name or run.output_dir, resume that run "
                              "(checkpoint.resume = 'auto') if it left checkpoints, or set run.overwrite = true",
                              output_dir, fmt::join(results, " and "), why));
}

void keep_recipe_history(const Recipe& recipe, const std::string& output_dir, const std::optional<std::string>& earlier,
                         int64_t step) {
  std::error_code error;
  std::vector<fs::path> later;
  for (const fs::directory_entry& entry : fs::directory_iterator(output_dir, error)) {
    const std::optional<int64_t> kept = manifest::kept_recipe_step(entry.path().filename().string());
    if (!kept || *kept <= step) continue;
    later.push_back(entry.path());
  }
  for (const fs::path& path : later) {
    if (fs::remove(path, error)) {
      log::info(fmt::format("removed {}: the run resumes from step {}, before it", path.string(), step));
    }
  }
  if (!earlier || step == 0) return;
  const std::string difference = recipe.result_difference(*earlier);
  if (difference.empty()) return;
  const fs::path kept = fs::path(output_dir) / manifest::kept_recipe_name(step);
  write_file_atomically(kept, *earlier);
  log::info(fmt::format("the resumed checkpoint was trained with another recipe ({}): kept as {}", difference,
                        kept.string()));
}

RunConfig run_config(const Recipe& recipe, int world_size) {
  RunConfig config;
  config.name = recipe.run.text("name");
  config.output_dir = output_dir_of(recipe);
  config.device = recipe.run.text("device");
  config.seed = static_cast<uint64_t>(recipe.run.integer("seed"));
  config.peak_tflops = recipe.run.real("peak_tflops");
  config.datasheet_tflops = recipe.run.real("datasheet_tflops");
  config.steps = recipe.training.integer("steps");
  config.shape = batch_shape(recipe, world_size);
  const std::string precision = recipe.training.text("precision");
  config.fp8 = precision == "fp8";
  const std::string gemm_library = recipe.training.text("gemm_library");
  config.lt_gemms = gemm_library == "cublaslt" || gemm_library == "cublaslt-timed";
  config.lt_gemm_timing = gemm_library == "cublaslt-timed";
  config.compute_dtype = precision == "bf16" || config.fp8 ? torch::kBFloat16 : torch::kFloat32;
  config.reproducible = recipe.training.boolean("reproducible");
  config.fp8_rowwise = recipe.training.text("fp8_scaling") == "rowwise";
  if (config.fp8_rowwise && !config.fp8) {
    recipe.training.fail("fp8_scaling",
                         fmt::format("'tensorwise' (the default) with training.precision = '{}': the scaling is "
                                     "FP8's, and this run computes in {}",
                                     precision, precision));
  }
  config.fp8_keep_both_casts = recipe.training.text("fp8_weight_casts") == "both";
  if (config.fp8_keep_both_casts && (!config.fp8 || config.fp8_rowwise)) {
    recipe.training.fail("fp8_weight_casts",
                         config.fp8 ? std::string("'transposed' (the default) with training.fp8_scaling = 'rowwise' "
                                                  "(rowwise scaling casts the weights at every forward and keeps none)")
                                    : fmt::format("'transposed' (the default) with training.precision = '{}': the "
                                                  "casts are FP8's, and this run computes in {}",
                                                  precision, precision));
  }
  if (config.fp8) {
    if (config.device != "cuda") {
      recipe.training.fail("precision",
                           fmt::format("'bf16' or 'fp32' with run.device = '{}' (FP8 GEMMs need CUDA)", config.device));
    }
    if (config.reproducible) {
      recipe.training.fail("precision",
                           "'bf16' or 'fp32' with training.reproducible = true (FP8's per-tensor scales follow the "
                           "micro-batch, so its bits cannot be the same across splits)");
    }
    if (!ops::fp8_linear_available()) {
      recipe.training.fail("precision",
                           "'bf16' or 'fp32': this build has no FP8 linear layers (CUDA and LibTorch 2.9 or later)");
    }
  }
  config.reproducible_atom = recipe.training.integer("reproducible_atom");
  config.cuda_graphs = recipe.training.boolean("cuda_graphs");
  if (config.cuda_graphs) {
    if (config.device != "cuda") {
      recipe.training.fail("cuda_graphs", fmt::format("false with run.device = '{}' (CUDA graphs)", config.device));
    }
    if (!cuda_graphs_available()) {
      recipe.training.fail("cuda_graphs", "false: this build has no CUDA graphs (a CUDA build of LibTorch)");
    }
  }

  UpdateRule& update = config.update;
  update.schedule.shape = recipe.lr_schedule.text("name");
  update.schedule.peak_lr = recipe.optimizer.real("lr");
  update.schedule.min_lr = recipe.lr_schedule.real("min_lr");
  update.schedule.warmup_steps = recipe.lr_schedule.integer("warmup_steps");
  update.schedule.total_steps = config.steps;
  update.max_grad_norm = recipe.training.real("max_grad_norm");
  update.skip_nonfinite = recipe.training.text("on_nonfinite") == "skip";

  if (fs::exists(config.output_dir) && !fs::is_directory(config.output_dir)) {
    recipe.run.fail("output_dir", fmt::format("a directory for the run's outputs; {} is a file", config.output_dir));
  }
  if (recipe.run.text("output_dir").empty()) {
    // runs/<name> is a directory below runs/: a name of "", ".", "..", an
    // absolute path or one that climbs out would put the run's files into
    // runs/ itself, the working directory or anywhere (fs::path's / drops
    // "runs" before an absolute name), over whatever files are there.
    const fs::path normal = fs::path(config.output_dir).lexically_normal();
    const auto first = normal.begin();
    if (normal.is_absolute() || first == normal.end() || *first != "runs" || std::next(first) == normal.end() ||
        std::next(first)->empty()) {
      recipe.run.fail("name", fmt::format("a name for the run's directory below runs/ (or run.output_dir set); "
                                          "'{}' gives {}",
                                          config.name, config.output_dir));
    }
  }
  check_outputs_spare_inputs(recipe, config.output_dir);
  CheckpointPolicy& checkpoint = config.checkpoint;
  checkpoint.dir = recipe.checkpoint.text("dir");
  if (checkpoint.dir.empty()) checkpoint.dir = (fs::path(config.output_dir) / "checkpoints").string();
  if (fs::exists(checkpoint.dir) && !fs::is_directory(checkpoint.dir)) {
    recipe.checkpoint.fail("dir", fmt::format("a directory for checkpoints; {} is a file", checkpoint.dir));
  }
  // Checked before either directory is made: one that holds the other would share the run's lock file, and
  // one made where the run writes a file would cost the run that file.
  if (path_within(config.output_dir, checkpoint.dir)) {
    recipe.checkpoint.fail("dir", fmt::format("a directory of its own for checkpoints; {} is or contains the run's "
                                              "output directory {}",
                                              checkpoint.dir, config.output_dir));
  }
  for (const OutputClaim& own : own_outputs(config.output_dir)) {
    if (path_within(checkpoint.dir, own.path)) {
      recipe.checkpoint.fail("dir", fmt::format("a directory of its own for checkpoints; {} is or lies inside {} "
                                                "({})",
                                                checkpoint.dir, own.owner, own.path.string()));
    }
  }
  checkpoint.interval = recipe.checkpoint.integer("interval");
  checkpoint.keep = recipe.checkpoint.integer("keep");
  checkpoint.resume = recipe.checkpoint.text("resume");

  ProfilePolicy& profile = config.profile;
  profile.first = recipe.run.integer("profile_start");
  if (profile.first > config.steps) {
    recipe.run.fail("profile_start",
                    fmt::format("a step of this run, 1..{} (training.steps), or 0 for off", config.steps));
  }
  if (profile.first > 0) {
    const std::string missing = profiler_unavailable();
    if (!missing.empty()) recipe.run.fail("profile_start", missing);
  }
  profile.count = std::min(recipe.run.integer("profile_steps"), config.steps - profile.first + 1);

  config.comm = comm_settings(recipe);
  config.fingerprint = recipe.fingerprint(config.shape.global_batch_size());
  return config;
}

}  // namespace trainer
