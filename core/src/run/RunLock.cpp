// The output-directory lock (see RunLock.h).
#include "run/RunLock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

RunLock::RunLock(const std::string& dir, const std::string& key) {
  const std::string path = (std::filesystem::path(dir) / ".trainer.lock").string();
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw InputError(fmt::format("{}: cannot create the run lock ({})", path, std::strerror(errno)));
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    std::ifstream in(path);
    std::stringstream holder;
    holder << in.rdbuf();
    close(fd_);
    fd_ = -1;
    throw InputError(fmt::format("{} {} is in use by another trainer run ({}); wait for it to end or choose another {}",
                                 key, dir, holder.str().empty() ? "holder unknown" : holder.str(), key));
  }
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const std::string who = fmt::format("pid {} on {}", getpid(), host);
  if (ftruncate(fd_, 0) == 0) {
    const ssize_t written = pwrite(fd_, who.data(), who.size(), 0);
    (void)written;  // the record is informative; the lock itself is what counts
  }
}

RunLock::RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

RunLock::~RunLock() {
  if (fd_ >= 0) close(fd_);  // closing the descriptor releases the lock
}

}  // namespace trainer
