#include <gtest/gtest.h>

#include "Run.h"

TEST(@CLASS@Test, AModelLearnsIt) {
  const std::string recipe = write_recipe("dataset", R"(
[model]
name = 'qwen2'
vocab_size = 64
[dataset]
name = '@NAME@'
vocab_size = 64
[training]
steps = 30
micro_batch_size = 4
[optimizer]
lr = 1e-2
)");
  const TrainerResult result = run_trainer("run " + recipe);
  ASSERT_EQ(result.status, 0) << result.output;
  const std::vector<double> loss = losses("dataset");
  ASSERT_EQ(loss.size(), 30u) << result.output;
  EXPECT_LT(loss.back(), 0.5 * loss.front()) << "counting is learnable: the loss should fall";
}

TEST(@CLASS@Test, RefusesABadKey) {
  const std::string recipe = write_recipe("dataset-bad", "[model]\nname = 'qwen2'\n[dataset]\nname = '@NAME@'\n"
                                                         "seq_len = 0\n");
  const TrainerResult result = run_trainer("validate " + recipe);
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("seq_len"), std::string::npos) << result.output;
}
