// Rank discovery from launcher variables, and the local multi-process
// launcher: fork/exec of this executable per rank, supervision, teardown.
#include "distributed/Launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "distributed/Rendezvous.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"

namespace trainer {

namespace {

constexpr const char* kWorkerVariable = "TRAINER_WORKER";
constexpr int kExitBadInput = 2;  // the CLI's code for an InputError

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* value = env(name);
  if (!value) return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1 << 24) {
    throw InputError(fmt::format("environment variable {}={}: expected a non-negative integer", name, value));
  }
  return static_cast<int>(parsed);
}

std::atomic<int> g_forward_signal{0};
bool g_forwarded = false;
void remember_signal(int signal) { g_forward_signal.store(signal); }

std::string how_it_ended(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return fmt::format("was killed by signal {} ({})", signal, strsignal(signal));
  }
  return "ended";
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

}  // namespace

int cuda_device_index(const WorldInfo& world, int visible) {
  if (visible == 1) return 0;
  if (world.local_rank < visible) return world.local_rank;
  throw InputError(
      fmt::format("local rank {} needs a CUDA device of its own, but this process sees {}: give each local rank "
                  "one GPU (one visible device per task, or at least as many visible devices as local ranks)",
                  world.local_rank, visible));
}

bool started_as_worker() { return env(kWorkerVariable) || env("RANK") || env("SLURM_PROCID"); }

WorldInfo world_from_environment() {
  WorldInfo world;
  if (env("RANK") || env("WORLD_SIZE")) {
    world.source = "torchrun variables (RANK, WORLD_SIZE, ...)";
    world.rank = env_int("RANK", 0);
    world.world_size = env_int("WORLD_SIZE", 1);
    world.local_rank = env_int("LOCAL_RANK", world.rank);
    world.local_world_size = env_int("LOCAL_WORLD_SIZE", world.world_size);
  } else if (env("SLURM_PROCID")) {
    world.source = "Slurm variables (SLURM_PROCID, SLURM_NTASKS, ...)";
    world.rank = env_int("SLURM_PROCID", 0);
    world.world_size = env_int("SLURM_NTASKS", 1);
    world.local_rank = env_int("SLURM_LOCALID", 0);
    world.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 1);
  } else {
    world.source = "a single process";
    return world;
  }
  if (world.world_size < 1 || world.rank >= world.world_size) {
    throw InputError(fmt::format("{}: rank {} is not below world size {}", world.source, world.rank, world.world_size));
  }
  if (const char* addr = env("MASTER_ADDR"))
    world.master_addr = addr;
  else if (world.world_size > 1 && env("SLURM_PROCID")) {
    throw InputError("Slurm job without MASTER_ADDR: export MASTER_ADDR (the first node's address) and MASTER_PORT");
  }
  world.master_port = env_int("MASTER_PORT", 29500);
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  world.agent_store = agent && std::string(agent) == "True";
  // 0: rank 0 (hosting the store) takes a port the kernel picks and logs it,
  // for the other ranks to be started with; no race for a free port.
  const bool picks_port = world.master_port == 0 && world.rank == 0 && !world.agent_store;
  if ((world.master_port < 1 && !picks_port) || world.master_port > 65535) {
    throw InputError(
        fmt::format("MASTER_PORT={}: expected a port in [1, 65535] (0 only for rank 0, which hosts the "
                    "rendezvous, to take a free port and log it)",
                    world.master_port));
  }
  return world;
}

namespace {

// The launcher's environment with the rendezvous variables of worker `rank` set.
std::vector<std::string> worker_environment(int rank, int nproc, int port) {
  const std::vector<std::pair<std::string, std::string>> set = {{kWorkerVariable, "1"},
                                                                {"RANK", std::to_string(rank)},
                                                                {"LOCAL_RANK", std::to_string(rank)},
                                                                {"WORLD_SIZE", std::to_string(nproc)},
                                                                {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                                                                {"MASTER_ADDR", "127.0.0.1"},
                                                                {"MASTER_PORT", std::to_string(port)},
                                                                {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  std::vector<std::string> environment;
  for (char** entry = environ; *entry; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    const bool replaced = std::any_of(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) environment.push_back(text);
  }
  for (const auto& [name, value] : set) environment.push_back(name + "=" + value);
  return environment;
}

}  // namespace

int launch_local_workers(int argc, char** argv, int nproc, double timeout_s) {
  // The launcher hosts the rendezvous store on a port the kernel picks, so
  // there is no race for a free port; workers connect as clients.
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  c10d::TCPStore store("127.0.0.1", options);
  const int port = store.getPort();

  struct sigaction action {};
  action.sa_handler = remember_signal;
  action.sa_flags = SA_RESTART;  // interrupted system calls resume; the loop reads the flag
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> child_argv;
  for (std::string& arg : args) child_argv.push_back(arg.data());
  child_argv.push_back(nullptr);
  std::vector<pid_t> pids(nproc, -1);
  for (int rank = 0; rank < nproc; ++rank) {
    // Everything the child needs is built here: the launcher has threads
    // (the store's), so between fork and exec the child may only make
    // async-signal-safe calls. A malloc there (setenv, std::to_string)
    // can find a lock another thread held at the fork and wait forever:
    // a worker that never starts (seen under ASan).
    std::vector<std::string> environment = worker_environment(rank, nproc, port);
    std::vector<char*> envp;
    for (std::string& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);
    const std::string exec_failed = fmt::format("worker {}: exec of /proc/self/exe failed\n", rank);
    const pid_t launcher = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw TrainingError(fmt::format("cannot start worker {}: {}", rank, std::strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a worker never outlives the launcher
      // The launcher may have died between fork and prctl: no signal would come.
      if (getppid() != launcher) _exit(1);
      execve("/proc/self/exe", child_argv.data(), envp.data());
      [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
      _exit(127);
    }
    pids[rank] = pid;
  }

  using Clock = std::chrono::steady_clock;
  // Rank 0's final write beats in the store (WriterGate): while the count
  // moved within the last few beats, no worker is stopped.
  int64_t last_beat = 0;
  Clock::time_point last_beat_change{};
  bool said_waiting = false, writer_was_busy = false;
  auto writer_busy = [&] {
    int64_t beat = last_beat;
    try {
      beat = store.add(kWriterHeartbeatKey, 0);
    } catch (const std::exception&) {
      return false;
    }
    if (beat != last_beat) {
      last_beat = beat;
      last_beat_change = Clock::now();
    }
    const bool busy = last_beat_change != Clock::time_point{} && Clock::now() - last_beat_change < 4 * kHeartbeat &&
                      !store.check({kWriterOutcomeKey});
    if (busy && !said_waiting) {
      log::warn("rank 0 is writing the final outputs; its workers are left to finish");
      said_waiting = true;
    }
    return busy;
  };
  int running = nproc;
  int clean_exits = 0;
  int exit_code = 0;
  bool stopping = false;
  Clock::time_point first_exit{};
  std::set<int> stopped_ranks;  // stopped (not ended) workers
  auto stop_all = [&](int signal) {
    for (pid_t pid : pids) {
      if (pid > 0) kill(pid, signal);
    }
    for (const int rank : stopped_ranks) {
      if (pids[rank] > 0) kill(pids[rank], SIGCONT);  // a stopped process acts on its signal once continued
    }
  };
  Clock::time_point stop_sent{};
  Clock::time_point settle_until{};                 // after a failure: SIGTERM to the rest once this passes
  auto grace = std::chrono::duration<double>(5.0);  // SIGTERM to SIGKILL after a failure
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid > 0) {
      int rank = 0;
      while (rank < nproc && pids[rank] != pid) ++rank;
      if (rank == nproc) continue;
      // A stopped worker (SIGSTOP, SIGTSTP, a debugger) holds its peers in
      // their next collective until they time out; the job names it.
      if (WIFSTOPPED(status)) {
        stopped_ranks.insert(rank);
        log::warn(
            fmt::format("rank {} (pid {}) was stopped by {}; its peers wait for it until "
                        "distributed.timeout_s",
                        rank, pid, strsignal(WSTOPSIG(status))));
        continue;
      }
      if (WIFCONTINUED(status)) {
        stopped_ranks.erase(rank);
        continue;
      }
      stopped_ranks.erase(rank);
      pids[rank] = -1;
      --running;
      if (!failed(status)) ++clean_exits;
      if (first_exit == Clock::time_point{}) first_exit = Clock::now();
      // Workers stopped by a forwarded signal exit with their own code (75:
      // checkpoint written); the job reports it.
      if (stopping && g_forwarded && WIFEXITED(status) && WEXITSTATUS(status) != 0) exit_code = WEXITSTATUS(status);
      if (failed(status) && !stopping) {
        log::error(fmt::format("rank {} {}; stopping the other {} worker(s)", rank, how_it_ended(status), running));
        if (!stopped_ranks.empty()) {
          log::error(fmt::format("rank(s) {} had been stopped and never answered: the likely cause",
                                 fmt::join(stopped_ranks, ", ")));
        }
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        stopping = true;
        // The others get a moment to end by themselves first: a peer's lost
        // connection often ends a rank before the rank whose bad input
        // caused it has exited with its own code and message.
        settle_until = Clock::now() + std::chrono::seconds(3);
        stop_sent = settle_until;
      } else if (failed(status) && !g_forwarded) {
        // A peer's lost connection often ends a rank before the rank whose
        // bad input caused it is reaped: bad input (exit 2) is the job's.
        log::error(fmt::format("rank {} {}", rank, how_it_ended(status)));
        if (WIFEXITED(status) && WEXITSTATUS(status) == kExitBadInput) exit_code = kExitBadInput;
      }
      continue;
    }
    if (const int signal = g_forward_signal.exchange(0)) {
      log::warn(fmt::format("received {}; forwarding to the workers", strsignal(signal)));
      stop_all(signal);
      if (!stopping) {
        stopping = true;
        g_forwarded = true;
        stop_sent = Clock::now();
        exit_code = 128 + signal;
        grace = std::chrono::duration<double>(timeout_s);  // time to finish a step and write a checkpoint
      }
    }
    const auto now = Clock::now();
    if (!stopping && first_exit != Clock::time_point{} && now - first_exit > std::chrono::duration<double>(timeout_s) &&
        !writer_busy()) {
      log::error(
          fmt::format("{} worker(s) still running {} s after another finished; stopping them", running, timeout_s));
      exit_code = 1;
      stopping = true;
      stop_sent = now;
      stop_all(SIGTERM);
    }
    if (settle_until != Clock::time_point{} && now >= settle_until) {
      stop_all(SIGTERM);
      settle_until = Clock::time_point{};
    }
    if (stopping && now - stop_sent > grace) {
      if (writer_busy()) {
        writer_was_busy = true;
      } else if (writer_was_busy) {  // the write just ended: a fresh grace to exit
        writer_was_busy = false;
        stop_sent = now;
      } else {
        stop_all(SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A signal that came while the last outputs were written: every worker
  // finished the run.
  if (g_forwarded && clean_exits == nproc) {
    log::info("every worker finished the run before stopping");
    exit_code = 0;
  }
  return exit_code;
}

}  // namespace trainer
