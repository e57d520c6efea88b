// Several ranks on the CPU (gloo): a slow final write that outlasts
// distributed.timeout_s, a stop signal during the final write and during a
// checkpoint, and ranks that see a checkpoint differently. The same paths
// run over nccl in tests/multigpu.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "TestSupport.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

// Waits (up to a minute) for the fault-injection marker a slow write creates.
bool appears(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::vector<std::string> run_args(const std::string& dir, const std::vector<std::string>& more) {
  std::vector<std::string> args = {TRAINER_BINARY,
                                   "run",
                                   kQuickstart,
                                   "--nproc",
                                   "2",
                                   "--set",
                                   "run.output_dir=" + dir,
                                   "--set",
                                   "training.micro_batch_size=4"};
  for (const std::string& m : more) args.insert(args.end(), {"--set", m});
  return args;
}

// Rank 0's final write takes 8 s, distributed.timeout_s is 4: every rank
// waits for it on the host (no collective times out), the launcher stops
// nobody, and the weights equal those of a run without the delay.
TEST(SeveralRanks, SlowFinalWriteOutlastingTheTimeoutEndsWithEveryRankDone) {
  const std::string plain = scratch_dir("SlowFinalPlain"), slow = scratch_dir("SlowFinal");
  const std::vector<std::string> keys = {"training.steps=3", "distributed.timeout_s=4"};
  Job reference(run_args(plain, keys), plain + "/log.txt", {});
  ASSERT_EQ(reference.wait(), 0) << read_file(plain + "/log.txt");
  const std::string marker = slow + "/writing";
  Job job(run_args(slow, keys), slow + "/log.txt",
          {"TRAINER_FAULT_INJECT=slow-final-write", "TRAINER_FAULT_DELAY_S=8", "TRAINER_FAULT_MARKER=" + marker});
  ASSERT_EQ(job.wait(), 0) << read_file(slow + "/log.txt");
  EXPECT_TRUE(fs::exists(marker)) << "the write was not slowed down";
  EXPECT_EQ(temporaries_in(slow), std::vector<std::string>{});
  EXPECT_EQ(read_file(slow + "/model.safetensors"), read_file(plain + "/model.safetensors"));
}

// SIGTERM to the job while rank 0 writes the final weights (longer than the
// launcher's grace of distributed.timeout_s): the write finishes, the log
// says so, and the job ends 0 with whole weights.
TEST(SeveralRanks, StopSignalDuringTheFinalWriteLetsItFinish) {
  const std::string plain = scratch_dir("SignalFinalPlain"), dir = scratch_dir("SignalFinal");
  const std::vector<std::string> keys = {"training.steps=3", "distributed.timeout_s=4"};
  Job reference(run_args(plain, keys), plain + "/log.txt", {});
  ASSERT_EQ(reference.wait(), 0) << read_file(plain + "/log.txt");
  const std::string marker = dir + "/writing";
  Job job(run_args(dir, keys), dir + "/log.txt",
          {"TRAINER_FAULT_INJECT=slow-final-write", "TRAINER_FAULT_DELAY_S=8", "TRAINER_FAULT_MARKER=" + marker});
  ASSERT_TRUE(appears(marker)) << read_file(dir + "/log.txt");
  job.signal(SIGTERM);
  const int code = job.wait();
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("came during the final write; the write was finished first"), std::string::npos) << log;
  EXPECT_EQ(temporaries_in(dir), std::vector<std::string>{}) << log;
  EXPECT_EQ(read_file(dir + "/model.safetensors"), read_file(plain + "/model.safetensors"));
}

// SIGTERM to every worker while rank 0 is inside a checkpoint's save: every
// checkpoint on disk is complete (no .tmp), and the newest resumes.
TEST(SeveralRanks, StopSignalDuringACheckpointLeavesOnlyCompleteOnes) {
  const std::string dir = scratch_dir("SignalSave");
  const std::string marker = dir + "/writing";
  Job job(run_args(dir, {"training.steps=50", "checkpoint.interval=3", "distributed.timeout_s=30"}), dir + "/log.txt",
          {"TRAINER_FAULT_INJECT=slow-checkpoint-write", "TRAINER_FAULT_DELAY_S=2", "TRAINER_FAULT_MARKER=" + marker});
  ASSERT_TRUE(appears(marker)) << read_file(dir + "/log.txt");
  job.signal(SIGTERM);  // forwarded to every worker
  const int code = job.wait();
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_EQ(code, 75) << log;
  int complete = 0;
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints")) {
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << "\n" << log;
    EXPECT_TRUE(fs::exists(entry.path() / "manifest.json")) << entry.path();
    ++complete;
  }
  EXPECT_GE(complete, 1) << log;
  Job resumed(run_args(dir, {"training.steps=8", "checkpoint.resume=auto"}), dir + "/resume.txt", {});
  EXPECT_EQ(resumed.wait(), 0) << read_file(dir + "/resume.txt");
}

// Rank 1 sees every checkpoint file differently from rank 0 (a stale cache,
// injected): with each rank resolving alone, rank 1 would fall back to
// another step than rank 0. Rank 0's choice is the job's, and rank 1 stops
// naming itself and the file instead of loading something else.
TEST(SeveralRanks, RanksThatSeeACheckpointDifferentlyStopNamingIt) {
  const std::string dir = scratch_dir("StaleView");
  Job first(run_args(dir, {"training.steps=4", "checkpoint.interval=2"}), dir + "/log.txt", {});
  ASSERT_EQ(first.wait(), 0) << read_file(dir + "/log.txt");
  Job resumed(run_args(dir, {"training.steps=6", "checkpoint.resume=auto"}), dir + "/resume.txt",
              {"TRAINER_FAULT_INJECT=stale-view"});
  const int code = resumed.wait();
  const std::string log = read_file(dir + "/resume.txt");
  EXPECT_EQ(code, 2) << log;
  EXPECT_NE(log.find("rank 1: " + dir + "/checkpoints/step-00000004/rank-0000"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0 verified this checkpoint: the ranks see it differently"), std::string::npos) << log;
  EXPECT_EQ(log.find("step-00000002"), std::string::npos) << "a rank fell back alone\n" << log;
}

// A model whose parameter use depends on the rank (tests/fixtures/
// SkipLayerModel: odd ranks skip a layer, as an early exit or a mixture of
// experts would with their data). ddp, zero1 and zero2 reduce every bucket in
// bucket order on every rank, so they finish and agree; zero3, whose units
// must run in their declared order (Model.h), refuses it naming the unit.
// Neither hangs (distributed.timeout_s bounds any wait).
TEST(SeveralRanks, AParameterSetThatDependsOnTheRankTrainsOrIsRefusedNeverHangs) {
  const std::string recipe = write_file(scratch_dir("SkipLayerRecipe") + "/skip.toml", R"(
[run]
seed = 5
[model]
name = ")" + std::string(TRAINER_FIXTURE_DIR) + R"(/models/trainer-model-skip-layer.so"
[dataset]
name = "synthetic"
seq_len = 16
vocab_size = 64
[training]
steps = 3
micro_batch_size = 2
grad_accum_steps = 2
[distributed]
nproc = 2
timeout_s = 20
[strategy]
name = "ddp"
)");
  std::map<std::string, std::string> dirs;
  for (const std::string& strategy : kStrategies) {
    const std::string dir = scratch_dir("SkipLayer_" + strategy);
    // A bucket per parameter (1 kB) for the stages that bucket: a skipped
    // layer's bucket sits between buckets both ranks fill.
    const bool buckets = strategy == "ddp" || strategy == "zero2";
    const auto result = trainer("run " + recipe + " --set strategy.name=" + strategy + " --set run.output_dir=" + dir +
                                (buckets ? " --set strategy.bucket_mb=0.001" : ""));
    if (strategy == "zero3") {
      EXPECT_EQ(result.exit_code, 1) << result.output;
      EXPECT_NE(result.output.find("zero3: this rank entered unit 'head' where unit 'second' comes next"),
                std::string::npos)
          << result.output;
      continue;
    }
    ASSERT_EQ(result.exit_code, 0) << strategy << "\n" << result.output;
    dirs[strategy] = dir;
  }
  for (const char* strategy : {"zero1", "zero2"}) {
    // fp32 sums in another order: rounding only.
    const auto close = trainer("compare --rtol 1e-5 " + dirs["ddp"] + " " + dirs[strategy]);
    EXPECT_EQ(close.exit_code, 0) << strategy << "\n" << close.output;
  }
}

// Rank 1 stops itself (SIGSTOP) after step 2: rank 0 times out waiting for
// it, and the job names the stopped rank, not only the one that timed out.
TEST(SeveralRanks, AStoppedRankIsNamed) {
  const std::string dir = scratch_dir("StoppedRank");
  Job job(run_args(dir, {"training.steps=50", "distributed.timeout_s=3"}), dir + "/log.txt",
          {"TRAINER_FAULT_INJECT=stop-rank"});
  const int code = job.wait();
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("rank 1 (pid "), std::string::npos) << log;
  EXPECT_NE(log.find("was stopped by Stopped (signal)"), std::string::npos) << log;
  EXPECT_NE(log.find("rank(s) 1 had been stopped and never answered"), std::string::npos) << log;
}

// A rank started alone in a job of two: it names the rank that never
// joined, with no LibTorch stack trace.
TEST(SeveralRanks, ARankThatNeverJoinsIsNamed) {
  const std::string dir = scratch_dir("NeverJoins");
  const auto result =
      run_command("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=0 " + std::string(TRAINER_BINARY) + " run " +
                  kQuickstart + " --set run.output_dir=" + dir + " --set distributed.timeout_s=2");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("rank(s) 1 of 2 did not join the rendezvous at 127.0.0.1:"), std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("frame #"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace trainer
