// What a run builds before its first step and keeps until its last: the
// device, the comm, the components and reproducible mode's state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/types.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "distributed/Launcher.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "reproducible/ExactGradients.h"
#include "reproducible/ReproducibleMode.h"
#include "run/ForwardBackward.h"
#include "run/RunConfig.h"
#include "run/RunLock.h"
#include "trainer/Dataset.h"
#include "trainer/Logger.h"
#include "trainer/Model.h"
#include "trainer/Optimizer.h"
#include "trainer/Strategy.h"
#include "util/Files.h"

namespace trainer {

// What a run builds before its first step and keeps until its last.
struct RunParts {
  // First, so that it goes last: with training.cuda_graphs everything the
  // run makes and launches is on this stream (ForwardBackward.h).
  std::unique_ptr<CaptureStream> capture_stream;
  Context context;
  torch::Device device = torch::kCPU;
  bool writer = false;                    // only rank 0 writes files and metrics
  const RunConfig* config = nullptr;      // the run's settings; the caller's, outliving the parts
  c10::intrusive_ptr<c10d::Store> store;  // the job's rendezvous store; null at world size 1
  std::unique_ptr<Comm> comm;
  std::unique_ptr<Model> model;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<Optimizer> optimizer;  // before the strategy, which updates through it
  std::unique_ptr<Strategy> strategy;
  std::string dataset_name, model_name, strategy_name, optimizer_name;
  int64_t parameter_count = 0;
  // FP8: a step's micro-steps reuse the weights' casts of its first (ops::Fp8WeightReuse).
  bool reuse_fp8_weight_casts = false;
  bool reuse_keeps_both_casts = false;  // training.fp8_weight_casts = "both": the row-major cast kept too
  // Tensor bytes live on the run's device (live_bytes) before the model is
  // made, and above that after the strategy's setup and after the first step.
  int64_t memory_baseline = 0;
  int64_t measured_setup_bytes = -1;
  int64_t measured_after_step_bytes = -1;
  int64_t measured_step_peak_bytes = -1;  ///< the most live within the first step, above memory_baseline
  // Reproducible mode only; declared last, so the hooks go before the model.
  std::unique_ptr<ReproducibleSettings> reproducible;
  std::unique_ptr<ExactGradients> exact;
  // Reproducible mode, and the fast mode with training.cuda_graphs.
  std::unique_ptr<ForwardBackwardRunner> passes;
};

/// Set-up: the output and checkpoint directories (created by rank 0 into
/// `made`, which removes them again unless kept, and locked; nothing
/// written in them yet), the process group, the components, and the
/// strategy's hold on the model, checked.
RunParts set_up(const Recipe& recipe, const RunConfig& config, PluginRegistry& registry, const WorldInfo& world,
                MadeDirectories& made, std::optional<RunLock>& lock, std::optional<RunLock>& checkpoint_lock);

/// The run's description for loggers and the log.
RunInfo describe_run(const RunConfig& config, const RunParts& run);

}  // namespace trainer
