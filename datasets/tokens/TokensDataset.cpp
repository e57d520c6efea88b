// Dataset `tokens`: a flat binary file of token ids (uint16 or uint32,
// little-endian), cut into windows of seq_len + 1 tokens with stride
// seq_len, every token after the first a target (pre-training).
//
// Windows are read with pread(2), not through a mapping: a file truncated
// or replaced under a running job then ends it with an error naming the
// file and the window, where a mapping would kill it with SIGBUS. Every id
// is checked against vocab_size once, by rank 0 at start-up (the file is
// the same for every rank), and each window's ids again as they are read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "trainer/Dataset.h"
#include "trainer/Errors.h"

namespace {

using namespace trainer;

class TokensDataset final : public Dataset {
 public:
  TokensDataset(const Options& options, const Context& context)
      : path_(options.text("path")),
        seq_len_(options.integer("seq_len")),
        vocab_size_(options.integer("vocab_size")),
        width_(options.text("dtype") == "uint16" ? 2 : 4),
        shuffle_(options.boolean("shuffle")) {
    // A FIFO or device would block or never end; only regular files are data.
    struct stat kind {};
    if (stat(path_.c_str(), &kind) == 0 && !S_ISREG(kind.st_mode)) {
      options.fail("path", fmt::format("a regular file; '{}' is not one", path_));
    }
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      options.fail("path", fmt::format("a readable file, cannot open '{}': {}", path_, std::strerror(errno)));
    struct stat info {};
    fstat(fd_, &info);
    const size_t bytes = static_cast<size_t>(info.st_size);
    if (bytes % width_ != 0) {
      close(fd_);
      throw InputError(
          fmt::format("{}: {} bytes is not a whole number of {} tokens ({} bytes each); wrong dtype or a "
                      "truncated file?",
                      path_, bytes, options.text("dtype"), width_));
    }
    tokens_ = static_cast<int64_t>(bytes / width_);
    if (tokens_ < seq_len_ + 1) {
      close(fd_);
      throw InputError(
          fmt::format("{}: {} tokens, fewer than one window of seq_len + 1 = {}", path_, tokens_, seq_len_ + 1));
    }
    if (context.rank != 0) return;
    // One pass in 16 MiB reads (disk or page-cache bandwidth), so a bad id
    // is an error at start, not at some step hours in.
    constexpr int64_t kChunk = int64_t(16) << 20;
    std::vector<int64_t> ids;
    for (int64_t first = 0; first < tokens_; first += kChunk / static_cast<int64_t>(width_)) {
      try {
        read_ids(first, std::min(tokens_ - first, kChunk / static_cast<int64_t>(width_)), ids);
      } catch (...) {
        close(fd_);
        throw;
      }
    }
  }
  ~TokensDataset() override { close(fd_); }

  int64_t size() const override { return (tokens_ - 1) / seq_len_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }
  bool shuffle() const override { return shuffle_; }

  Sample get(int64_t index) const override {
    std::vector<int64_t> ids;
    read_ids(index * seq_len_, seq_len_ + 1, ids);
    Sample sample;
    sample.tokens.assign(ids.begin(), ids.end());  // below vocab_size <= 2^31: they fit
    sample.target.assign(sample.tokens.size(), 1);
    sample.target[0] = 0;
    return sample;
  }

 private:
  // Tokens [first, first + count) into `ids`, each checked against
  // vocab_size. InputError naming the file and position for a bad id or a
  // file that no longer holds them.
  void read_ids(int64_t first, int64_t count, std::vector<int64_t>& ids) const {
    std::vector<unsigned char> raw(static_cast<size_t>(count) * width_);
    size_t done = 0;
    while (done < raw.size()) {
      const ssize_t n = pread(fd_, raw.data() + done, raw.size() - done,
                              static_cast<off_t>(static_cast<size_t>(first) * width_ + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw InputError(
            fmt::format("{}: cannot read tokens {}..{} ({}); the file held {} tokens at start-up: was it truncated or "
                        "replaced during the run?",
                        path_, first, first + count - 1, n < 0 ? std::strerror(errno) : "end of file", tokens_));
      }
      done += static_cast<size_t>(n);
    }
    ids.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const unsigned char* b = raw.data() + static_cast<size_t>(i) * width_;
      ids[i] = width_ == 2 ? int64_t(b[0]) | int64_t(b[1]) << 8
                           : int64_t(b[0]) | int64_t(b[1]) << 8 | int64_t(b[2]) << 16 | int64_t(b[3]) << 24;
      if (ids[i] >= vocab_size_) {
        throw InputError(fmt::format("{}: token {} at position {} is not below vocab_size {}", path_, ids[i], first + i,
                                     vocab_size_));
      }
    }
  }

  std::string path_;
  int64_t seq_len_, vocab_size_;
  size_t width_;
  bool shuffle_;
  int fd_ = -1;
  int64_t tokens_ = 0;
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, nullptr, "the binary token file"},
    {"dtype", ValueType::String, "'uint16'", "width of one token id", -kNoLimit, kNoLimit, "uint16|uint32"},
    {"seq_len", ValueType::Int, "2048", "input positions per window", 1, 1 << 24},
    // Sample ids are int32: ids up to 2^31 - 1.
    {"vocab_size", ValueType::Int, nullptr, "every token id must be below this", 1, 2147483648.0},
    {"shuffle", ValueType::Bool, "true", "false: step t takes windows t*G .. (t+1)*G - 1 in file order"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Dataset, TokensDataset, "tokens", "0.1.0", "fixed-length windows of a flat binary token file",
                      kKeys)
