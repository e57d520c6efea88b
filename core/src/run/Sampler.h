// Which samples form global batch t, and which rank and micro-step each one
// lands on. The set depends only on (seed, t, global batch size); the split
// is a fixed rule, so changing micro-batch size, accumulation steps or world
// size never changes what a step trains on.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "recipe/Recipe.h"

namespace trainer {

/// How an epoch's order is drawn.
enum class SampleOrder {
  /// A keyed Feistel permutation of the index (cycle-walking over the next
  /// power of four): O(1) memory and O(1) work per sample, whatever the
  /// dataset's size. Runs and their checkpoints since manifest sampler
  /// "feistel-1".
  Feistel,
  /// A Fisher-Yates shuffle of the whole epoch held in memory (8 bytes per
  /// sample per epoch in use): the order of checkpoints written before
  /// "feistel-1", which resume with it so that their data order is unchanged.
  FisherYates,
};

/// The manifest's name of the order (Feistel only; FisherYates checkpoints
/// name none).
inline const char* kFeistelSampler = "feistel-1";

/// A bijection of [0, n) drawn by `key`: a balanced Feistel network of six
/// rounds over 2b bits (4^b the least power of four >= n), walked until the
/// value falls in [0, n) again (fewer than four walks on average).
class FeistelPermutation {
 public:
  FeistelPermutation(int64_t n, uint64_t key);
  int64_t operator()(int64_t index) const;

 private:
  uint64_t round(int r, uint64_t half) const;
  int64_t n_;
  uint64_t key_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
};

class GlobalBatchSampler {
 public:
  /// shuffle: each epoch over [0, dataset_size) is a permutation seeded by
  /// (seed, epoch), drawn as `order` says; otherwise file order.
  GlobalBatchSampler(uint64_t seed, int64_t dataset_size, bool shuffle, SampleOrder order = SampleOrder::Feistel);

  /// Dataset indices of global batch `step` (0-based): stream positions
  /// [step * G, (step + 1) * G) of the epoch-after-epoch order.
  std::vector<int64_t> global_batch(int64_t step, int64_t global_batch_size);

 private:
  int64_t index_at(int64_t position);

  uint64_t seed_;
  int64_t size_;
  bool shuffle_;
  SampleOrder order_;
  std::optional<FeistelPermutation> feistel_;  // of epoch feistel_epoch_
  int64_t feistel_epoch_ = -1;
  std::map<int64_t, std::vector<int64_t>> permutations_;  // FisherYates: the epochs in use, at most two
};

/// The slice of a global batch that `rank` trains at `micro_step`: rank r
/// owns positions [r * mb * accum, (r + 1) * mb * accum), and micro-step m
/// the m-th block of mb inside it.
std::vector<int64_t> local_micro_batch(const std::vector<int64_t>& global, const BatchShape& shape, int rank,
                                       int64_t micro_step);

}  // namespace trainer
