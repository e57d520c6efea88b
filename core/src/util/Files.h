// File-system helpers that must not go through std::filesystem::remove_all:
// the PyTorch wheel's libtorch.so exports its own copy of that symbol, which
// crashes when it wins symbol resolution (seen with LibTorch 2.11).
#pragma once

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "trainer/Errors.h"

namespace trainer {

/// Removes `path` and everything below it; a missing path is not an error.
inline void remove_tree(const std::string& path) {
  nftw(
      path.c_str(), [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

/// fsync of a file or directory, so a rename that follows survives a crash.
inline void fsync_path(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

/// Writes `text` to PATH.tmp, flushes it to disk, then renames it over
/// `path`: readers see the old file or the whole new one. A PATH.tmp that
/// cannot be created is bad input (InputError naming it: a missing or
/// unwritable directory); a write that fails (a full disk, an I/O error) is
/// a fault (TrainingError naming it). Either way PATH.tmp is removed and
/// `path` is as it was.
inline void write_file_atomically(const std::filesystem::path& path, const char* data, size_t size) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(temporary.string() + ": cannot create (" + std::strerror(errno) + ")");
  size_t done = 0;
  int failure = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failure = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (failure == 0 && fsync(fd) != 0 && errno != EINVAL) failure = errno;
  if (close(fd) != 0 && failure == 0) failure = errno;
  std::error_code ignored;
  if (failure != 0) {
    std::filesystem::remove(temporary, ignored);
    throw TrainingError(temporary.string() + ": write failed (" + std::strerror(failure) + ")");
  }
  std::filesystem::rename(temporary, path, ignored);
  if (ignored) {
    const std::string why = ignored.message();
    std::filesystem::remove(temporary, ignored);
    throw InputError(path.string() + ": cannot replace it (" + why + ")");
  }
}

inline void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path, text.data(), text.size());
}

}  // namespace trainer
