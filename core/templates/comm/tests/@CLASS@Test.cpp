#include <gtest/gtest.h>

#include "Run.h"

const std::string kRecipe = std::string(kSmallRun) + "micro_batch_size = 2\ngrad_accum_steps = 2\n[distributed]\nnproc = 2\n";

// At two ranks a sum is the same whichever rank's term comes first, so the
// losses equal gloo's bit for bit: ddp uses all-reduce, zero3 reduce-scatter
// and all-gather.
TEST(@CLASS@Test, TrainsAsGlooDoes) {
  for (const char* strategy : {"ddp", "zero3"}) {
    const std::string set = std::string(" --set strategy.name=") + strategy;
    const std::string gloo = std::string("gloo-") + strategy, mine = std::string("@NAME@-") + strategy;
    const TrainerResult reference = run_trainer("run " + write_recipe(gloo, kRecipe) + set);
    ASSERT_EQ(reference.status, 0) << reference.output;
    const TrainerResult result =
        run_trainer("run " + write_recipe(mine, kRecipe) + set + " --set distributed.backend=@NAME@");
    ASSERT_EQ(result.status, 0) << result.output;
    ASSERT_EQ(losses(mine).size(), 4u) << result.output;
    EXPECT_EQ(losses(mine), losses(gloo)) << strategy;
  }
}
