#include <gtest/gtest.h>

#include "Run.h"

// The synthetic dataset's completions count up from the prompt's last token:
// a bigram model learns most of that.
constexpr const char* kRecipe = R"(
[model]
name = '@NAME@'
vocab_size = 64
[dataset]
name = 'synthetic'
vocab_size = 64
[training]
steps = 40
micro_batch_size = 8
[optimizer]
lr = 3e-2
)";

TEST(@CLASS@Test, LearnsTheSyntheticTask) {
  const TrainerResult result = run_trainer("run " + write_recipe("model", kRecipe));
  ASSERT_EQ(result.status, 0) << result.output;
  const std::vector<double> loss = losses("model");
  ASSERT_EQ(loss.size(), 40u) << result.output;
  EXPECT_LT(loss.back(), 0.6 * loss.front()) << result.output;
}

// Every strategy trains it to the same losses, zero3 through its units.
TEST(@CLASS@Test, EveryStrategyAgrees) {
  const std::string steps = "--set training.steps=5";
  ASSERT_EQ(run_trainer("run " + write_recipe("model-ddp", kRecipe) + " " + steps).status, 0);
  for (const char* strategy : {"zero1", "zero2", "zero3"}) {
    const std::string name = std::string("model-") + strategy;
    const TrainerResult result =
        run_trainer("run " + write_recipe(name, kRecipe) + " " + steps + " --set strategy.name=" + strategy);
    ASSERT_EQ(result.status, 0) << result.output;
    const std::vector<double> reference = losses("model-ddp"), loss = losses(name);
    ASSERT_EQ(loss.size(), reference.size());
    for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss[i], reference[i], 1e-5 * reference[i]) << strategy;
  }
}
