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
/// `path`: readers see the old file or the whole new one.
inline void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw InputError(temporary.string() + ": cannot write (" + std::strerror(errno) + ")");
  }
  fsync_path(temporary);
  std::filesystem::rename(temporary, path);
}

}  // namespace trainer
