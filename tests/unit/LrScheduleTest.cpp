// Learning-rate schedules: warmup, and the decay shapes' end points.
#include "run/LrSchedule.h"

#include <gtest/gtest.h>

namespace trainer {
namespace {

TEST(LrSchedule, WarmupRisesLinearlyToThePeak) {
  const LrSchedule s{"constant", 1.0, 0.0, 4, 10};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
}

TEST(LrSchedule, CosineAndLinearEndAtMinLr) {
  const LrSchedule cosine{"cosine", 1.0, 0.1, 2, 13};  // decays over steps 2..12
  EXPECT_DOUBLE_EQ(cosine.at(2), 1.0);
  EXPECT_NEAR(cosine.at(7), 0.55, 1e-12);  // halfway: min + (peak - min) / 2
  EXPECT_DOUBLE_EQ(cosine.at(12), 0.1);
  const LrSchedule linear{"linear", 1.0, 0.0, 0, 11};
  EXPECT_DOUBLE_EQ(linear.at(0), 1.0);
  EXPECT_DOUBLE_EQ(linear.at(5), 0.5);
  EXPECT_DOUBLE_EQ(linear.at(10), 0.0);
}

}  // namespace
}  // namespace trainer
