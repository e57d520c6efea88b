// The accumulation contract, enforced: every strategy plugin passes the kit
// at every split of the global batch, and the kit rejects accumulators that
// are wrong in the ways popular frameworks have been.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <torch/cuda.h>

#include "TestSupport.h"

namespace trainer {
namespace {

struct Case {
  std::string strategy;
  std::string split;  // micro,accum,world
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.strategy << " " << c.split; }

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  std::string split = info.param.split;
  for (char& c : split) c = c == ',' ? 'x' : c;
  return info.param.strategy + "_" + split;
}

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, MatchesTheFp64Reference) {
  const Case& c = GetParam();
  const std::string dir = scratch_dir("Conformance_" + name_of({c, 0}));
  const auto result =
      trainer("check-plugin " + c.strategy + " --split " + c.split + " --report " + dir + "/report.jsonl");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
  int world = 0;
  ASSERT_GE(std::sscanf(c.split.c_str(), "%*d,%*d,%d", &world), 1) << c.split;
  ASSERT_EQ(static_cast<int>(rows.size()), world);
  for (const MetricsRow& row : rows) {
    // Tolerances of the contract (origin in core/src/kit/Checks.cpp).
    EXPECT_LE(row.at("grad_error"), 1e-5) << "rank " << row.at("rank");
    EXPECT_LE(row.at("norm_error"), 1e-5) << "rank " << row.at("rank");
    EXPECT_LE(row.at("param_error"), 1e-4) << "rank " << row.at("rank");
    // Reproducible mode's exact sum: as close to fp64 as the plain one.
    EXPECT_GE(row.at("reproducible_error"), 0.0) << "rank " << row.at("rank");
    EXPECT_LE(row.at("reproducible_error"), 1e-5) << "rank " << row.at("rank");
    // World size 1: the same arithmetic as ddp, so the same bits.
    if (world == 1) {
      EXPECT_EQ(row.at("identical_to_ddp"), 1.0);
    }
    // The final weights, consolidated from every rank (replicas included).
    if (row.at("rank") == 0) {
      EXPECT_LE(row.at("final_weights_error"), 1e-4);
    }
    EXPECT_EQ(row.at("checkpoint_saved"), 1.0) << "rank " << row.at("rank");
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const std::string& strategy : kStrategies) {
    for (const char* split : {"8,1,1", "2,4,1", "1,8,1", "4,1,2", "2,2,2", "1,2,4"}) cases.push_back({strategy, split});
    // Hybrid sharding: world size 4 in shard groups of 2, and every rank a
    // replica (groups of 1).
    if (std::string(strategy) != "ddp") {
      for (const char* split : {"1,2,4,2", "2,2,2,1"}) cases.push_back({strategy, split});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Strategies, Conformance, ::testing::ValuesIn(all_cases()), name_of);

// bf16 compute, 16 accumulation steps: the accumulated gradient stays within
// what fp32 accumulation of the bf16 micro-gradients can err by (the bound's
// derivation is in core/src/kit/Checks.cpp).
TEST(ConformanceBf16, AccumulationStaysWithinTheFp32Bound) {
  for (const std::string& strategy : kStrategies) {
    const std::string dir = scratch_dir("ConformanceBf16_" + strategy);
    const auto result = trainer("check-plugin " + strategy + " --split 8,1,1 --bf16 --report " + dir + "/report.jsonl");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const MetricsRow row = read_metrics(dir + "/report.jsonl").at(0);
    EXPECT_GE(row.at("bf16_error"), 0.0) << strategy;
    EXPECT_LE(row.at("bf16_error"), row.at("bf16_bound")) << strategy;
    EXPECT_LT(row.at("bf16_bound"), 1e-5) << strategy;  // (16 - 1) * 2^-24 * spread, about 2e-6 here
  }
}

// The kit can fail: each broken accumulator is caught, by a wide margin, at
// a split that exposes it.
TEST(ConformanceNegativeControl, BrokenAccumulatorsFail) {
  const std::string fixtures = std::string(TRAINER_FIXTURE_DIR) + "/strategies/";
  for (const auto& [name, split] : std::vector<std::pair<std::string, std::string>>{{"last-micro-only", "2,4,1"},
                                                                                    {"mean-of-means", "1,8,1"},
                                                                                    {"double-division", "2,4,1"},
                                                                                    {"mean-of-means", "2,2,2"}}) {
    const std::string dir = scratch_dir("ConformanceBroken_" + name);
    const auto result = trainer("check-plugin " + fixtures + "trainer-strategy-" + name + ".so --split " + split +
                                " --report " + dir + "/report.jsonl");
    EXPECT_EQ(result.exit_code, 1) << name << "\n" << result.output;
    const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
    ASSERT_FALSE(rows.empty()) << name;
    EXPECT_GT(rows[0].at("grad_error"), 1e-2) << name;
  }
  // A bf16 accumulator: fine in fp32, caught by the bf16 check.
  const std::string dir = scratch_dir("ConformanceBroken_bf16");
  const auto result = trainer("check-plugin " + fixtures +
                              "trainer-strategy-bf16-accumulator.so --split 8,1,1 --bf16 "
                              "--report " +
                              dir + "/report.jsonl");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  const MetricsRow row = read_metrics(dir + "/report.jsonl").at(0);
  EXPECT_LE(row.at("grad_error"), 1e-5);
  EXPECT_GT(row.at("bf16_error"), 100 * row.at("bf16_bound"));
}

// The optimizer plugins through the kit: under every strategy at world
// sizes 1 and 4 (hybrid too) against an fp64 run of their own update, the
// same bits as ddp at world size 1, every parameter moved as the
// reference's, the state through checkpoints across world sizes and
// strategies, and a resumed step bit for bit. (`trainer check-plugin muon`
// runs every default split: README, Optimizers; here a subset, for time.)
// `loaded`: rows that loaded the previous split's checkpoint (every split
// but the very first: across world sizes, and across strategies).
// `tag` names the scratch directory: tests that ctest runs side by side
// must not share one.
void expect_optimizer_passes(const std::string& tag, const std::string& optimizer, const std::string& arguments,
                             size_t expected_rows, size_t loaded) {
  const std::string dir = scratch_dir("ConformanceOptimizer_" + tag + "_" + optimizer);
  const auto result = trainer("check-plugin " + optimizer + " " + arguments + " --report " + dir + "/report.jsonl");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
  ASSERT_EQ(rows.size(), expected_rows) << optimizer;
  size_t loaded_rows = 0;
  for (const MetricsRow& row : rows) {
    EXPECT_NE(row.at("checkpoint_loaded"), 0.0) << optimizer;
    loaded_rows += row.at("checkpoint_loaded") == 1.0 ? 1 : 0;
    EXPECT_LE(row.at("param_error"), 1e-4) << optimizer;
    EXPECT_EQ(row.at("resumed_identical"), 1.0) << optimizer;
    if (row.at("world") == 1) {
      EXPECT_EQ(row.at("identical_to_ddp"), 1.0) << optimizer;
    }
    if (row.at("rank") == 0) {
      EXPECT_EQ(row.at("unchanged_parameters"), 0.0) << optimizer;
      EXPECT_EQ(row.at("wrong_parameters"), 0.0) << optimizer;
    }
  }
  EXPECT_EQ(loaded_rows, loaded) << optimizer;
}

TEST(ConformanceOptimizers, MuonAndLionPassUnderEveryStrategy) {
  // ddp has no hybrid split: 1 + 4 rows; each ZeRO stage 1 + 4 + 4.
  expect_optimizer_passes("every-strategy", "muon", "--split 2,4,1 --split 1,2,4 --split 1,2,4,2", 5u + 3 * 9u,
                          5u + 3 * 9u - 1);
  expect_optimizer_passes("every-strategy", "lion", "--strategy zero2 --split 2,2,2", 2u, 0u);
}

// Muon's matrices split across four shards: the whole-matrix path's
// all-reduce, at one split (this one also runs under the sanitizers).
TEST(ConformanceOptimizers, MuonUnderZero3AtWorldSizeFour) {
  expect_optimizer_passes("zero3-world-four", "muon", "--strategy zero3 --split 1,2,4", 4u, 0u);
}

// The optimizer kit can fail: an optimizer that updates rank 0's shard
// only, one that claims a matrix and never moves it, and one that keeps
// state outside its checkpointed state tensors are each caught, by the
// check named after the fault.
TEST(ConformanceOptimizers, BrokenOptimizersFail) {
  const std::string fixtures = std::string(TRAINER_FIXTURE_DIR) + "/optimizers/trainer-optimizer-";
  const auto check = [&](const std::string& name, const std::string& split) {
    const std::string dir = scratch_dir("ConformanceBrokenOptimizer_" + name);
    const auto result = trainer("check-plugin " + fixtures + name + ".so --strategy zero2 --split " + split +
                                " --report " + dir + "/report.jsonl");
    EXPECT_EQ(result.exit_code, 1) << name << "\n" << result.output;
    return read_metrics(dir + "/report.jsonl");
  };
  // Rank 1's shard never moves, so the model rank 0 computes gradients on
  // leaves the reference's after the first step. (Rank 1's own reference
  // runs the same broken code and stays put too: its row alone cannot tell.)
  std::vector<MetricsRow> rows = check("rank0-only", "2,2,2");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_GT(rows[0].at("param_error"), 0.1);
  EXPECT_GT(rows[0].at("wrong_parameters"), 0.0);
  rows = check("skips-a-matrix", "8,1,1");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("unchanged_parameters"), 1.0);
  EXPECT_LE(rows[0].at("param_error"), 1e-4) << "its own reference skips it too: only the count sees it";
  rows = check("hidden-state", "2,2,2");
  ASSERT_EQ(rows.size(), 2u);
  for (const MetricsRow& row : rows) {
    EXPECT_EQ(row.at("resumed_identical"), 0.0);
    EXPECT_EQ(row.at("checkpoint_saved"), 1.0) << "what it does save is saved";
  }
}

// The directories under `tmp`, sorted.
std::vector<std::string> directories_in(const std::string& tmp) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(tmp)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Waits until `check` (a check-plugin run with TMPDIR=tmp) has begun its
// first split in its scratch directory (trainer-conformance-PID-XXXXXX),
// then holds it still (SIGSTOP); that directory, or "" after two minutes.
std::string hold_once_a_split_began(testing::Job& check, const std::string& tmp) {
  const std::string own = "trainer-conformance-" + std::to_string(check.pid()) + "-";
  for (int i = 0; i < 6000; ++i) {  // polled every 20 ms
    for (const std::string& name : directories_in(tmp)) {
      if (name.rfind(own, 0) != 0) continue;
      std::error_code error;
      for (const auto& entry : std::filesystem::directory_iterator(tmp + "/" + name, error)) {
        if (entry.is_directory()) {
          check.signal(SIGSTOP);
          return tmp + "/" + name;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

// --report names a file to write, checked before any work: the plugin under
// test, a directory or a missing directory is exit 2 naming it (the rows
// were lost without a word, or the plugin replaced). The optimizer kit's
// rows per strategy go through a directory of its own: a file beside the
// report named like them (REPORT.ddp once was) is left as it was.
TEST(ConformanceReport, ReportsThatCannotBeWrittenAreRefusedBeforeAnyWork) {
  const std::string dir = scratch_dir("ConformanceReport");
  const std::string plugin = dir + "/trainer-strategy-gradient-copies.so";
  std::filesystem::copy_file(std::string(TRAINER_FIXTURE_DIR) + "/strategies/trainer-strategy-gradient-copies.so",
                             plugin);
  const std::string bytes = read_file(plugin);
  for (const auto& [report, message] : std::vector<std::pair<std::string, std::string>>{
           {plugin, "is the plugin under test"},
           {dir, "is a directory; expected a file to write"},
           {dir + "/missing/report.jsonl", "the directory " + dir + "/missing does not exist"}}) {
    const auto result = trainer("check-plugin " + plugin + " --split 8,1,1 --report " + report);
    EXPECT_EQ(result.exit_code, 2) << report << "\n" << result.output;
    EXPECT_NE(result.output.find("--report " + report + ": " + message), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("conformance of strategy"), std::string::npos) << "it ran first:\n" << result.output;
  }
  EXPECT_EQ(read_file(plugin), bytes);
  const std::string beside = write_file(dir + "/report.jsonl.ddp", "someone's file\n");
  const auto optimizer = trainer("check-plugin adamw --split 8,1,1 --report " + dir + "/report.jsonl");
  ASSERT_EQ(optimizer.exit_code, 0) << optimizer.output;
  EXPECT_EQ(read_file(beside), "someone's file\n");
  const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
  EXPECT_EQ(rows.size(), 4u) << "one split under each of the four strategies";
  // A strategy not found is named before the report is opened: the earlier report stays.
  const std::string earlier = read_file(dir + "/report.jsonl");
  const auto unknown =
      trainer("check-plugin adamw --strategy ddp --strategy nope --split 8,1,1 --report " + dir + "/report.jsonl");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown strategy plugin 'nope'"), std::string::npos) << unknown.output;
  EXPECT_EQ(read_file(dir + "/report.jsonl"), earlier);
  // A worker that ends without its result is a fault of the kit naming the file (exit 1), not bad input;
  // the earlier report stays.
  const auto lost = run_command("TRAINER_FAULT_INJECT=kit-no-report " + std::string(TRAINER_BINARY) +
                                " check-plugin ddp --split 8,1,1 --report " + dir + "/report.jsonl");
  EXPECT_EQ(lost.exit_code, 1) << lost.output;
  EXPECT_NE(lost.output.find("rank0.jsonl: rank 0 of split 8x1x1 ended without its result"), std::string::npos)
      << lost.output;
  EXPECT_EQ(read_file(dir + "/report.jsonl"), earlier);
  // A check stopped part-way (held still once its first split began, then killed) leaves the earlier
  // report whole, and no file of its own beside it: the rows are written once the check ends.
  const std::string tmp = scratch_dir("ConformanceReportTmp");
  testing::Job check({"trainer", "check-plugin", "ddp", "--split", "8,1,1", "--report", dir + "/report.jsonl"},
                     tmp + "/log", {"TMPDIR=" + tmp});
  ASSERT_FALSE(hold_once_a_split_began(check, tmp).empty()) << read_file(tmp + "/log");
  EXPECT_EQ(read_file(dir + "/report.jsonl"), earlier);
  EXPECT_EQ(testing::temporaries_in(dir), std::vector<std::string>{});
  check.signal(SIGKILL);
  check.wait();
  EXPECT_EQ(read_file(dir + "/report.jsonl"), earlier);
  EXPECT_EQ(testing::temporaries_in(dir), std::vector<std::string>{});
}

// A check's scratch directory outlives it only when a signal killed it, and
// then goes with the next check's start. A check beside a running one (held
// still) leaves that one's directory alone (its lock is held) and removes
// its own when it ends; an older build's directory (no lock file) goes once
// an hour old, but not a new one of the kit's names without its lock file
// (its maker may be about to take it) nor one of other names.
TEST(ConformanceScratch, AKilledChecksDirectoryGoesWithTheNextCheckAndARunningOnesStays) {
  const std::string tmp = scratch_dir("ConformanceScratchTmp");
  testing::Job check({"trainer", "check-plugin", "ddp", "--split", "8,1,1"}, tmp + "/log", {"TMPDIR=" + tmp});
  const std::string held = hold_once_a_split_began(check, tmp);
  ASSERT_FALSE(held.empty()) << read_file(tmp + "/log");
  const std::string name = std::filesystem::path(held).filename().string();
  const std::string beside = "TMPDIR=" + tmp + " " + std::string(TRAINER_BINARY) + " check-plugin ddp --split 8,1,1";
  const auto second = run_command(beside);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(directories_in(tmp), std::vector<std::string>{name});
  check.signal(SIGKILL);
  check.wait();
  ASSERT_TRUE(std::filesystem::is_directory(held + "/8x1x1")) << "the killed check's directory stays until the next";
  const auto old = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (const std::string other :
       {"trainer-conformance-1", "trainer-conformance-2", "trainer-conformance-3-abcdef", "trainer-conformance-x"}) {
    std::filesystem::create_directories(tmp + "/" + other + "/8x1x1");
    if (other == "trainer-conformance-1" || other == "trainer-conformance-x") {
      std::filesystem::last_write_time(tmp + "/" + other, old);
    }
  }
  const auto third = run_command(beside);
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_EQ(directories_in(tmp), (std::vector<std::string>{"trainer-conformance-2", "trainer-conformance-3-abcdef",
                                                           "trainer-conformance-x"}));
}

// Reproducible mode in the kit: one gradient, bit for bit, at splits across
// world sizes 1, 2 and 4; and a strategy whose gradient slices are copies
// (the exact sum cannot land in it) fails, in the kit and in a run.
TEST(ConformanceReproducible, OneGradientAtEverySplitAndCopiesFail) {
  const std::string dir = scratch_dir("ConformanceReproducible");
  auto result = trainer("check-plugin zero3 --split 8,1,1 --split 1,8,1 --split 2,2,2 --split 1,2,4 --report " + dir +
                        "/report.jsonl");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
  ASSERT_EQ(rows.size(), 1u + 1u + 2u + 4u);
  for (const MetricsRow& row : rows) {
    EXPECT_EQ(row.at("reproducible_identical"), 1.0) << "world " << row.at("world") << " rank " << row.at("rank");
    EXPECT_LE(row.at("reproducible_error"), 1e-5);
  }
  const std::string plugin = std::string(TRAINER_FIXTURE_DIR) + "/strategies/trainer-strategy-gradient-copies.so";
  result = trainer("check-plugin " + plugin + " --split 8,1,1 --report " + dir + "/copies.jsonl");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("gradient_slices() did not change"), std::string::npos) << result.output;
  EXPECT_EQ(read_metrics(dir + "/copies.jsonl").at(0).at("reproducible_error"), -2.0);
  EXPECT_LE(read_metrics(dir + "/copies.jsonl").at(0).at("grad_error"), 1e-5) << "its plain gradients are right";
  const std::string recipe =
      write_file(dir + "/recipe.toml", "[run]\noutput_dir = '" + dir +
                                           "/run'\n"
                                           "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n"
                                           "[training]\nsteps = 2\nmicro_batch_size = 2\nreproducible = true\n"
                                           "[strategy]\nname = '" +
                                           plugin + "'\n");
  result = trainer("run " + recipe);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("strategy 'gradient-copies': writing into gradient_slices() did not change"),
            std::string::npos)
      << result.output;
}

// A strategy that declares its fast-mode micro-steps replayable from a CUDA
// graph (Strategy::replayable_micro_step) while its gradients move to fresh
// buffers each micro-step fails the kit naming the rule, though its sums
// are right; ddp and zero1, which declare it too, pass the kit's rows above
// (every Conformance.MatchesTheFp64Reference row runs the same check).
TEST(ConformanceNegativeControl, ReplayableMicroStepsWhoseGradientsMoveFail) {
  const std::string plugin = std::string(TRAINER_FIXTURE_DIR) + "/strategies/trainer-strategy-moving-gradients.so";
  // The kit's scratch directory goes on every way out, a split that throws included.
  const std::string temporary = scratch_dir("ConformanceMovingTmp");
  auto result =
      run_command("TMPDIR=" + temporary + " " + TRAINER_BINARY + " check-plugin " + plugin + " --split 2,4,1");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("strategy 'moving-gradients': declares micro-step 0 replayable (replayable_micro_step) "
                               "but a parameter's or its gradient's memory moved"),
            std::string::npos)
      << result.output;
  EXPECT_TRUE(std::filesystem::is_empty(temporary)) << "the kit's scratch directory was left";
  // An optimizer not found is named before the table begins, and leaves nothing either.
  result = run_command("TMPDIR=" + temporary + " " + TRAINER_BINARY + " check-plugin ddp --optimizer nope");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("unknown optimizer plugin 'nope'"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("conformance of strategy"), std::string::npos) << result.output;
  EXPECT_TRUE(std::filesystem::is_empty(temporary)) << "the kit's scratch directory was left";
}

// Slices that break the rule checkpoints and the final weights are built by
// (together the ranks' slices cover every element) fail the kit at world
// size > 1 with the rule named, and a run stops at setup instead of at its
// first checkpoint.
TEST(ConformanceNegativeControl, SlicesThatMissTheirChunkFail) {
  const std::string plugin = std::string(TRAINER_FIXTURE_DIR) + "/strategies/trainer-strategy-wrong-chunk.so";
  EXPECT_EQ(trainer("check-plugin " + plugin + " --split 8,1,1").exit_code, 0) << "one rank holds every chunk";
  auto result = trainer("check-plugin " + plugin + " --split 4,1,2 --timeout 60");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("strategy 'wrong-chunk': no rank's state_slices hold elements ["), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("must cover every element of every group"), std::string::npos) << result.output;
  const std::string dir = scratch_dir("ConformanceWrongChunkRun");
  const std::string recipe =
      write_file(dir + "/recipe.toml", "[run]\noutput_dir = '" + dir +
                                           "/run'\n"
                                           "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n"
                                           "[training]\nsteps = 2\nmicro_batch_size = 2\n[strategy]\nname = '" +
                                           plugin + "'\n[distributed]\nnproc = 2\n");
  result = trainer("run " + recipe);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("no rank's state_slices hold elements ["), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/metrics.jsonl") &&
               std::filesystem::file_size(dir + "/run/metrics.jsonl") > 0)
      << "no step ran";
}

// Beyond gradients: a checkpoint of a strategy that hands out copies of its
// state loads into nothing, caught when the next split loads it (a correct
// one's load across world sizes bit for bit: ConformanceThirdParty below).
TEST(ConformanceNegativeControl, CheckpointsThatDoNotLoadFail) {
  const std::string fixtures = std::string(TRAINER_FIXTURE_DIR) + "/strategies/";
  const std::string dir = scratch_dir("ConformanceStateCopies");
  auto result = trainer("check-plugin " + fixtures +
                        "trainer-strategy-state-copies.so --split 8,1,1 --split 2,4,1 "
                        "--report " +
                        dir + "/bad.jsonl");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  std::vector<MetricsRow> rows = read_metrics(dir + "/bad.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("checkpoint_saved"), 1) << "the copies hold the right values";
  EXPECT_EQ(rows[0].at("checkpoint_loaded"), -1) << "the first split has nothing to load";
  EXPECT_EQ(rows[1].at("checkpoint_loaded"), 0) << result.output;
  EXPECT_LE(rows[1].at("grad_error"), 1e-5) << "its gradients are right";
  EXPECT_NE(result.output.find("8x1x1 loaded WRONG"), std::string::npos) << result.output;
}

// A strategy found only through --plugin-dir, as a third party's is: its
// workers at world size > 1 must find it too.
TEST(ConformanceThirdParty, StrategiesFoundThroughPluginDirAreCheckedAtEveryWorldSize) {
  const std::string fixtures = std::string(TRAINER_FIXTURE_DIR) + "/strategies";
  const std::string dir = scratch_dir("ConformanceThirdParty");
  auto result = trainer("--plugin-dir " + fixtures +
                        " check-plugin plain-allreduce --split 8,1,1 --split 2,2,2 "
                        "--split 1,2,4 --split 4,2,1 --timeout 60 --report " +
                        dir + "/good.jsonl");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const std::vector<MetricsRow> good = read_metrics(dir + "/good.jsonl");
  ASSERT_EQ(good.size(), 1u + 2u + 4u + 1u) << "one row per rank of every split";
  // Its checkpoints: each read back bit for bit, each split's loaded by the
  // next (world size 1 to 2, 2 to 4, 4 to 1), its final weights within 1e-4.
  for (const MetricsRow& row : good) {
    EXPECT_EQ(row.at("checkpoint_saved"), 1);
    if (&row != &good[0]) {
      EXPECT_EQ(row.at("checkpoint_loaded"), 1) << "from world size 1 to 2, 2 to 4, 4 to 1";
    }
    if (row.at("rank") == 0) {
      EXPECT_GE(row.at("final_weights_error"), 0.0);
      EXPECT_LE(row.at("final_weights_error"), 1e-4);
    }
  }
  result = trainer("--plugin-dir " + fixtures + " check-plugin last-micro-only --split 2,2,2 --report " + dir +
                   "/bad.jsonl");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_EQ(result.output.find("unknown strategy plugin"), std::string::npos) << result.output;
  const std::vector<MetricsRow> rows = read_metrics(dir + "/bad.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_GT(rows[0].at("grad_error"), 1e-2);
}

TEST(ConformanceGpu, EveryStrategyOnCudaOverNcclMatchesTheReference) {
#ifdef TRAINER_TESTS_HAVE_CUDA
  if (!torch::cuda::is_available()) FAIL() << "a CUDA build, but this machine shows no CUDA device";
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
  for (const std::string& strategy : kStrategies) {
    const std::string dir = scratch_dir("ConformanceGpu_" + strategy);
    const auto result = trainer("check-plugin " + strategy +
                                " --device cuda --backend nccl --backend-at-one-rank --split 8,1,1 --split 2,4,1 "
                                "--split 1,8,1 --report " +
                                dir + "/report.jsonl");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const std::vector<MetricsRow> rows = read_metrics(dir + "/report.jsonl");
    ASSERT_EQ(rows.size(), 3u);
    for (const MetricsRow& row : rows) {
      EXPECT_LE(row.at("grad_error"), 1e-5) << strategy;
      EXPECT_LE(row.at("param_error"), 1e-4) << strategy;
      EXPECT_EQ(row.at("identical_to_ddp"), 1.0) << strategy;
    }
  }
}

}  // namespace
}  // namespace trainer
