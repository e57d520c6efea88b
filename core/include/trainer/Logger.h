// The logger plugin interface: receives one record per optimizer step on
// rank 0. No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/Plugin.h"

namespace trainer {

/// What a logger learns once, before the first step.
struct RunInfo {
  std::string name;
  int64_t total_steps = 0;
  int64_t first_step = 0;         ///< 0, or the step a resumed run starts at
  int64_t global_batch_size = 0;  ///< samples per optimizer step
  int64_t micro_batch_size = 0;
  int64_t grad_accum_steps = 0;
  int64_t seq_len = 0;  ///< input positions per sample
  int world_size = 1;
  std::string strategy;
  int64_t parameters = 0;                ///< model parameter count
  double flops_per_input_token = 0.0;    ///< training FLOPs the model reports per input token; 0: unknown
  double flops_per_target_token = 0.0;   ///< and per target token (e.g. the head's logits, for targets only)
  double flops_per_attended_pair = 0.0;  ///< and per attended (query, key) pair within a document (attention)
  double peak_flops = 0.0;               ///< measured (or run.peak_tflops) FLOP/s per rank: `mfu`'s; 0: unknown
  double datasheet_flops = 0.0;          ///< the device's datasheet dense peak per rank: `mfu_datasheet`'s; 0: unknown
};

/// One optimizer step. `loss` is (sum of token losses in the global batch) /
/// target_tokens, the quantity the gradient is of.
struct StepRecord {
  int64_t step = 0;  ///< 1-based optimizer step
  double loss = 0.0;
  double grad_norm = 0.0;  ///< before clipping
  double lr = 0.0;
  int64_t target_tokens = 0;  ///< N_t
  int64_t samples = 0;        ///< global batch size
  int64_t input_tokens = 0;   ///< non-padding input positions in the global batch
  int64_t documents = 0;      ///< documents in the global batch: one per sample unless the dataset packs
  double pad_fraction = 0.0;  ///< padding's share of the global batch's input positions (samples x seq_len)
  double step_seconds = 0.0;  ///< wall time of this step
  double elapsed_seconds = 0.0;
  bool skipped = false;            ///< no update applied (no target tokens, or non-finite gradient)
  double tokens_per_second = 0.0;  ///< input_tokens / step_seconds, all ranks together
  /// The step's FLOPs (flops_per_input_token x input_tokens +
  /// flops_per_target_token x target_tokens + flops_per_attended_pair x
  /// the sum over the batch's documents of their input positions squared)
  /// / step_seconds / (peak_flops x world size); NaN when unknown.
  double mfu = 0.0;
  /// The same over datasheet_flops (the field's convention: e.g. 989
  /// TFLOP/s bf16 for an H200); NaN when unknown.
  double mfu_datasheet = 0.0;
  double data_seconds = 0.0;  ///< of step_seconds: sampling and collating batches, copying them to the device
  /// CUDA: peaks within this step of the caching allocator's allocated and
  /// reserved bytes on rank 0's device; -1 on the CPU.
  int64_t memory_allocated_bytes = -1;
  int64_t memory_reserved_bytes = -1;
  int64_t rss_bytes = -1;  ///< CPU: resident set size of rank 0's process after the step; -1 on CUDA
};

/// One field of a step record as the file loggers write it.
struct MetricField {
  enum class Kind { Integer, Real, Bool };
  const char* name;
  double value;  ///< NaN: unknown on this run (written null / empty)
  Kind kind;
};

/// The record's fields, in the order and with the names every file logger
/// (jsonl, csv, tensorboard) uses; memory fields that do not apply to the
/// device are NaN.
std::vector<MetricField> metric_fields(const StepRecord& record);

/// Called on rank 0 only, from the training thread.
class Logger : public Component {
 public:
  ~Logger() override;
  virtual void start(const RunInfo& info) = 0;
  virtual void log(const StepRecord& record) = 0;
  /// Flushes; called once after the last step and on error paths.
  virtual void finish() = 0;
};

}  // namespace trainer
