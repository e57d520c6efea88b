#include <gtest/gtest.h>

#include "Run.h"

// The conformance kit for an optimizer: under each strategy, the update
// against an fp64 run of the optimizer's own step, the same bits as ddp at
// world size 1, and its state through a checkpoint and across world sizes.
TEST(@CLASS@Test, PassesTheConformanceKit) {
  const TrainerResult result =
      run_trainer("check-plugin @NAME@ --strategy ddp --strategy zero3 --split 8,1,1 --split 2,2,2 --split 1,2,4");
  EXPECT_EQ(result.status, 0) << result.output;
}

// A recipe trains with it: the loss goes down.
TEST(@CLASS@Test, TrainsARecipe) {
  const std::string recipe = write_recipe(
      "optimizer", std::string(kSmallRun) + "[optimizer]\nname = '@NAME@'\nlr = 0.01\n[strategy]\nname = 'zero1'\n");
  const TrainerResult result = run_trainer("run " + recipe);
  ASSERT_EQ(result.status, 0) << result.output;
  const std::vector<double> loss = losses("optimizer");
  ASSERT_EQ(loss.size(), 4u) << result.output;
  EXPECT_LT(loss.back(), loss.front()) << result.output;
}
