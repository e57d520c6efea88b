// The output-directory lock (see RunLock.h).
#include "run/RunLock.h"

#include <filesystem>

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

namespace {

FileLock take_run_lock(const std::string& dir, const std::string& key) {
  std::string holder;
  std::optional<FileLock> lock = FileLock::take(std::filesystem::path(dir) / ".trainer.lock", true, &holder);
  if (!lock) {
    throw InputError(fmt::format("{} {} is in use by another trainer run ({}); wait for it to end or choose another {}",
                                 key, dir, holder, key));
  }
  return std::move(*lock);
}

}  // namespace

RunLock::RunLock(const std::string& dir, const std::string& key) : lock_(take_run_lock(dir, key)) {}

}  // namespace trainer
