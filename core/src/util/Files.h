// File-system helpers that must not go through std::filesystem::remove_all:
// the PyTorch wheel's libtorch.so exports its own copy of that symbol, which
// crashes when it wins symbol resolution (seen with LibTorch 2.11).
#pragma once

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/Errors.h"
#include "trainer/Log.h"

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

/// Directories a command makes for its output, removed again when it is
/// refused: on destruction, unless kept, each directory `create` made
/// (missing parents included) is removed deepest first while it is empty,
/// so bad input found after the output directory was made leaves no trace.
/// A directory that holds anything, or existed before, stays.
class MadeDirectories {
 public:
  MadeDirectories() = default;
  MadeDirectories(const MadeDirectories&) = delete;
  MadeDirectories& operator=(const MadeDirectories&) = delete;
  ~MadeDirectories() {
    std::sort(made_.begin(), made_.end(), [](const auto& a, const auto& b) { return a.native() > b.native(); });
    std::error_code error;
    for (const std::filesystem::path& dir : made_) std::filesystem::remove(dir, error);  // fails when not empty
  }
  /// std::filesystem::create_directories(dir, error), remembering the
  /// directories it made.
  void create(const std::filesystem::path& dir, std::error_code& error) {
    std::vector<std::filesystem::path> missing;  // deepest first
    for (std::filesystem::path at = std::filesystem::absolute(dir, error).lexically_normal();
         !error && at.has_relative_path(); at = at.parent_path()) {
      if (!at.has_filename()) continue;  // "a/b/": its last element is empty
      std::error_code status_error;
      if (std::filesystem::exists(std::filesystem::symlink_status(at, status_error))) break;
      missing.push_back(at);
    }
    if (error) return;
    std::filesystem::create_directories(dir, error);
    if (!error) made_.insert(made_.end(), missing.begin(), missing.end());
  }
  /// The command got past its checks: what it made stays.
  void keep() { made_.clear(); }

 private:
  std::vector<std::filesystem::path> made_;
};

/// The whole content of the file at `path`; nullopt when it cannot be read
/// (missing, a directory, no permission, an I/O error part-way).
inline std::optional<std::string> read_file(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

/// A command's output file checked before any work: `destination` (the
/// value of `option`, or a file named after it) is not a directory, lies in
/// an existing directory (found missing at the end, the work would be
/// lost), and is none of `inputs` (what, path; `what` such as "--tokens
/// file"), which writing it would replace. Bad input (InputError)
/// beginning with "OPTION VALUE: ", an input's ending with `consequence`.
inline void check_destination(const std::string& option, const std::string& value,
                              const std::filesystem::path& destination,
                              const std::vector<std::pair<std::string, std::string>>& inputs,
                              const std::string& consequence) {
  const std::string where = option + " " + value + ": " + (destination == value ? "" : destination.string() + " ");
  std::error_code error;
  if (std::filesystem::is_directory(destination, error)) {
    throw InputError(where + "is a directory; expected a file to write");
  }
  const std::filesystem::path folder = destination.has_parent_path() ? destination.parent_path() : ".";
  if (!std::filesystem::is_directory(folder, error)) {
    throw InputError(where + "the directory " + folder.string() + " does not exist; expected a file to write in an " +
                     "existing directory");
  }
  for (const auto& [what, input] : inputs) {
    if (std::filesystem::equivalent(destination, input, error)) {
      throw InputError(where + "is the " + what + " " + input + "; " + consequence);
    }
  }
}

/// The process's file-creation mask, read without changing it (umask(2)
/// can only read it by setting it, which races with other threads).
inline mode_t file_creation_mask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 022;
}

/// A file created for this write alone, beside the file it will replace.
struct FileBeside {
  std::filesystem::path path;  ///< PATH.tmp-XXXXXX
  int fd = -1;                 ///< open for writing
};

/// What names a file create_file_beside made: PATH, this, six letters or digits.
inline constexpr const char kBesideTag[] = ".tmp-";

/// Creates a new, empty file beside `path`, named PATH.tmp-XXXXXX and
/// created exclusively (mkostemp), mode 0644 less the umask. A fixed name
/// such as PATH.tmp would truncate whatever file has that name, an input of
/// the command among them; this one is never an existing file. A directory
/// that takes no new file is bad input (InputError naming `path`).
inline FileBeside create_file_beside(const std::filesystem::path& path) {
  std::string name = path.string() + kBesideTag + "XXXXXX";
  const int fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) throw InputError(path.string() + ": cannot create a file beside it (" + std::strerror(errno) + ")");
  fchmod(fd, 0644 & ~file_creation_mask());
  return {name, fd};
}

/// Removes the files create_file_beside made beside `path`
/// (PATH.tmp-XXXXXX, six letters or digits) and left: `who` ("a run")
/// killed while writing it. Each file removed is logged as left by `who`.
/// Only for a path whose writers the caller excludes (a run holding its
/// directory's lock).
inline void remove_files_left_beside(const std::filesystem::path& path, const std::string& who) {
  const std::string prefix = path.filename().string() + kBesideTag;
  std::vector<std::filesystem::path> left;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != prefix.size() + 6 || name.rfind(prefix, 0) != 0 || !entry.is_regular_file(error)) continue;
    if (std::all_of(name.begin() + prefix.size(), name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)); })) {
      left.push_back(entry.path());
    }
  }
  for (const auto& file : left) {
    if (std::filesystem::remove(file, error)) {
      log::info(file.string() + ": left by " + who + " stopped while writing " + path.filename().string() +
                "; removed");
    }
  }
}

/// Writes `data` to a new file beside `path` (create_file_beside), flushes
/// it to disk, then renames it over `path`: readers see the old file or the
/// whole new one, and no other file is touched. A directory that takes no
/// new file is bad input (InputError naming `path`); a write that fails (a
/// full disk, an I/O error) is a fault (TrainingError naming `path`). Either
/// way the new file is removed and `path` is as it was.
inline void write_file_atomically(const std::filesystem::path& path, const char* data, size_t size) {
  const FileBeside temporary = create_file_beside(path);
  const int fd = temporary.fd;
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
    std::filesystem::remove(temporary.path, ignored);
    throw TrainingError(path.string() + ": write failed (" + std::strerror(failure) + "); it is as it was");
  }
  std::filesystem::rename(temporary.path, path, ignored);
  if (ignored) {
    const std::string why = ignored.message();
    std::filesystem::remove(temporary.path, ignored);
    throw InputError(path.string() + ": cannot replace it (" + why + ")");
  }
}

inline void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path, text.data(), text.size());
}

/// Copies `from` to `path` as write_file_atomically writes: into a file
/// beside `path`, flushed, renamed over it, so that `path` is whole or as it
/// was. A failed copy is a fault (TrainingError naming both files).
inline void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& path) {
  const FileBeside temporary = create_file_beside(path);
  close(temporary.fd);
  std::error_code error;
  std::filesystem::copy_file(from, temporary.path, std::filesystem::copy_options::overwrite_existing, error);
  if (!error) {
    const int fd = open(temporary.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) error = std::error_code(errno, std::generic_category());
    if (fd >= 0) close(fd);
  }
  if (!error) std::filesystem::rename(temporary.path, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temporary.path, ignored);
    throw TrainingError(path.string() + ": copying " + from.string() + " failed (" + error.message() +
                        "); it is as it was");
  }
}

}  // namespace trainer
