// An exclusive advisory lock on a lock file (flock(2)) that records its
// holder: the run's lock on its directories, tokenize's on its destination.
// The kernel drops the lock when its process dies, so a lock left by a
// killed process is never stale: the next taker simply gets it.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "trainer/Errors.h"
#include "util/Files.h"

namespace trainer {

class FileLock {
 public:
  /// Takes the lock on `path` (created if missing) and records this
  /// process (pid and host) in it; nullopt when another process holds it,
  /// with its record in `holder` ("holder unknown" when it wrote none).
  /// `remove_when_released`: the file goes when the lock does (a taker
  /// that opened it before checks that it locked the file the path still
  /// names). InputError naming `path` when it cannot be created.
  static std::optional<FileLock> take(const std::filesystem::path& path, bool remove_when_released,
                                      std::string* holder) {
    for (;;) {
      const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) {
        throw InputError(path.string() + ": cannot create the lock file (" + std::strerror(errno) + ")");
      }
      if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const std::optional<std::string> record = read_file(path);
        *holder = !record || record->empty() ? "holder unknown" : *record;
        close(fd);
        return std::nullopt;
      }
      struct stat locked = {};
      struct stat named = {};
      if (fstat(fd, &locked) == 0 && stat(path.c_str(), &named) == 0 && locked.st_ino == named.st_ino &&
          locked.st_dev == named.st_dev) {
        char host[256] = "?";
        gethostname(host, sizeof(host) - 1);
        FileLock lock(fd, remove_when_released ? path : std::filesystem::path());
        lock.left_ = read_file(path).value_or("");
        lock.who_ = "pid " + std::to_string(getpid()) + " on " + host;
        lock.record("");
        return lock;
      }
      close(fd);  // removed by its releasing holder after this open: take the one the path names now
    }
  }

  FileLock(FileLock&& other) noexcept
      : fd_(other.fd_), remove_(std::move(other.remove_)), who_(std::move(other.who_)), left_(std::move(other.left_)) {
    other.fd_ = -1;
  }
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ < 0) return;
    if (!remove_.empty()) unlink(remove_.c_str());  // while still held: no taker locks a file about to go
    close(fd_);                                     // closing the descriptor releases the lock
  }

  /// Rewrites the record: this process, then `note` (what it is doing, for
  /// a taker after a kill to read in left_record(); "" for nothing).
  void record(const std::string& note) {
    const std::string text = who_ + note;
    if (ftruncate(fd_, 0) == 0) {
      const ssize_t written = pwrite(fd_, text.data(), text.size(), 0);
      (void)written;  // the record is informative; the lock itself is what counts
    }
  }

  /// What the file held when this process locked it. A file removed when
  /// released holds a record only when its holder was killed: that
  /// holder's record, note included; otherwise "".
  const std::string& left_record() const { return left_; }

 private:
  FileLock(int fd, std::filesystem::path remove) : fd_(fd), remove_(std::move(remove)) {}
  int fd_ = -1;
  std::filesystem::path remove_;  // removed on release; empty: kept
  std::string who_;               // "pid N on HOST"
  std::string left_;              // the file's content when taken
};

}  // namespace trainer
