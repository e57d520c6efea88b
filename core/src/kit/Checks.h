// The conformance kit's checks, one function each, for one split on one
// rank; each fills its fields of the rank's ConformanceRow. The driver
// (Driver.cpp) runs them in this order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "distributed/Launcher.h"
#include "kit/Conformance.h"
#include "kit/Reference.h"
#include "plugin/PluginRegistry.h"
#include "trainer/Comm.h"
#include "trainer/Strategy.h"

namespace trainer::kit {

/// What every check of one split on one rank works with.
struct KitRun {
  PluginRegistry& registry;
  const LoadedPlugin& plugin;  ///< the strategy under test
  Comm& comm;
  torch::Device device;
  Split split;
  WorldInfo world;
  Context context;
  /// The optimizer under test (adamw when a strategy is under test), and
  /// its name or path (a fresh instance: kit::make_optimizer).
  Optimizer& optimizer;
  std::string optimizer_name;
  std::vector<std::string> optimizer_settings;
  /// The strategy under test with this split's options, not yet set up.
  std::unique_ptr<Strategy> fresh_strategy() const;
};

/// 1. The gradient after accumulation and its norm, against the fp64
/// reference's (`reference` holds the gradient of `first`).
void check_gradient(const KitRun& run, const Reference& reference, const Fixture& first, double reference_norm,
                    ConformanceRow& row);

/// 5 (on the first fixture). Reproducible mode: the exact sum of
/// per-sample gradients, written into the strategy, matches the reference
/// as closely as the plain sum, and its hash is the same at every split
/// (check_plugin compares them).
void check_reproducible(const KitRun& run, const Reference& reference, const Fixture& first, ConformanceRow& row);

/// A strategy after kSteps clipped AdamW steps, and the reference trained
/// beside it: what checks 2 to 4 compare.
struct Trained {
  std::unique_ptr<Model> model;
  std::unique_ptr<Strategy> strategy;
  std::vector<torch::Tensor> values;  ///< parameter_slices' values after the steps, copied
  std::vector<torch::Tensor> start;   ///< the reference's values before the steps
  std::vector<torch::Tensor> reference_change;
  std::vector<torch::Tensor> mask;  ///< elements the parameter comparison keeps
  double masked = 0;                ///< share of elements left out
};
Trained train_against_reference(const KitRun& run, double max_norm);

/// 2. The parameters' change after the steps, against the reference's.
void check_parameters(const Trained& trained, ConformanceRow& row);
/// 3. World size 1: the same arithmetic as ddp, so the same bits.
void check_identical_to_ddp(const KitRun& run, const Trained& trained, double max_norm, ConformanceRow& row);
/// 4. The consolidated final weights (as `trainer run` exports them)
/// against the reference; rank 0 only. Per parameter too: each must have
/// moved, and moved as the reference's did (an optimizer or strategy that
/// skips a parameter, or updates it on some ranks only, fails by name).
void check_final_weights(const KitRun& run, const Trained& trained, ConformanceRow& row);
/// 4. A checkpoint of the trained state, read back, holds this rank's state
/// bit for bit; the previous split's checkpoint (`load`, usually another
/// world size) loads into a fresh strategy of this split as the same bits;
/// and a fresh strategy and optimizer resumed from this split's own
/// checkpoint take the next step to the same bits as the trained ones (state
/// kept outside state_slices, e.g. inside the optimizer object, fails).
void check_checkpoints(const KitRun& run, const Trained& trained, const std::string& dir, const std::string& load,
                       ConformanceRow& row);
/// bf16 compute with 16 accumulation steps at world size 1.
void check_bf16_accumulation(const KitRun& run, ConformanceRow& row);

}  // namespace trainer::kit
