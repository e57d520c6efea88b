// Checkpoints: exact resume for every strategy, resharding across strategy
// and world size, a crash while writing, a corrupt shard, and SIGTERM.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {
namespace {

// Quickstart (global batch 8) with `strategy` at `world` ranks.
std::string setup(const std::string& strategy, int world) {
  return " --set strategy.name=" + strategy + " --set training.micro_batch_size=" + std::to_string(8 / world) +
         " --nproc " + std::to_string(world);
}

void run_ok(const std::string& dir, const std::string& args) {
  const auto result = trainer("run " + kQuickstart + " --set run.output_dir=" + dir + " " + args);
  ASSERT_EQ(result.exit_code, 0) << args << "\n" << result.output;
}

TEST(Checkpoint, ExactResumeForEveryStrategyAtWorldSizeTwo) {
  for (const std::string& strategy : kStrategies) {
    const std::string straight = scratch_dir("CkStraight_" + strategy);
    const std::string resumed = scratch_dir("CkResumed_" + strategy);
    run_ok(straight, "--set training.steps=8" + setup(strategy, 2));
    run_ok(resumed, "--set training.steps=4 --set checkpoint.interval=4" + setup(strategy, 2));
    run_ok(resumed, "--set training.steps=8 --set checkpoint.resume=auto" + setup(strategy, 2));
    const auto same = trainer("compare --rtol 0 " + straight + " " + resumed);
    EXPECT_EQ(same.exit_code, 0) << strategy << "\n" << same.output;
    EXPECT_EQ(read_metrics(resumed + "/metrics.jsonl").size(), 8u) << strategy;
    EXPECT_EQ(read_file(straight + "/summary.json"), read_file(resumed + "/summary.json")) << strategy;
    EXPECT_EQ(read_file(straight + "/model.safetensors"), read_file(resumed + "/model.safetensors")) << strategy;
  }
}

// tests/data/checkpoint-format3-adamw holds a checkpoint written before
// optimizers were plugins (step 2 of its recipe; no "state" in the
// manifest). It resumes as AdamW's state, and steps 3 and 4 are the bits
// of an uninterrupted run; an optimizer with other state refuses it by name.
TEST(Checkpoint, AnAdamWCheckpointOfBeforeOptimizerPluginsResumesBitForBit) {
  const std::string data = std::string(TRAINER_SOURCE_DIR) + "/tests/data/checkpoint-format3-adamw";
  const std::string dir = scratch_dir("CkFormat3");
  std::string recipe = read_file(data + "/recipe.toml");
  recipe.replace(recipe.find("OUTPUT"), 6, dir + "/straight");
  write_file(dir + "/recipe.toml", recipe);
  auto result = trainer("run " + dir + "/recipe.toml --set training.steps=4 --set checkpoint.interval=0");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string resume = " --set checkpoint.resume=" + data + "/step-00000002";
  result = trainer("run " + dir + "/recipe.toml --set training.steps=4 --set checkpoint.interval=0" + resume +
                   " --set run.output_dir=" + dir + "/resumed");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<MetricsRow> straight = read_metrics(dir + "/straight/metrics.jsonl");
  const std::vector<MetricsRow> resumed = read_metrics(dir + "/resumed/metrics.jsonl");
  ASSERT_EQ(straight.size(), 4u);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i].at("step"), straight[i + 2].at("step"));
    EXPECT_EQ(resumed[i].at("loss"), straight[i + 2].at("loss"));
    EXPECT_EQ(resumed[i].at("grad_norm"), straight[i + 2].at("grad_norm"));
  }
  EXPECT_EQ(read_file(dir + "/straight/model.safetensors"), read_file(dir + "/resumed/model.safetensors"));
  result = trainer("run " + dir + "/recipe.toml --set training.steps=4 --set optimizer.name=lion" + resume +
                   " --set run.output_dir=" + dir + "/lion");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("step-00000002/manifest.json"), std::string::npos) << result.output;
}

TEST(Checkpoint, ResumesUnderAnotherStrategyAndWorldSize) {
  const std::vector<std::tuple<std::string, int, std::string, int>> cases = {
      {"zero3", 4, "zero1", 2}, {"zero2", 2, "zero3", 4}, {"zero1", 2, "ddp", 1}};
  for (const auto& [from, from_world, to, to_world] : cases) {
    const std::string name = from + std::to_string(from_world) + "_" + to + std::to_string(to_world);
    const std::string straight = scratch_dir("CkReshardStraight_" + name);
    const std::string moved = scratch_dir("CkReshard_" + name);
    run_ok(straight, "--set training.steps=8" + setup(from, from_world));
    run_ok(moved, "--set training.steps=4 --set checkpoint.interval=4" + setup(from, from_world));
    run_ok(moved, "--set training.steps=8 --set checkpoint.resume=auto" + setup(to, to_world));
    // Same samples and state; fp32 sums in another order after the move.
    const auto close = trainer("compare --rtol 1e-5 " + straight + " " + moved);
    EXPECT_EQ(close.exit_code, 0) << name << "\n" << close.output;
  }
}

TEST(Checkpoint, ExportsACheckpointWrittenAtAnyWorldSize) {
  const std::string dir = scratch_dir("CkExport");
  run_ok(dir, "--set training.steps=4 --set checkpoint.interval=4" + setup("zero3", 4));
  const std::string hf = dir + "/hf";
  const auto exported = trainer("export " + dir + "/checkpoints/step-00000004 --to " + hf);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  // The same weights as the run's own consolidated file (both fp32, the same step).
  EXPECT_EQ(read_file(hf + "/model.safetensors").size(), read_file(dir + "/model.safetensors").size());
  const std::string tokens = testing::write_file(dir + "/tokens.txt", "3 1 4 1 5 9\n");
  const auto a = trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf + " --tokens " + tokens + " --out " +
                         dir + "/a.bin");
  const auto b = trainer("forward " + kQuickstart + " --set model.init_from=" + dir + "/model.safetensors --tokens " +
                         tokens + " --out " + dir + "/b.bin");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(read_file(dir + "/a.bin"), read_file(dir + "/b.bin"));
}

TEST(Checkpoint, CrashWhileWritingLosesNothing) {
  const std::string straight = scratch_dir("CkCrashStraight");
  const std::string crashed = scratch_dir("CkCrash");
  const std::string args = "--set lr_schedule.name=constant --set checkpoint.interval=3 --set checkpoint.keep=5";
  run_ok(straight, "--set training.steps=9 " + args);
  run_ok(crashed, "--set training.steps=6 " + args);  // checkpoints at 3 and 6
  const auto died = run_command("TRAINER_FAULT_INJECT=checkpoint-write " + std::string(TRAINER_BINARY) + " run " +
                                kQuickstart + " --set run.output_dir=" + crashed + " --set training.steps=9 " + args +
                                " --set checkpoint.resume=auto");
  EXPECT_EQ(died.exit_code, 9) << died.output;  // died writing step 9's checkpoint
  EXPECT_TRUE(std::filesystem::exists(crashed + "/checkpoints/step-00000009.tmp"));
  const auto resumed = trainer("run " + kQuickstart + " --set run.output_dir=" + crashed + " --set training.steps=9 " +
                               args + " --set checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(
      resumed.output.find("step-00000009.tmp: an incomplete checkpoint (a run stopped while writing it); removed"),
      std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + crashed + "/checkpoints/step-00000006"), std::string::npos);
  EXPECT_EQ(trainer("compare --rtol 0 " + straight + " " + crashed).exit_code, 0);
}

TEST(Checkpoint, CorruptShardIsNamedAndAutoFallsBack) {
  const std::string dir = scratch_dir("CkCorrupt");
  run_ok(dir, "--set training.steps=4 --set checkpoint.interval=2");
  const std::string shard = dir + "/checkpoints/step-00000004/rank-00000.safetensors";
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(1000);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x10;
    file.seekp(1000);
    file.write(&byte, 1);
  }
  const auto named = trainer("run " + kQuickstart + " --set run.output_dir=" + dir + " --set training.steps=6 " +
                             "--set checkpoint.resume=" + dir + "/checkpoints/step-00000004");
  EXPECT_EQ(named.exit_code, 2) << named.output;
  EXPECT_NE(named.output.find(shard + ": checksum"), std::string::npos) << named.output;
  EXPECT_NE(named.output.find("(the file is corrupt)"), std::string::npos) << named.output;
  // A copy kept aside under another name is no checkpoint of the run's: "auto" orders step-N by N and neither
  // resumes nor prunes a step-00000002.keep (by name it sorted after step-00000002 and was resumed first).
  std::filesystem::copy(dir + "/checkpoints/step-00000002", dir + "/checkpoints/step-00000002.keep",
                        std::filesystem::copy_options::recursive);
  const auto fallback = trainer("run " + kQuickstart + " --set run.output_dir=" + dir +
                                " --set training.steps=6 --set checkpoint.resume=auto");
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("step-00000004 is not usable"), std::string::npos) << fallback.output;
  EXPECT_NE(fallback.output.find("resumed from " + dir + "/checkpoints/step-00000002 (step 2"), std::string::npos)
      << fallback.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step-00000002.keep/manifest.json"));
}

// config.json beside the shards is checksummed in the manifest: export (which
// copies it into a Hugging Face directory) and resume refuse a damaged one
// by name, and export writes nothing. The edit keeps it valid JSON.
TEST(Checkpoint, DamagedConfigIsNamedAndNotExported) {
  const std::string dir = scratch_dir("CkConfig");
  run_ok(dir, "--set training.steps=2 --set checkpoint.interval=2");
  const std::string checkpoint = dir + "/checkpoints/step-00000002";
  const std::string config = checkpoint + "/config.json";
  const size_t at = read_file(config).find("\"vocab_size\": 64");
  ASSERT_NE(at, std::string::npos) << read_file(config);
  {
    std::fstream file(config, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(at + 15));  // 64 -> 65
    file.put('5');
  }
  const auto exported = trainer("export " + checkpoint + " --to " + dir + "/hf");
  EXPECT_EQ(exported.exit_code, 2) << exported.output;
  EXPECT_NE(exported.output.find(config + ": checksum"), std::string::npos) << exported.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/hf/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/hf/config.json"));
  const auto resumed = trainer("run " + kQuickstart + " --set run.output_dir=" + dir +
                               " --set training.steps=4 --set checkpoint.resume=" + checkpoint);
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_NE(resumed.output.find(config + ": checksum"), std::string::npos) << resumed.output;
}

// Starts `trainer run quickstart` with `args` (and an endless step count)
// writing into `dir`, sends SIGTERM once metrics.jsonl holds a few steps,
// and returns the step of the checkpoint it wrote; the exit status must be
// 75 (stopped, resumable). -1 where no checkpoint was written.
int64_t stop_with_sigterm(const std::string& dir, const std::vector<std::string>& args) {
  std::vector<std::string> words{TRAINER_BINARY,
                                 "run",
                                 kQuickstart,
                                 "--set",
                                 "run.output_dir=" + dir,
                                 "--set",
                                 "training.steps=100000",
                                 "--set",
                                 "lr_schedule.name=constant"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  const pid_t run = fork();
  if (run == 0) {
    const int fd = open((dir + "/log.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(TRAINER_BINARY, argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(dir + "/metrics.jsonl").size() < 400 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(run, SIGTERM);
  int status = 0;
  waitpid(run, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 75) << status << "\n" << read_file(dir + "/log.txt");
  std::string checkpoint;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    if (entry.path().filename().string().rfind("step-", 0) == 0) checkpoint = entry.path().string();
  }
  if (checkpoint.empty()) return -1;
  return json_parse(read_file(checkpoint + "/manifest.json")).at("step").get<int64_t>();
}

TEST(Checkpoint, SigtermWritesACheckpointAndResumeMatches) {
  const std::string dir = scratch_dir("CkSigterm");
  const int64_t stopped = stop_with_sigterm(dir, {"--nproc", "2", "--set", "training.micro_batch_size=4"});
  ASSERT_GT(stopped, 0) << read_file(dir + "/log.txt");
  const std::string total = std::to_string(stopped + 3);
  run_ok(dir,
         "--set training.micro_batch_size=4 --nproc 2 --set lr_schedule.name=constant --set checkpoint.resume=auto "
         "--set training.steps=" +
             total);
  const std::string straight = scratch_dir("CkSigtermStraight");
  run_ok(straight,
         "--set training.micro_batch_size=4 --nproc 2 --set lr_schedule.name=constant --set training.steps=" + total);
  const auto same = trainer("compare --rtol 0 " + straight + " " + dir);
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

// One rank reads its stop flag without waiting for the device, and a step's
// record waits for the step's time: the stop still checkpoints the step in
// flight and logs every step up to it, in order.
TEST(Checkpoint, SigtermAtOneRankCheckpointsAndLogsEveryStepBeforeIt) {
  const std::string dir = scratch_dir("CkSigtermOne");
  const int64_t stopped = stop_with_sigterm(dir, {});
  ASSERT_GT(stopped, 0) << read_file(dir + "/log.txt");
  const std::vector<MetricsRow> rows = read_metrics(dir + "/metrics.jsonl");
  ASSERT_EQ(static_cast<int64_t>(rows.size()), stopped) << read_file(dir + "/log.txt");
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].at("step"), static_cast<double>(i + 1));
}

}  // namespace
}  // namespace trainer
