// Test hooks for slow writes: TRAINER_FAULT_INJECT names the write to slow
// down, TRAINER_FAULT_DELAY_S how long, TRAINER_FAULT_MARKER a file created
// when it starts (so a test acts on an event instead of a guess).
#pragma once

#include <chrono>
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

}  // namespace trainer
