// Dataset `tokens`: a flat binary file of token ids (uint16 or uint32,
// little-endian), memory-mapped, cut into windows of seq_len + 1 tokens with
// stride seq_len, every token after the first a target (pre-training).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

#include "trainer/Dataset.h"
#include "trainer/Errors.h"

namespace {

using namespace trainer;

class TokensDataset final : public Dataset {
 public:
  TokensDataset(const Options& options, const Context&)
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
    const int fd = open(path_.c_str(), O_RDONLY);
    if (fd < 0) options.fail("path", fmt::format("a readable file, cannot open '{}': {}", path_, std::strerror(errno)));
    struct stat info {};
    fstat(fd, &info);
    bytes_ = static_cast<size_t>(info.st_size);
    if (bytes_ % width_ != 0) {
      close(fd);
      throw InputError(
          fmt::format("{}: {} bytes is not a whole number of {} tokens ({} bytes each); wrong dtype or a "
                      "truncated file?",
                      path_, bytes_, options.text("dtype"), width_));
    }
    tokens_ = static_cast<int64_t>(bytes_ / width_);
    if (tokens_ < seq_len_ + 1) {
      close(fd);
      throw InputError(
          fmt::format("{}: {} tokens, fewer than one window of seq_len + 1 = {}", path_, tokens_, seq_len_ + 1));
    }
    data_ = mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (data_ == MAP_FAILED) throw InputError(fmt::format("{}: cannot map: {}", path_, std::strerror(errno)));
    // One pass over the file before training (memory bandwidth: ~1 s per
    // GB), so a bad id is an error at start, not at some step hours in.
    for (int64_t i = 0; i < tokens_; ++i) {
      const int64_t id = token(i);
      if (id >= vocab_size_) {
        munmap(data_, bytes_);
        throw InputError(
            fmt::format("{}: token {} at position {} is not below vocab_size {}", path_, id, i, vocab_size_));
      }
    }
  }
  ~TokensDataset() override { munmap(data_, bytes_); }

  int64_t size() const override { return (tokens_ - 1) / seq_len_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }
  bool shuffle() const override { return shuffle_; }

  Sample get(int64_t index) const override {
    Sample sample;
    const int64_t start = index * seq_len_;
    for (int64_t i = start; i <= start + seq_len_; ++i) sample.tokens.push_back(static_cast<int32_t>(token(i)));
    sample.target.assign(sample.tokens.size(), 1);
    sample.target[0] = 0;
    return sample;
  }

 private:
  int64_t token(int64_t i) const {
    return width_ == 2 ? static_cast<const uint16_t*>(data_)[i] : static_cast<const uint32_t*>(data_)[i];
  }

  std::string path_;
  int64_t seq_len_, vocab_size_;
  size_t width_;
  bool shuffle_;
  size_t bytes_ = 0;
  int64_t tokens_ = 0;
  void* data_ = nullptr;
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, nullptr, "the binary token file"},
    {"dtype", ValueType::String, "'uint16'", "width of one token id", -kNoLimit, kNoLimit, "uint16|uint32"},
    {"seq_len", ValueType::Int, "2048", "input positions per window", 1, 1 << 24},
    {"vocab_size", ValueType::Int, nullptr, "every token id must be below this", 1, 4294967296.0},
    {"shuffle", ValueType::Bool, "true", "false: step t takes windows t*G .. (t+1)*G - 1 in file order"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Dataset, TokensDataset, "tokens", "0.1.0", "fixed-length windows of a flat binary token file",
                      kKeys)
