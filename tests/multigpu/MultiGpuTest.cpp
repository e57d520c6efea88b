// Several GPUs of one host over nccl (label multigpu, apart from gpu): every
// strategy and hybrid sharding at 2, 4 and 8 ranks against one GPU, each rank
// on its own device, the conformance kit across ranks (Muon's divided
// transforms too), resume across world sizes, reproducible mode's bits at
// every world size and strategy, the fast mode's CUDA graphs at two ranks,
// and a killed rank ending the job. A test that needs more GPUs than the
// machine shows fails (never skips): run the label only where they are.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/cuda.h>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {
namespace {

// Fails the test (not a skip) when fewer than `n` GPUs are visible.
#define REQUIRE_GPUS(n)                                                                                        \
  if (static_cast<int>(torch::cuda::device_count()) < (n)) {                                                   \
    FAIL() << "needs " << (n) << " GPUs, this machine shows " << static_cast<int>(torch::cuda::device_count()) \
           << " (run the multigpu label on a machine with enough, or leave it out: ctest -LE multigpu)";       \
  }

const std::string kOnCuda = " --set run.device=cuda --set distributed.backend=nccl --set distributed.timeout_s=120";

// Quickstart, global batch 8, `steps` steps, with `strategy` at `world` ranks.
std::string job(const std::string& dir, const std::string& strategy, int world, int steps, const std::string& more) {
  return "run " + kQuickstart + kOnCuda + " --set run.output_dir=" + dir + " --set strategy.name=" + strategy +
         " --set training.micro_batch_size=" + std::to_string(8 / world) + " --nproc " + std::to_string(world) +
         " --set training.steps=" + std::to_string(steps) + " " + more;
}

// The devices the ranks said they compute on ("rank R (local rank L) computes on cuda:I").
std::set<std::string> devices_in(const std::string& log) {
  std::set<std::string> devices;
  for (size_t at = log.find("computes on cuda:"); at != std::string::npos; at = log.find("computes on cuda:", at + 1)) {
    devices.insert(log.substr(at + 12, log.find_first_of(" \n", at + 12) - (at + 12)));
  }
  return devices;
}

TEST(MultiGpu, EveryStrategyOnSeveralGpusTrainsLikeOne) {
  REQUIRE_GPUS(8);
  for (const std::string& strategy : kStrategies) {
    const std::string one = scratch_dir("MultiGpu1_" + strategy);
    const auto single = trainer(job(one, strategy, 1, 20, ""));
    ASSERT_EQ(single.exit_code, 0) << single.output;
    for (const int world : {2, 4, 8}) {
      const std::string dir = scratch_dir("MultiGpu" + std::to_string(world) + "_" + strategy);
      const auto result = trainer(job(dir, strategy, world, 20, ""));
      ASSERT_EQ(result.exit_code, 0) << strategy << " at " << world << "\n" << result.output;
      EXPECT_EQ(devices_in(result.output).size(), static_cast<size_t>(world)) << "ranks shared a GPU\n"
                                                                              << result.output;
      // Same samples, fp32 sums in another order.
      const auto close = trainer("compare --rtol 1e-5 " + one + " " + dir);
      EXPECT_EQ(close.exit_code, 0) << strategy << " at " << world << "\n" << close.output;
    }
  }
}

TEST(MultiGpu, HybridShardingOverNcclSubGroups) {
  REQUIRE_GPUS(8);
  const std::string plain = scratch_dir("MultiGpuHybridPlain");
  ASSERT_EQ(trainer(job(plain, "zero3", 8, 10, "")).exit_code, 0);
  for (const char* strategy : {"zero1", "zero2", "zero3"}) {
    for (const int group : {2, 4}) {
      const std::string dir = scratch_dir("MultiGpuHybrid_" + std::string(strategy) + std::to_string(group));
      const auto result =
          trainer(job(dir, strategy, 8, 10, "--set strategy.shard_group_size=" + std::to_string(group)));
      ASSERT_EQ(result.exit_code, 0) << result.output;
      const auto close = trainer("compare --rtol 1e-5 " + plain + " " + dir);
      EXPECT_EQ(close.exit_code, 0) << strategy << " groups of " << group << "\n" << close.output;
    }
  }
}

TEST(MultiGpu, ConformanceKitAcrossRanks) {
  REQUIRE_GPUS(8);
  for (const std::string& strategy : kStrategies) {
    const std::string dir = scratch_dir("MultiGpuKit_" + strategy);
    const auto result = trainer("check-plugin " + strategy +
                                " --device cuda --backend nccl --split 4,1,2 --split 2,2,2 --split 1,2,4 "
                                "--split 1,1,8 --report " +
                                dir + "/report.jsonl");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    for (const MetricsRow& row : read_metrics(dir + "/report.jsonl")) {
      EXPECT_LE(row.at("grad_error"), 1e-5) << strategy;
      EXPECT_LE(row.at("param_error"), 1e-4) << strategy;
    }
  }
}

// Muon under every strategy over nccl, ddp's ranks and hybrid sharding's
// replicas dividing the Newton-Schulz transforms among themselves and
// broadcasting the results: the kit's fp64 reference, every parameter moved
// as the reference's.
TEST(MultiGpu, MuonDividesItsTransformsAcrossReplicas) {
  REQUIRE_GPUS(8);
  const std::string dir = scratch_dir("MultiGpuMuon");
  const auto result =
      trainer("check-plugin muon --device cuda --backend nccl --split 1,2,4 --split 1,1,8 --split 1,1,8,2 --report " +
              dir + "/report.jsonl");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
  ASSERT_FALSE(rows.empty());
  for (const MetricsRow& row : rows) {
    EXPECT_LE(row.at("param_error"), 1e-4);
    if (row.at("rank") == 0) {
      EXPECT_EQ(row.at("unchanged_parameters"), 0.0);
      EXPECT_EQ(row.at("wrong_parameters"), 0.0);
    }
  }
}

TEST(MultiGpu, ResumesAcrossWorldSizes) {
  REQUIRE_GPUS(4);
  const std::string straight = scratch_dir("MultiGpuResumeStraight"), moved = scratch_dir("MultiGpuResume");
  ASSERT_EQ(trainer(job(straight, "zero3", 4, 8, "")).exit_code, 0);
  ASSERT_EQ(trainer(job(moved, "zero3", 4, 4, "--set checkpoint.interval=4")).exit_code, 0);
  const auto resumed = trainer(job(moved, "zero2", 2, 8, "--set checkpoint.resume=auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto close = trainer("compare --rtol 1e-5 " + straight + " " + moved);
  EXPECT_EQ(close.exit_code, 0) << close.output;
}

// training.cuda_graphs in the fast mode at two ranks: ddp replays every
// micro-step but the last of a step (its hooks start the all-reduces), so
// with two accumulation steps the first is replayed and the run trains
// what the eager one does; with one micro-step nothing is replayable and
// the key is refused naming the world size. zero1 (no hooks) replays every
// micro-step at any world size. On windows of a token file: one target
// count a micro-batch, one graph.
TEST(MultiGpu, CudaGraphMicroStepsAtTwoRanksTrainLikeEagerOnes) {
  REQUIRE_GPUS(2);
  const std::string recipe = testing::token_file_quickstart("MultiGpuGraphs_data", 8 * 20);
  ASSERT_FALSE(recipe.empty());
  const auto at_two = [&](const std::string& dir, const std::string& strategy, int accum, bool graphs) {
    return trainer("run " + recipe + kOnCuda + " --set run.output_dir=" + dir + " --set strategy.name=" + strategy +
                   " --nproc 2 --set training.steps=20 --set training.micro_batch_size=" + std::to_string(4 / accum) +
                   " --set training.grad_accum_steps=" + std::to_string(accum) +
                   " --set training.cuda_graphs=" + (graphs ? "true" : "false"));
  };
  for (const auto& [strategy, accum] : std::vector<std::pair<std::string, int>>{{"ddp", 2}, {"zero1", 1}}) {
    const std::string eager = scratch_dir("MultiGpuGraphs_eager_" + strategy);
    const std::string graphs = scratch_dir("MultiGpuGraphs_" + strategy);
    ASSERT_EQ(at_two(eager, strategy, accum, false).exit_code, 0);
    const auto replayed = at_two(graphs, strategy, accum, true);
    ASSERT_EQ(replayed.exit_code, 0) << replayed.output;
    EXPECT_EQ(devices_in(replayed.output).size(), 2u) << replayed.output;
    // Each rank: 20 steps of `accum` micro-steps, ddp's last ones eager; of the replayable ones the first runs
    // eagerly, the second is captured and replayed, and so is every later one.
    const int64_t replays = (strategy == "ddp" ? 20 : 20 * accum) - 1;
    EXPECT_NE(replayed.output.find("training.cuda_graphs: " + std::to_string(replays) + " micro-steps replayed"),
              std::string::npos)
        << strategy << "\n"
        << replayed.output;
    // The same arithmetic launched another way: equal to rounding at most.
    const auto close = trainer("compare --rtol 1e-5 " + eager + " " + graphs);
    EXPECT_EQ(close.exit_code, 0) << strategy << "\n" << close.output;
  }
  const auto refused = at_two(scratch_dir("MultiGpuGraphs_refused"), "ddp", 1, true);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("cuda_graphs: expected false with strategy 'ddp' at world size 2"), std::string::npos)
      << refused.output;
}

// training.reproducible over nccl, each rank on its own GPU: splits of one
// global batch of 8 over 1, 2, 4 and 8 ranks and every strategy train the
// bits of one GPU (losses at every step, the final weights' hash) in fp32,
// bf16, and bf16 with bf16 optimizer state (AdamW's one-pass kernel over
// whatever shards each world size cuts, its stochastic rounding seeded per
// element: no cut may change a bit).
TEST(MultiGpu, ReproducibleModeGivesOneGpusBitsAtEveryWorldSizeAndStrategy) {
  REQUIRE_GPUS(8);
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"fp32", "--set training.precision=fp32"},
      {"bf16", "--set training.precision=bf16"},
      {"bf16state", "--set training.precision=bf16 --set optimizer.state_dtype=bf16"}};
  struct Split {
    std::string strategy;
    int micro, accum, world;
  };
  const std::vector<Split> splits = {
      {"ddp", 8, 1, 1}, {"ddp", 2, 2, 2}, {"zero1", 4, 1, 2}, {"zero2", 1, 2, 4}, {"zero3", 1, 1, 8}};
  for (const auto& [label, settings] : variants) {
    std::string dirs, first_hash;
    for (const Split& split : splits) {
      const std::string name = label + "_" + split.strategy + "_" + std::to_string(split.micro) + "x" +
                               std::to_string(split.accum) + "x" + std::to_string(split.world);
      const std::string dir = scratch_dir("MultiGpuRepro_" + name);
      const auto result = trainer(
          "run " + kQuickstart + kOnCuda + " --set run.output_dir=" + dir + " --set strategy.name=" + split.strategy +
          " --set training.reproducible=true --set training.steps=8 --set training.micro_batch_size=" +
          std::to_string(split.micro) + " --set training.grad_accum_steps=" + std::to_string(split.accum) +
          " --nproc " + std::to_string(split.world) + " " + settings);
      ASSERT_EQ(result.exit_code, 0) << name << "\n" << result.output;
      EXPECT_EQ(devices_in(result.output).size(), static_cast<size_t>(split.world)) << name << ": ranks shared a GPU";
      const std::string hash =
          Json::parse(read_file(dir + "/summary.json")).at("parameters_xxh3_128").get<std::string>();
      if (first_hash.empty()) first_hash = hash;
      EXPECT_EQ(hash, first_hash) << name;
      dirs += " " + dir;
    }
    const auto same = trainer("compare --rtol 0" + dirs);
    EXPECT_EQ(same.exit_code, 0) << label << "\n" << same.output;
  }
}

// TRAINER_FAULT_INJECT=checkpoint-write makes every rank die while writing
// its first checkpoint: the job ends (no hang) naming a rank, and an earlier
// state is never lost.
TEST(MultiGpu, ADeadRankEndsTheJobNamingIt) {
  REQUIRE_GPUS(2);
  const std::string dir = scratch_dir("MultiGpuDeadRank");
  const auto result =
      run_command("TRAINER_FAULT_INJECT=checkpoint-write " + std::string(TRAINER_BINARY) + " " +
                  job(dir, "zero2", 2, 10, "--set checkpoint.interval=2 --set distributed.timeout_s=20"));
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("exited with code 9"), std::string::npos) << result.output;
}

// The overlap benchmark over real NCCL at 8 ranks (bench/overlap_nccl.py):
// overlap on and off give identical losses (it exits 1 otherwise); its step
// times are figures for bench/README, not asserted here.
TEST(MultiGpu, OverlapBenchmarkOverNcclChangesNoBits) {
  REQUIRE_GPUS(8);
  const auto result = run_command("python3 " + source_path("bench/overlap_nccl.py") + " --trainer " +
                                  std::string(TRAINER_BINARY) + " --nproc 8 --layers 4 --hidden 1024 --steps 6");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("| False |"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace trainer
