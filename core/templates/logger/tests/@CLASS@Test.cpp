#include <gtest/gtest.h>

#include "Run.h"

TEST(@CLASS@Test, PrintsTheLossEveryFewSteps) {
  const std::string recipe = write_recipe("logger", std::string(kSmallRun) + "[[logger]]\nname = '@NAME@'\nevery = 2\n");
  const TrainerResult result = run_trainer("run " + recipe);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("@NAME@: step 2 loss"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("@NAME@: step 4 loss"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("@NAME@: step 3 loss"), std::string::npos) << result.output;
}

TEST(@CLASS@Test, RefusesABadKey) {
  const std::string recipe = write_recipe("logger-bad", "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n"
                                                        "[[logger]]\nname = '@NAME@'\nevery = 0\n");
  const TrainerResult result = run_trainer("validate " + recipe);
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("every"), std::string::npos) << result.output;
}
