// The sampler's promise: the samples of a step depend on (seed, step, global
// batch size) only, never on how they are split over ranks and micro-steps.
#include "run/Sampler.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace trainer {
namespace {

// Every sample of step `step` as the ranks and micro-steps of `shape` see it.
std::vector<int64_t> collected(GlobalBatchSampler& sampler, const BatchShape& shape, int64_t step) {
  const std::vector<int64_t> global = sampler.global_batch(step, shape.global_batch_size());
  std::vector<int64_t> all;
  for (int rank = 0; rank < shape.world_size; ++rank) {
    for (int64_t m = 0; m < shape.grad_accum_steps; ++m) {
      const std::vector<int64_t> local = local_micro_batch(global, shape, rank, m);
      EXPECT_EQ(static_cast<int64_t>(local.size()), shape.micro_batch_size);
      all.insert(all.end(), local.begin(), local.end());
    }
  }
  std::sort(all.begin(), all.end());
  return all;
}

TEST(Sampler, EverySplitOfAGlobalBatchTrainsTheSameSamples) {
  const std::vector<BatchShape> splits = {{8, 1, 1}, {2, 4, 1}, {1, 8, 1}, {4, 1, 2}, {2, 2, 2}, {1, 2, 4}};
  for (int64_t step = 0; step < 40; ++step) {
    GlobalBatchSampler reference_sampler(7, 100, true);
    const std::vector<int64_t> reference = collected(reference_sampler, splits[0], step);
    for (const BatchShape& split : splits) {
      GlobalBatchSampler sampler(7, 100, true);
      EXPECT_EQ(collected(sampler, split, step), reference) << "step " << step << " split " << split.micro_batch_size
                                                            << "x" << split.grad_accum_steps << "x" << split.world_size;
    }
  }
}

TEST(Sampler, EachEpochVisitsEverySampleOnce) {
  GlobalBatchSampler sampler(3, 64, true);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> seen;
    for (int64_t step = epoch * 8; step < (epoch + 1) * 8; ++step) {
      const std::vector<int64_t> batch = sampler.global_batch(step, 8);
      seen.insert(seen.end(), batch.begin(), batch.end());
    }
    std::sort(seen.begin(), seen.end());
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(seen[i], i) << "epoch " << epoch;
  }
}

TEST(Sampler, SeedChangesTheOrderAndShuffleOffKeepsFileOrder) {
  GlobalBatchSampler a(1, 1000, true), b(1, 1000, true), c(2, 1000, true), ordered(1, 10, false);
  EXPECT_EQ(a.global_batch(5, 16), b.global_batch(5, 16));
  EXPECT_NE(a.global_batch(5, 16), c.global_batch(5, 16));
  EXPECT_EQ(ordered.global_batch(2, 4), (std::vector<int64_t>{8, 9, 0, 1}));  // wraps at the end
}

}  // namespace
}  // namespace trainer
