#include <gtest/gtest.h>

#include "Run.h"

// The conformance kit: every split of a global batch of 8 (micro-batch x
// accumulation steps x world size) against an fp64 reference, at world
// sizes 1, 2 and 4, with the plugin found by name through --plugin-dir.
TEST(@CLASS@Test, PassesTheConformanceKit) {
  const TrainerResult result =
      run_trainer("check-plugin @NAME@ --split 1,8,1 --split 8,1,1 --split 2,2,2 --split 1,2,4 --split 2,1,4");
  EXPECT_EQ(result.status, 0) << result.output;
}

// The same plugin given by its file.
TEST(@CLASS@Test, PassesTheKitByPath) {
  const TrainerResult result = run_trainer(std::string("check-plugin '") + PLUGIN_FILE + "' --split 2,4,1 --split 4,1,2 --split 1,2,4");
  EXPECT_EQ(result.status, 0) << result.output;
}

TEST(@CLASS@Test, TrainsARecipe) {
  const std::string recipe =
      write_recipe("strategy", std::string(kSmallRun) + "micro_batch_size = 2\ngrad_accum_steps = 2\n"
                                                        "[strategy]\nname = '@NAME@'\n[distributed]\nnproc = 2\n");
  const TrainerResult result = run_trainer("run " + recipe);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(losses("strategy").size(), 4u) << result.output;
}
