// An advisory lock on a directory a run writes into (its output directory,
// its checkpoint directory), so that two runs never write into one and
// destroy each other's outputs.
#pragma once

#include <string>

#include "util/FileLock.h"

namespace trainer {

/// Holds an exclusive flock(2) on DIR/.trainer.lock for its lifetime; the
/// file records the holder's pid and host and goes with the lock (a refused
/// run leaves its new directory empty, to be removed). The kernel drops the
/// lock when its process dies, so a file left by a killed run is never a
/// stale lock: the next run simply takes it. Movable, not copyable.
class RunLock {
 public:
  /// Throws InputError naming `key` (the recipe key that chose the
  /// directory), the directory and the holder when another process holds
  /// the lock.
  RunLock(const std::string& dir, const std::string& key);

 private:
  FileLock lock_;
};

}  // namespace trainer
