// The conformance kit: the accumulation contract checked on any strategy
// plugin against a single-process fp64 reference (`trainer check-plugin`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/Launcher.h"
#include "plugin/PluginRegistry.h"

namespace trainer {

/// One split of the kit's global batch of 8: micro-batch size x
/// accumulation steps x world size, and for hybrid sharding the strategy's
/// shard_group_size (0: not set).
struct Split {
  int64_t micro = 8;
  int64_t accum = 1;
  int world = 1;
  int shard_group = 0;
  std::string text() const;      ///< "2x2x2", or "1x2x4g2" with a shard group size
  std::string argument() const;  ///< as --split takes it (parse_split's input): "2,2,2", or "1,2,4,2"
  /// The strategy's recipe table for this split ("" or its shard_group_size).
  std::string options() const;
};

/// "m,a,w" or "m,a,w,s" -> Split; InputError unless m * a * w == 8 and s
/// divides w.
Split parse_split(const std::string& text);
/// Six splits over world sizes 1, 2 and 4; for a strategy that declares
/// shard_group_size also world size 4 in shard groups of 2 and world size
/// 2 in groups of 1 (every rank a replica), after the others so that they
/// load a sharded checkpoint and write a hybrid one.
std::vector<Split> default_splits(const LoadedPlugin& strategy);

struct ConformanceRequest {
  std::string strategy;             ///< plugin name or .so path
  std::string optimizer = "adamw";  ///< the optimizer the strategy updates with (name or .so path)
  /// Settings of the optimizer besides the kit's defaults, KEY=VALUE with a
  /// TOML value ("state_dtype='bf16'"), from --optimizer-set.
  std::vector<std::string> optimizer_settings;
  std::vector<Split> splits;
  std::string device = "cpu";
  std::string backend = "gloo";
  bool backend_at_one_rank = false;
  bool bf16 = false;  ///< also run the bf16 accumulation check (on the world-size-1 splits)
  double timeout_s = 120;
  std::vector<std::string> plugin_dirs;  ///< --plugin-dir as given: workers search them too
  std::string report;                    ///< JSONL output: one row per split and rank
  /// Workers: the previous split's checkpoint, loaded and compared; the
  /// driver: the checkpoint its first split loads ("" none).
  std::string load_checkpoint;
  /// The driver: where the last split's checkpoint is copied ("" nowhere).
  std::string keep_last_checkpoint;
};

/// Tolerances of the contract in fp32 (their origin is in kit/Checks.cpp).
inline constexpr double kGradTolerance = 1e-5;
inline constexpr double kParamTolerance = 1e-4;
/// With optimizer state narrower than fp32 (bf16, unit roundoff 2^-8): each
/// update reads moments rounded stochastically, about 2^-9 relative each,
/// and the reference keeps them in fp64; 1e-2 bounds five such steps with
/// room, and is still 100 times below what a skipped or rank-dependent
/// update errs by (~1).
inline constexpr double kBf16StateParamTolerance = 1e-2;
/// Per parameter: ten times the tolerance over all of them (a small
/// parameter's relative error is noisier); a skipped or rank-dependent
/// update errs by ~1.
inline constexpr double kPerParameterFactor = 10;

/// Norm-wise relative errors one rank measured for one split.
struct ConformanceRow {
  std::string split;
  int rank = 0;
  double grad_error = 0;   ///< ||g - g_ref|| / ||g_ref|| over the slices this rank holds
  double norm_error = 0;   ///< |reported norm - reference norm| / reference norm
  double param_error = 0;  ///< parameter change after 5 clipped optimizer steps, vs the reference's
  /// What param_error and final_weights_error are held to: kParamTolerance,
  /// or kBf16StateParamTolerance for an optimizer with bf16 state.
  double param_tolerance = kParamTolerance;
  double masked = 0;          ///< share of elements left out of param_error (near-zero reference gradient)
  int identical_to_ddp = -1;  ///< world size 1: parameters bit-identical to ddp's (1) or not (0); else -1
  double bf16_error = -1;     ///< bf16 compute, 16 accumulation steps: error vs the exact sum of the micro-gradients
  double bf16_bound = -1;     ///< what fp32 accumulation of those micro-gradients can err by
  /// The checkpoint written after the 5 steps holds this rank's state bit for bit (1) or not (0).
  int checkpoint_saved = -1;
  /// The previous split's checkpoint loaded into this split bit for bit (1) or not (0); -1: none.
  int checkpoint_loaded = -1;
  /// Rank 0: the consolidated weights' change vs the reference's (as param_error); -1 elsewhere.
  double final_weights_error = -1;
  /// Rank 0: parameters that did not move, and parameters whose change
  /// differs from the reference's by more than kPerParameterFactor x
  /// param_tolerance; -1 elsewhere.
  int unchanged_parameters = -1;
  int wrong_parameters = -1;
  /// Resumed from this split's checkpoint (fresh strategy and optimizer),
  /// the next step gives the same bits as continuing (1) or not (0).
  int resumed_identical = -1;
  /// Reproducible mode's gradient: error as grad_error, and 52 bits of the
  /// hash of the whole gradient, which every split must share; both -2 when
  /// the mode stopped with an error (printed).
  double reproducible_error = -1;
  double reproducible_hash = -1;
};

/// Runs every split (spawning world-size workers of this executable with
/// `worker_args` appended), prints a table, writes the report; returns 0
/// when every rank of every split passes, 1 otherwise.
int check_plugin(PluginRegistry& registry, const ConformanceRequest& request, const std::string& executable);

/// The kit for an optimizer plugin (request.optimizer): check_plugin under
/// each of `strategies` with its default splits; 0 when all pass.
int check_optimizer(PluginRegistry& registry, const ConformanceRequest& request,
                    const std::vector<std::string>& strategies, const std::string& executable);

/// One split on this process's rank; writes its row to `rank_report`.
void run_conformance_worker(PluginRegistry& registry, const ConformanceRequest& request, const Split& split,
                            const WorldInfo& world, const std::string& rank_report);

}  // namespace trainer
