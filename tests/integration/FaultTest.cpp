// Faults while training: a full disk during a checkpoint write, and ranks
// killed at random moments many times over, resumed each time: the end
// result is bit-identical to a run that was never interrupted.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include "TestSupport.h"

extern char** environ;

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

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
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
  int status = 0;
  const pid_t plain = spawn(command(straight, false), straight + ".log");
  waitpid(plain, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(straight + ".log");

  std::mt19937 random(20261201);
  std::uniform_int_distribution<int> delay_ms(100, 1500), which(0, 1);
  int kills = 0, runs = 0;
  bool done = false;
  while (!done && runs < 60) {
    const pid_t job = spawn(command(dir, runs > 0), dir + ".log");
    ++runs;
    if (kills < 20) {
      // Once both workers exist, a random moment later, one of them dies.
      std::vector<pid_t> workers;
      for (int tries = 0; tries < 200 && workers.size() < 2; ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
        workers = children_of(job);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(random)));
      if (!workers.empty() && kill(workers[static_cast<size_t>(which(random)) % workers.size()], SIGKILL) == 0) {
        ++kills;
      }
    }
    waitpid(job, &status, 0);
    done = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::cout << "chaos: " << kills << " kills over " << runs << " runs\n";  // figures for the record
  ASSERT_TRUE(done) << read_file(dir + ".log");
  EXPECT_GE(kills, 20);
  const auto same = trainer("compare --rtol 0 " + straight + " " + dir);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(read_file(straight + "/summary.json"), read_file(dir + "/summary.json"));
  EXPECT_EQ(read_file(straight + "/model.safetensors"), read_file(dir + "/model.safetensors"));
}

}  // namespace
}  // namespace trainer
