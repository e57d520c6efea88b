// Several processes: the same global batch trains the same at 1 and 2 ranks;
// communication latency changes no bits; a dead worker ends the job naming its rank with no worker left behind; a
// busy port and mismatched recipes are clear errors.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "TestSupport.h"

namespace trainer {
namespace {

const auto& losses = testing::quickstart_losses;

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - b[i]), rtol * std::abs(b[i])) << what << " step " << i + 1;
  }
}

TEST(Distributed, TwoRanksTrainLikeOneProcess) {
  const std::string steps = "--set training.steps=20 ";  // enough for the sums to part if they differ
  const std::vector<double> one = losses("Dist1", steps + "--set training.micro_batch_size=8");
  // Same global batch of 8: 4 per rank, or 2 per micro-step x 2 accumulation
  // steps with per-parameter buckets reduced during backward.
  const std::vector<double> two = losses("Dist2", steps + "--set training.micro_batch_size=4 --nproc 2");
  const std::string accumulated = steps +
                                  "--set training.micro_batch_size=2 --set training.grad_accum_steps=2 "
                                  "--set strategy.bucket_mb=0.01 --nproc 2";
  const std::vector<double> overlapped = losses("Dist2Overlap", accumulated);  // overlap is the default
  // fp32 sums in another order (per rank, then across ranks); seen ~1e-7.
  expect_close(two, one, 1e-5, "2 ranks");
  expect_close(overlapped, one, 1e-5, "2 ranks, overlap");
  // Overlap changes when each bucket's all-reduce starts, never what it sums: the same bits, in fp32 and in bf16.
  EXPECT_EQ(losses("Dist2AtTheBoundary", accumulated + " --set strategy.overlap=false"), overlapped);
  const std::vector<double> bf16 = losses("Dist2Bf16Overlap", accumulated + " --set strategy.reduce_dtype=bf16");
  EXPECT_EQ(
      losses("Dist2Bf16AtTheBoundary", accumulated + " --set strategy.reduce_dtype=bf16 --set strategy.overlap=false"),
      bf16);
  expect_close(bf16, one, 1e-2, "2 ranks, bf16 all-reduce");  // bf16 sums: 8 significant bits
}

// A simulated network (tests/fixtures/DelayedComm.cpp: every collective
// completes 20 ms after it starts, however early it is waited for) changes
// when results arrive, never what they are: each strategy trains the same
// bits over it as over plain gloo, overlapping or not.
TEST(Distributed, CommunicationLatencyChangesNoBits) {
  const std::string delayed = std::string(TRAINER_FIXTURE_DIR) + "/comm/trainer-comm-delayed-gloo.so";
  const std::string base =
      "--set training.steps=4 --set training.micro_batch_size=2 --set training.grad_accum_steps=2 "
      "--nproc 2 --set strategy.name=";
  const std::vector<std::pair<std::string, std::string>> strategies = {
      {"ddp_overlap", "ddp --set strategy.bucket_mb=0.02"},
      {"ddp_boundary", "ddp --set strategy.bucket_mb=0.02 --set strategy.overlap=false"},
      {"zero2", "zero2 --set strategy.bucket_mb=0.02"},
      {"zero3", "zero3"},
      {"zero3_prefetch2", "zero3 --set strategy.prefetch=2"},
      {"zero3_no_prefetch", "zero3 --set strategy.prefetch=0"},
      // Hybrid sharding with every rank a replica: the sums across replica
      // groups start during the last backward.
      {"zero2_replicas", "zero2 --set strategy.bucket_mb=0.02 --set strategy.shard_group_size=1"},
      {"zero3_replicas", "zero3 --set strategy.shard_group_size=1"}};
  std::map<std::string, std::vector<double>> plain_of;
  for (const auto& [name, strategy] : strategies) {
    const std::vector<double> plain = losses("Latency_plain_" + name, base + strategy);
    plain_of[name] = plain;
    setenv("TRAINER_COMM_DELAY_MS", "20", 1);
    const std::vector<double> late =
        losses("Latency_delayed_" + name, base + strategy + " --set distributed.backend=" + delayed);
    unsetenv("TRAINER_COMM_DELAY_MS");
    ASSERT_EQ(plain.size(), 4u) << name;
    EXPECT_EQ(late, plain) << name;
  }
  // zero3's prefetch depth changes when parameters arrive, never the sums.
  EXPECT_EQ(plain_of["zero3_prefetch2"], plain_of["zero3"]);
  EXPECT_EQ(plain_of["zero3_no_prefetch"], plain_of["zero3"]);
}

TEST(Distributed, KilledWorkerEndsTheJobNamingTheRank) {
  const std::string dir = scratch_dir("DistKill");
  const std::string log = dir + "/log.txt";
  const pid_t launcher = fork();
  if (launcher == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const std::string out = "run.output_dir=" + dir;
    execl(TRAINER_BINARY, TRAINER_BINARY, "run", kQuickstart.c_str(), "--nproc", "2", "--set", out.c_str(), "--set",
          "training.steps=100000", "--set", "distributed.timeout_s=20", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until training runs, then find rank 1 among the launcher's children.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(dir + "/metrics.jsonl").size() < 10 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<pid_t> workers;
  for (const std::string& line : {run_command("pgrep -P " + std::to_string(launcher)).output}) {
    std::stringstream in(line);
    for (pid_t pid; in >> pid;) workers.push_back(pid);
  }
  ASSERT_EQ(workers.size(), 2u) << read_file(log);
  pid_t rank1 = -1;
  for (pid_t pid : workers) {
    std::stringstream environ(read_file("/proc/" + std::to_string(pid) + "/environ"));
    for (std::string variable; std::getline(environ, variable, '\0');) {
      if (variable == "RANK=1") rank1 = pid;
    }
  }
  ASSERT_NE(rank1, -1);
  const auto killed_at = std::chrono::steady_clock::now();
  kill(rank1, SIGKILL);
  int status = 0;
  waitpid(launcher, &status, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_LT(seconds, 20.0);  // within distributed.timeout_s
  const std::string output = read_file(log);
  EXPECT_NE(output.find("rank 1 was killed by signal 9"), std::string::npos) << output;
  for (pid_t pid : workers) EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " still alive";
}

TEST(Distributed, BusyPortIsAClearError) {
  int listener = -1;
  const int port = listening_port(&listener);
  const std::string dir = scratch_dir("DistPort");
  const auto result = run_command("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                                  " " + TRAINER_BINARY + " run " + kQuickstart + " --set run.output_dir=" + dir +
                                  " --set distributed.timeout_s=10");
  close(listener);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("cannot listen on MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << result.output;
}

// Rank 0 takes a free port (MASTER_PORT=0) and logs it; rank 1 is started
// with it. Their recipes differ: each says so, exit 2.
TEST(Distributed, MismatchedRecipesAreAClearError) {
  const std::string dir = scratch_dir("DistMismatch");
  const std::vector<std::string> run = {
      TRAINER_BINARY, "run", kQuickstart, "--set", "run.output_dir=" + dir, "--set", "distributed.timeout_s=20"};
  std::vector<std::string> rank0 = run;
  rank0.insert(rank0.end(), {"--set", "training.steps=3"});
  Job first(rank0, dir + "/r0", {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=0"});
  const std::string marker = "hosts the rendezvous at 127.0.0.1:";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(dir + "/r0").find(marker) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string log0 = read_file(dir + "/r0");
  const size_t at = log0.find(marker);
  ASSERT_NE(at, std::string::npos) << log0;
  const int port = std::stoi(log0.substr(at + marker.size()));
  std::vector<std::string> rank1 = run;
  rank1.insert(rank1.end(), {"--set", "training.steps=4"});
  Job second(rank1, dir + "/r1",
             {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)});
  EXPECT_EQ(first.wait(), 2) << read_file(dir + "/r0");
  EXPECT_EQ(second.wait(), 2) << read_file(dir + "/r1");
  for (const char* rank : {"/r0", "/r1"}) {
    EXPECT_NE(read_file(dir + rank).find("differs from rank"), std::string::npos) << read_file(dir + rank);
  }
}

}  // namespace
}  // namespace trainer
