// The sampler's promise: the samples of a step depend on (seed, step, global
// batch size) only, never on how they are split over ranks and micro-steps.
#include "run/Sampler.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "trainer/util/Random.h"

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

// The rule itself, not only the set: rank r's micro-step m is the m-th
// block of micro_batch_size inside rank r's block of the global batch.
TEST(Sampler, EachRankAndMicroStepTakesItsBlockOfTheGlobalBatch) {
  GlobalBatchSampler sampler(7, 100, true);
  const BatchShape shape{2, 3, 2};  // micro 2, accum 3, world 2: global 12
  const std::vector<int64_t> global = sampler.global_batch(4, shape.global_batch_size());
  for (int rank = 0; rank < 2; ++rank) {
    for (int64_t m = 0; m < 3; ++m) {
      const std::vector<int64_t> local = local_micro_batch(global, shape, rank, m);
      const size_t at = static_cast<size_t>(rank * 6 + m * 2);
      EXPECT_EQ(local, (std::vector<int64_t>{global[at], global[at + 1]})) << rank << " " << m;
    }
  }
}

// The Feistel order is a bijection of [0, n) for every n (cycle-walking
// over the next power of four), different per key, and far from the
// identity; it needs no table, so a trillion-window epoch costs nothing.
TEST(Sampler, FeistelOrderIsABijectionForEverySize) {
  for (int64_t n = 1; n <= 300; ++n) {
    const FeistelPermutation p(n, 42);
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = p(i);
      ASSERT_TRUE(j >= 0 && j < n) << n;
      ASSERT_FALSE(seen[static_cast<size_t>(j)]) << "n " << n << ": " << j << " twice";
      seen[static_cast<size_t>(j)] = true;
    }
  }
  const int64_t n = 100003;  // prime, just above a power of four's quarter
  const FeistelPermutation a(n, 1), b(n, 2);
  int64_t fixed = 0, same = 0;
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = a(i);
    ASSERT_FALSE(seen[static_cast<size_t>(j)]);
    seen[static_cast<size_t>(j)] = true;
    fixed += j == i;
    same += j == b(i);
  }
  // A random permutation has about one fixed point, and two agree at about
  // one place; allow 20 (a Poisson(1) count exceeds 20 with odds below 1e-19).
  EXPECT_LT(fixed, 20);
  EXPECT_LT(same, 20);
  const FeistelPermutation huge(int64_t(1) << 40, 3);
  const int64_t x = huge(123456789), y = huge(987654321);
  EXPECT_NE(x, y);
  EXPECT_TRUE(x >= 0 && x < (int64_t(1) << 40));
}

// Checkpoints of before "feistel-1" resume with their Fisher-Yates order,
// which is still exactly the earlier one: a shuffle drawn by splitmix64 per
// epoch (recomputed here from its definition).
TEST(Sampler, TheFisherYatesOrderOfOlderCheckpointsIsKept) {
  GlobalBatchSampler legacy(5, 50, true, SampleOrder::FisherYates);
  std::vector<int64_t> order(50);
  for (int64_t i = 0; i < 50; ++i) order[i] = i;
  uint64_t state = 5 * 0x9e3779b97f4a7c15ULL + 0 + 1;  // epoch 0
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[uniform_below(state, i + 1)]);
  EXPECT_EQ(legacy.global_batch(0, 50), order);
  GlobalBatchSampler feistel(5, 50, true);
  EXPECT_NE(feistel.global_batch(0, 50), order);
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
