// training.reproducible: every (micro-batch, accumulation, world size,
// strategy) split of a global batch trains the same bits (losses, gradient
// norms, final weights), in fp32 and bf16, and across a stop and a resume
// under another world size and strategy.
#include <gtest/gtest.h>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {
namespace {

struct Split {
  int micro, accum, world;
  std::string text() const { return std::to_string(micro) + "x" + std::to_string(accum) + "x" + std::to_string(world); }
};
const Split kSplits[] = {{8, 1, 1}, {2, 4, 1}, {1, 8, 1}, {4, 1, 2}, {2, 2, 2}, {1, 2, 4}};

std::string split_args(const std::string& strategy, const Split& split) {
  return " --set training.reproducible=true --set strategy.name=" + strategy +
         " --set training.micro_batch_size=" + std::to_string(split.micro) +
         " --set training.grad_accum_steps=" + std::to_string(split.accum) + " --nproc " + std::to_string(split.world);
}

std::string weights_hash(const std::string& dir) {
  return Json::parse(read_file(dir + "/summary.json")).at("parameters_xxh3_128").get<std::string>();
}

// `recipe` with `args` under every strategy and split: `trainer compare
// --rtol 0` agrees on every step's loss and norm, and the final weights'
// hash is one. Both would differ at the 1e-7 level without the mode.
// With `hybrid`, also zero1, zero2 and zero3 at world size 4 in shard
// groups of 2 (hybrid sharding).
void expect_one_result(const std::string& name, const std::string& recipe, const std::string& args,
                       bool hybrid = false) {
  std::vector<std::string> dirs;
  std::vector<std::pair<std::string, std::string>> runs;  // (name, arguments)
  for (const std::string& strategy : kStrategies) {
    for (const Split& split : kSplits) runs.emplace_back(strategy + ("_" + split.text()), split_args(strategy, split));
  }
  for (const char* strategy : {"zero1", "zero2", "zero3"}) {
    if (hybrid) {
      runs.emplace_back(strategy + std::string("_1x2x4g2"),
                        split_args(strategy, {1, 2, 4}) + " --set strategy.shard_group_size=2");
    }
  }
  for (const auto& [run, run_args] : runs) {
    const std::string dir = scratch_dir(name + "_" + run);
    const auto result = trainer("run " + recipe + " --set run.output_dir=" + dir + args + run_args);
    ASSERT_EQ(result.exit_code, 0) << run << "\n" << result.output;
    dirs.push_back(dir);
  }
  std::string all;
  for (const std::string& dir : dirs) all += " " + dir;
  const auto same = trainer("compare --rtol 0" + all);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  for (const std::string& dir : dirs) EXPECT_EQ(weights_hash(dir), weights_hash(dirs.front())) << dir;
}

TEST(Reproducible, QuickstartIsOneResultForEverySplitAndStrategy) {
  expect_one_result("ReproQuick", testing::quickstart_recipe(), " --set training.steps=6", /*hybrid=*/true);
}

TEST(Reproducible, SeedRecipeIsOneResultForEverySplitAndStrategy) {
  // The seed recipe's own global batch is 8 too (2 x 4).
  expect_one_result("ReproSeed", testing::source_path("configs/seed-zero2.toml"), " --set training.steps=6");
}

TEST(Reproducible, Bf16IsOneResultForEverySplitAndStrategy) {
  expect_one_result("ReproBf16", testing::quickstart_recipe(), " --set training.steps=4 --set training.precision=bf16");
}

// bf16 optimizer state: its stochastic rounding draws per element, step
// and state tensor, so the shards that zero1 at two ranks and zero2 and
// zero3 at four (in shard groups of 2 too) cut change no bit.
TEST(Reproducible, Bf16OptimizerStateIsOneResultForEveryCutOfTheShards) {
  const std::string args = " --set training.steps=4 --set training.precision=bf16 --set optimizer.state_dtype=bf16";
  std::vector<std::string> dirs;
  for (const auto& [run, run_args] : std::vector<std::pair<std::string, std::string>>{
           {"ddp_8x1x1", split_args("ddp", {8, 1, 1})},
           {"zero1_4x1x2", split_args("zero1", {4, 1, 2})},
           {"zero2_1x2x4", split_args("zero2", {1, 2, 4})},
           {"zero3_1x2x4g2", split_args("zero3", {1, 2, 4}) + " --set strategy.shard_group_size=2"}}) {
    const std::string dir = scratch_dir("ReproBf16State_" + run);
    const auto result =
        trainer("run " + testing::quickstart_recipe() + " --set run.output_dir=" + dir + args + run_args);
    ASSERT_EQ(result.exit_code, 0) << run << "\n" << result.output;
    dirs.push_back(dir);
  }
  const auto same = trainer("compare --rtol 0 " + dirs[0] + " " + dirs[1] + " " + dirs[2] + " " + dirs[3]);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  for (const std::string& dir : dirs) EXPECT_EQ(weights_hash(dir), weights_hash(dirs.front())) << dir;
}

TEST(Reproducible, ResumedUnderAnotherWorldSizeAndStrategyIsTheSameRun) {
  // The quickstart's 10 warmup steps make the first 8 steps' learning rates
  // independent of training.steps, so a 4-step run is the first half of an 8-step one.
  const std::string recipe = testing::quickstart_recipe();
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string straight = scratch_dir("ReproStraight_" + precision);
    const std::string moved = scratch_dir("ReproMoved_" + precision);
    const std::string common = " --set training.precision=" + precision;
    const auto a = trainer("run " + recipe + " --set run.output_dir=" + straight + " --set training.steps=8" + common +
                           split_args("zero1", {2, 4, 1}));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    // Written by zero3 in shard groups of 2 (hybrid: each shard on two
    // ranks), read by zero2 with every rank a replica, and by ddp.
    const auto b = trainer("run " + recipe + " --set run.output_dir=" + moved +
                           " --set training.steps=4 --set checkpoint.interval=4" + common +
                           split_args("zero3", {1, 2, 4}) + " --set strategy.shard_group_size=2");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    const auto b2 = trainer("run " + recipe + " --set run.output_dir=" + moved +
                            " --set training.steps=6 --set checkpoint.interval=6 --set checkpoint.resume=auto" +
                            common + split_args("zero2", {4, 1, 2}) + " --set strategy.shard_group_size=1");
    ASSERT_EQ(b2.exit_code, 0) << b2.output;
    const auto c =
        trainer("run " + recipe + " --set run.output_dir=" + moved +
                " --set training.steps=8 --set checkpoint.resume=auto" + common + split_args("ddp", {4, 1, 2}));
    ASSERT_EQ(c.exit_code, 0) << c.output;
    // The scales were restored, not measured again: the first step after the
    // resume ran once, as it did in the straight run.
    const std::string rerun = "step 7: gradient scales set";
    EXPECT_EQ(c.output.find(rerun) == std::string::npos, a.output.find(rerun) == std::string::npos) << c.output;
    const auto same = trainer("compare --rtol 0 " + straight + " " + moved);
    EXPECT_EQ(same.exit_code, 0) << precision << "\n" << same.output;
    EXPECT_EQ(weights_hash(straight), weights_hash(moved)) << precision;
  }
}

TEST(Reproducible, LargerAtomsAgreeAcrossSplitsTheyTile) {
  // Atoms of 4 samples: every split whose micro-batch is a multiple of 4.
  std::vector<std::string> dirs;
  for (const auto& [strategy, split] :
       std::vector<std::pair<std::string, Split>>{{"ddp", {8, 1, 1}}, {"zero2", {4, 2, 1}}, {"zero3", {4, 1, 2}}}) {
    dirs.push_back(scratch_dir("ReproAtom4_" + strategy + "_" + split.text()));
    const auto result =
        trainer("run " + testing::quickstart_recipe() + " --set run.output_dir=" + dirs.back() +
                " --set training.steps=6 --set training.reproducible_atom=4" + split_args(strategy, split));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  const auto same = trainer("compare --rtol 0 " + dirs[0] + " " + dirs[1] + " " + dirs[2]);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  for (const std::string& dir : dirs) EXPECT_EQ(weights_hash(dir), weights_hash(dirs.front())) << dir;
  // A split the atom does not tile is refused before training, naming the key.
  const auto refused =
      trainer("run " + testing::quickstart_recipe() + " --set run.output_dir=" + scratch_dir("ReproAtom4Refused") +
              " --set training.reproducible_atom=4" + split_args("ddp", {2, 4, 1}));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("training.reproducible_atom"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("a divisor of training.micro_batch_size = 2"), std::string::npos) << refused.output;
}

TEST(Reproducible, WithoutTheModeSplitsDifferByRounding) {
  // The negative control: the same two splits without the mode do not agree
  // bit for bit (they agree to ~1e-7, TrainingInvarianceTest).
  const std::string one = scratch_dir("NotReproA"), two = scratch_dir("NotReproB");
  const std::string recipe = testing::quickstart_recipe();
  ASSERT_EQ(trainer("run " + recipe + " --set run.output_dir=" + one +
                    " --set training.steps=6 --set training.micro_batch_size=8")
                .exit_code,
            0);
  ASSERT_EQ(trainer("run " + recipe + " --set run.output_dir=" + two +
                    " --set training.steps=6 --set training.micro_batch_size=1 --set training.grad_accum_steps=8")
                .exit_code,
            0);
  EXPECT_NE(weights_hash(one), weights_hash(two));
}

}  // namespace
}  // namespace trainer
