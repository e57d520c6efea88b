// An advisory lock on a run's output directory, so that two runs never
// write into one directory and destroy each other's outputs.
#pragma once

#include <string>

namespace trainer {

/// Holds an exclusive flock(2) on DIR/.trainer.lock for its lifetime; the
/// file records the holder's pid and host. The kernel drops the lock when
/// its process dies, so a lock left by a killed run is never stale: the next
/// run simply takes it. Movable, not copyable.
class RunLock {
 public:
  /// Throws InputError naming the directory and the holder when another
  /// process holds the lock.
  explicit RunLock(const std::string& dir);
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  ~RunLock();

 private:
  int fd_ = -1;
};

}  // namespace trainer
