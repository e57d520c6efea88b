// Faults while training: a full disk during a checkpoint write, and ranks
// killed at random moments many times over, resumed each time: the end
// result is bit-identical to a run that was never interrupted.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "TestSupport.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

TEST(Faults, DiskFullWhileCheckpointingKeepsEarlierCheckpoints) {
  const std::string straight = scratch_dir("FaultDiskStraight"), dir = scratch_dir("FaultDisk");
  const std::string args = " --set checkpoint.interval=2 --set checkpoint.keep=5 --set training.steps=";
  ASSERT_EQ(trainer("run " + kQuickstart + " --set run.output_dir=" + straight + args + "4").exit_code, 0);
  ASSERT_EQ(trainer("run " + kQuickstart + " --set run.output_dir=" + dir + args + "2").exit_code, 0);
  const auto full = run_command("TRAINER_FAULT_INJECT=disk-full " + std::string(TRAINER_BINARY) + " run " +
                                kQuickstart + " --set run.output_dir=" + dir + args + "4 --set checkpoint.resume=auto");
  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_NE(full.output.find("No space left on device"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("step-00000004.tmp/rank-00000.safetensors"), std::string::npos) << full.output;
  // The checkpoint of step 2 is intact: resuming from it ends where the straight run ends.
  const auto resumed =
      trainer("run " + kQuickstart + " --set run.output_dir=" + dir + args + "4 --set checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/checkpoints/step-00000002"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(trainer("compare --rtol 0 " + straight + " " + dir).exit_code, 0);
  EXPECT_EQ(read_file(straight + "/summary.json"), read_file(dir + "/summary.json"));
}

// The processes whose parent is `parent`, from /proc/PID/stat ("pid (comm) state ppid ...").
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) pids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return pids;
}

// 2 ranks (zero2), a checkpoint every step: killed with SIGKILL at random
// moments (seeded), checkpoint writes included, and resumed with
// resume = "auto" each time, until it completes.
TEST(Faults, ChaosKillsAndResumesEndBitIdentical) {
  const std::string straight = scratch_dir("ChaosStraight"), dir = scratch_dir("Chaos");
  fs::remove(straight + ".log");
  fs::remove(dir + ".log");
  const std::vector<std::string> args = {"--set", "training.steps=200",       "--set",   "training.micro_batch_size=4",
                                         "--set", "strategy.name=zero2",      "--nproc", "2",
                                         "--set", "checkpoint.interval=1",    "--set",   "checkpoint.keep=2",
                                         "--set", "lr_schedule.name=constant"};
  auto command = [&](const std::string& out, bool resume) {
    std::vector<std::string> c = {TRAINER_BINARY, "run", kQuickstart, "--set", "run.output_dir=" + out};
    c.insert(c.end(), args.begin(), args.end());
    if (resume) c.insert(c.end(), {"--set", "checkpoint.resume=auto"});
    return c;
  };
  Job plain(command(straight, false), straight + ".log");
  ASSERT_EQ(plain.wait(), 0) << read_file(straight + ".log");

  std::mt19937 random(20261201);
  std::uniform_int_distribution<int> delay_ms(100, 1500), which(0, 1);
  int kills = 0, runs = 0;
  bool done = false;
  while (!done && runs < 60) {
    const size_t log_before = read_file(dir + ".log").size();
    Job job(command(dir, runs > 0), dir + ".log", {}, /*append=*/true);
    ++runs;
    if (kills < 20) {
      // Once both workers exist, a random moment later, one of them dies.
      std::vector<pid_t> workers;
      for (int tries = 0; tries < 200 && workers.size() < 2; ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
        workers = children_of(job.pid());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(random)));
      if (!workers.empty()) kill(workers[static_cast<size_t>(which(random)) % workers.size()], SIGKILL);
    }
    done = job.wait() == 0;
    // A kill counts when it hit a live worker: the launcher saw it die of it
    // (a worker that had already exited is only reaped, never "killed").
    if (read_file(dir + ".log").find("was killed by signal 9", log_before) != std::string::npos) ++kills;
  }
  std::cout << "chaos: " << kills << " kills over " << runs << " runs\n";  // figures for the record
  ASSERT_TRUE(done) << read_file(dir + ".log");
  EXPECT_GE(kills, 20);
  const auto same = trainer("compare --rtol 0 " + straight + " " + dir);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(read_file(straight + "/summary.json"), read_file(dir + "/summary.json"));
  EXPECT_EQ(read_file(straight + "/model.safetensors"), read_file(dir + "/model.safetensors"));
}

// A tokens file truncated under a running job: the job ends with exit 2
// naming the file and the tokens it could not read (it was SIGBUS through
// a mapping, with no message).
TEST(Faults, ATokensFileTruncatedDuringTheRunIsNamed) {
  const std::string dir = scratch_dir("FaultTruncated");
  std::vector<uint16_t> tokens(200000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 64);
  std::ofstream(dir + "/tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  const std::string recipe =
      write_file(dir + "/recipe.toml", "[run]\noutput_dir = '" + dir +
                                           "/run'\n[model]\nname = 'qwen2'\nvocab_size = 64\nhidden_size = 16\n"
                                           "intermediate_size = 32\nnum_attention_heads = 2\nnum_key_value_heads = 1\n"
                                           "[dataset]\nname = 'tokens'\npath = '" +
                                           dir +
                                           "/tokens.bin'\nseq_len = 16\nvocab_size = 64\n"
                                           "[training]\nsteps = 1000000\nmicro_batch_size = 2\n");
  const std::string log = dir + "/log.txt";
  Job job({TRAINER_BINARY, "run", recipe}, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(dir + "/run/metrics.jsonl").empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(truncate((dir + "/tokens.bin").c_str(), 64), 0);  // 32 tokens: two windows at most
  const int code = job.wait();
  const std::string output = read_file(log);
  EXPECT_EQ(code, 2) << output;  // 128 + 7 with SIGBUS
  EXPECT_NE(output.find(dir + "/tokens.bin: cannot read tokens"), std::string::npos) << output;
  EXPECT_NE(output.find("was it truncated or replaced during the run?"), std::string::npos) << output;
}

}  // namespace
}  // namespace trainer
