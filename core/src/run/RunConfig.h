// The run's settings as types, built once from the recipe before anything
// is written: what the loop, its checkpoints, its profiler and its comm
// read, so that no recipe key is looked up by string past this point.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "recipe/Recipe.h"
#include "run/LrSchedule.h"
#include "trainer/Strategy.h"
#include "util/OutputClaims.h"

namespace trainer {

/// How the loop turns a reduced gradient into an update.
struct UpdateRule {
  LrSchedule schedule;
  double max_grad_norm = 0.0;   ///< 0: no clipping
  bool skip_nonfinite = false;  ///< training.on_nonfinite = "skip"
};

/// [checkpoint]: where, how often, how many, and where to start from.
struct CheckpointPolicy {
  std::string dir;       ///< checkpoint.dir, or <output_dir>/checkpoints
  int64_t interval = 0;  ///< optimizer steps between checkpoints; 0: only on a stop signal
  int64_t keep = 0;
  std::string resume;  ///< "", "auto" or a checkpoint's path
};

/// run.profile_start and run.profile_steps: the steps the profiler records.
struct ProfilePolicy {
  int64_t first = 0;  ///< 1-based; 0: off
  int64_t count = 0;
};

/// [distributed].
struct CommSettings {
  std::string backend;
  int nproc = 1;  ///< local workers `trainer run` starts
  double timeout_s = 300;
  std::chrono::milliseconds timeout() const;
};

struct RunConfig {
  std::string name;
  std::string output_dir;  ///< run.output_dir, or runs/<run.name>
  std::string device;      ///< "cpu" | "cuda"
  uint64_t seed = 0;
  double peak_tflops = 0;       ///< run.peak_tflops; 0: measured on CUDA
  double datasheet_tflops = 0;  ///< run.datasheet_tflops; 0: looked up for known CUDA devices
  int64_t steps = 0;
  BatchShape shape;
  torch::Dtype compute_dtype = torch::kFloat32;  ///< training.precision (bf16 for "fp8")
  bool fp8 = false;                              ///< training.precision = "fp8": linear layers in FP8
  bool fp8_rowwise = false;                      ///< training.fp8_scaling = "rowwise"
  bool fp8_keep_both_casts = false;              ///< training.fp8_weight_casts = "both"
  bool lt_gemms = true;                          ///< training.gemm_library = "cublaslt" or "cublaslt-timed"
  bool lt_gemm_timing = true;                    ///< training.gemm_library = "cublaslt-timed"
  bool reproducible = false;
  int64_t reproducible_atom = 1;  ///< samples per forward and backward in reproducible mode
  bool cuda_graphs = false;       ///< training.cuda_graphs: forward and backward passes replayed from CUDA graphs
  UpdateRule update;
  CheckpointPolicy checkpoint;
  ProfilePolicy profile;
  CommSettings comm;
  /// What a checkpoint may not be resumed without (Recipe::fingerprint at this global batch).
  std::string fingerprint;
};

/// A file the run writes into its output directory, and what it is.
struct RunFile {
  const char* name;
  const char* what;
};

/// The run's own files in its output directory: claimed before the loggers
/// start, and checked by run_config (none a directory, none an input).
inline constexpr RunFile kRunFiles[] = {{"recipe.toml", "the run's recipe.toml"},
                                        {"summary.json", "the run's summary.json"},
                                        {"memory.json", "the run's memory.json"},
                                        {"model.safetensors", "the run's final weights"},
                                        {"config.json", "the run's config.json"}};

/// What the run writes in `output_dir` besides its loggers' files: its
/// lock, the profiler's directory and kRunFiles.
std::vector<OutputClaim> own_outputs(const std::filesystem::path& output_dir);

/// The run's output directory: run.output_dir, or runs/<run.name>.
std::string output_dir_of(const Recipe& recipe);

/// A run that starts at step 0 replaces no results of an earlier run with
/// another recipe: when the output directory holds model.safetensors or
/// summary.json, its recipe.toml must be a resolved recipe whose results
/// keys equal this one's (Recipe::result_difference), unless run.overwrite.
/// InputError naming run.output_dir and the first key that differs; by
/// train() once it knows the run starts at step 0 (no checkpoint resumed).
void check_earlier_results(const Recipe& recipe, const std::string& output_dir);

/// Keeps the recipe of every step a run's outputs hold. `earlier`: the
/// recipe the resumed checkpoint of step `step` was written with (nullopt
/// for a fresh start, or a checkpoint written before checkpoints held
/// their recipe). When it differs from this run's in a key that shapes the
/// results (Recipe::result_difference), the writer keeps it as
/// recipe.until-step-<step>.toml, since this run's recipe.toml replaces it;
/// such files of later steps (kept before a resume from an earlier step)
/// are removed, as the metrics of those steps are.
void keep_recipe_history(const Recipe& recipe, const std::string& output_dir, const std::optional<std::string>& earlier,
                         int64_t step);

/// The recipe's [distributed] table.
CommSettings comm_settings(const Recipe& recipe);

/// Every check of the run's own keys that needs no component: the batch
/// shape at `world_size`, the profiler's steps and availability, the
/// checkpoint directory. InputError naming the key, before anything of the
/// run is written.
RunConfig run_config(const Recipe& recipe, int world_size);

}  // namespace trainer
