// The promise at world size 1: quickstart learns, a recipe run twice gives
// bit-identical losses, and the split of a global batch into micro-batches
// and accumulation steps does not change the per-step loss.
#include <gtest/gtest.h>

#include <cmath>

#include "TestSupport.h"

namespace trainer {
namespace {

const auto& losses_of = testing::quickstart_losses;

TEST(TrainingInvariance, QuickstartHalvesItsLoss) {
  const std::vector<double> loss = losses_of("Quickstart", "");
  ASSERT_EQ(loss.size(), 200u);
  double last10 = 0.0;
  for (size_t i = loss.size() - 10; i < loss.size(); ++i) last10 += loss[i] / 10.0;
  EXPECT_LE(last10, 0.5 * loss.front()) << "first " << loss.front() << ", mean of last 10 " << last10;
}

TEST(TrainingInvariance, SameRecipeTwiceIsBitIdentical) {
  const std::vector<double> a = losses_of("TwiceA", "--set training.steps=30");
  const std::vector<double> b = losses_of("TwiceB", "--set training.steps=30");
  ASSERT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b);  // exact: the files carry 17 significant digits
}

TEST(TrainingInvariance, AccumulationSplitDoesNotChangeTheLoss) {
  const std::vector<double> reference = losses_of(
      "Split8x1", "--set training.steps=50 --set training.micro_batch_size=8 --set training.grad_accum_steps=1");
  ASSERT_EQ(reference.size(), 50u);
  for (const auto& [micro, accum] : std::vector<std::pair<int, int>>{{2, 4}, {1, 8}}) {
    const std::string name = "Split" + std::to_string(micro) + "x" + std::to_string(accum);
    const std::vector<double> loss =
        losses_of(name, "--set training.steps=50 --set training.micro_batch_size=" + std::to_string(micro) +
                            " --set training.grad_accum_steps=" + std::to_string(accum));
    ASSERT_EQ(loss.size(), reference.size());
    for (size_t i = 0; i < loss.size(); ++i) {
      // Same samples, same arithmetic up to the order of fp32 sums: 50 Adam
      // steps keep the difference at rounding level (seen: ~1e-7).
      EXPECT_LE(std::abs(loss[i] - reference[i]), 1e-5 * std::abs(reference[i]))
          << name << " step " << i + 1 << ": " << loss[i] << " vs " << reference[i];
    }
  }
}

}  // namespace
}  // namespace trainer
