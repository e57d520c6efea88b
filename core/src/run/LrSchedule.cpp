// Learning-rate schedule arithmetic.
#include "run/LrSchedule.h"

#include <algorithm>
#include <cmath>

namespace trainer {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (shape == "constant") return peak_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  if (shape == "linear") return min_lr + (peak_lr - min_lr) * (1.0 - progress);
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace trainer
