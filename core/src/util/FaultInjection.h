// Test hooks for slow writes and a stopped rank: TRAINER_FAULT_INJECT names
// the fault (the write to slow down, or stop-rank), TRAINER_FAULT_DELAY_S
// how long a write takes, TRAINER_FAULT_MARKER a file created when it
// starts (so a test acts on an event instead of a guess).
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace trainer {

/// When TRAINER_FAULT_INJECT is `which`: creates the marker file (if named)
/// and sleeps TRAINER_FAULT_DELAY_S seconds (default 5).
inline void inject_slow_write(const char* which) {
  const char* fault = std::getenv("TRAINER_FAULT_INJECT");
  if (!fault || std::string(fault) != which) return;
  if (const char* marker = std::getenv("TRAINER_FAULT_MARKER")) std::ofstream(marker) << which << "\n";
  const char* delay = std::getenv("TRAINER_FAULT_DELAY_S");
  std::this_thread::sleep_for(std::chrono::duration<double>(delay ? std::atof(delay) : 5.0));
}

/// Whether TRAINER_FAULT_INJECT is `which` (a fault the caller raises itself).
inline bool fault_injected(const char* which) {
  const char* fault = std::getenv("TRAINER_FAULT_INJECT");
  return fault && std::string(fault) == which;
}

/// When TRAINER_FAULT_INJECT is "stop-rank" and this process is rank 1
/// (RANK): stops itself with SIGSTOP after optimizer step 2, as a debugger
/// or a job-control mistake would, leaving its peers waiting.
inline void inject_stop(int64_t step) {
  const char* fault = std::getenv("TRAINER_FAULT_INJECT");
  const char* rank = std::getenv("RANK");
  if (fault && std::string(fault) == "stop-rank" && rank && std::string(rank) == "1" && step == 2) raise(SIGSTOP);
}

}  // namespace trainer
