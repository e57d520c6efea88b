// Which samples form global batch t, and which rank and micro-step each one
// lands on. The set depends only on (seed, t, global batch size); the split
// is a fixed rule, so changing micro-batch size, accumulation steps or world
// size never changes what a step trains on.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "recipe/Recipe.h"

namespace trainer {

class GlobalBatchSampler {
 public:
  /// shuffle: each epoch over [0, dataset_size) is a permutation seeded by
  /// (seed, epoch); otherwise file order.
  GlobalBatchSampler(uint64_t seed, int64_t dataset_size, bool shuffle);

  /// Dataset indices of global batch `step` (0-based): stream positions
  /// [step * G, (step + 1) * G) of the epoch-after-epoch order.
  std::vector<int64_t> global_batch(int64_t step, int64_t global_batch_size);

 private:
  int64_t index_at(int64_t position);

  uint64_t seed_;
  int64_t size_;
  bool shuffle_;
  std::map<int64_t, std::vector<int64_t>> permutations_;  // the epochs in use, at most two
};

/// The slice of a global batch that `rank` trains at `micro_step`: rank r
/// owns positions [r * mb * accum, (r + 1) * mb * accum), and micro-step m
/// the m-th block of mb inside it.
std::vector<int64_t> local_micro_batch(const std::vector<int64_t>& global, const BatchShape& shape, int rank,
                                       int64_t micro_step);

}  // namespace trainer
