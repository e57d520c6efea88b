// Learning-rate schedules: linear warmup, then constant, linear or cosine
// decay to min_lr at the last step. One per run, owned by the loop.
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

struct LrSchedule {
  std::string shape = "constant";  ///< constant | linear | cosine
  double peak_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  /// The rate of optimizer step `step` (0-based). Warmup reaches peak_lr at
  /// step warmup_steps - 1; decay reaches min_lr at step total_steps - 1.
  double at(int64_t step) const;
};

}  // namespace trainer
