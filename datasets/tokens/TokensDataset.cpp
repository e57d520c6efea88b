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
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/util/Packing.h"

namespace {

using namespace trainer;

class TokensDataset final : public Dataset {
 public:
  TokensDataset(const Options& options, const Context& context)
      : path_(options.text("path")),
        seq_len_(options.integer("seq_len")),
        vocab_size_(options.integer("vocab_size")),
        width_(options.text("dtype") == "uint16" ? 2 : 4),
        shuffle_(options.boolean("shuffle")),
        pack_(options.boolean("pack")) {
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
    if (!pack_ && tokens_ < seq_len_ + 1) {
      close(fd_);
      throw InputError(
          fmt::format("{}: {} tokens, fewer than one window of seq_len + 1 = {}", path_, tokens_, seq_len_ + 1));
    }
    if (pack_) {
      try {
        const std::string docs = options.text("docs").empty() ? path_ + ".docs" : options.text("docs");
        // Like the tokens: a directory, FIFO or device is no offsets file (a FIFO would block).
        if (stat(docs.c_str(), &kind) == 0 && !S_ISREG(kind.st_mode)) {
          if (!options.text("docs").empty()) options.fail("docs", fmt::format("a regular file; '{}' is not one", docs));
          throw InputError(fmt::format("{}: expected the document offsets as a regular file; it is not one", docs));
        }
        read_documents(docs, long_documents_from(options.text("long_documents")));
      } catch (...) {
        close(fd_);
        throw;
      }
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

  int64_t size() const override { return pack_ ? static_cast<int64_t>(windows_.size()) : (tokens_ - 1) / seq_len_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }
  bool shuffle() const override { return shuffle_; }
  bool packs_documents() const override { return pack_; }

  Sample get(int64_t index) const override {
    if (pack_) return packed_window(index);
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

  // The .docs file of `trainer tokenize` (uint64 little-endian offsets: each
  // document's first token, then the total), checked against the tokens
  // file; its documents fitted to windows (long_documents) and packed.
  void read_documents(const std::string& docs, LongDocuments policy) {
    std::ifstream in(docs, std::ios::binary);
    if (!in) {
      throw InputError(
          fmt::format("{}: cannot open the document offsets that dataset.pack = true needs ({}; "
                      "`trainer tokenize` writes it beside the tokens, dataset.docs names another)",
                      docs, std::strerror(errno)));
    }
    std::vector<uint64_t> offsets;
    unsigned char raw[8];
    while (in.read(reinterpret_cast<char*>(raw), 8)) {
      uint64_t value = 0;
      for (int b = 7; b >= 0; --b) value = value << 8 | raw[b];
      offsets.push_back(value);
    }
    if (in.gcount() != 0) {
      throw InputError(
          fmt::format("{}: {} trailing bytes; expected whole uint64 offsets (a truncated file?)", docs, in.gcount()));
    }
    if (offsets.size() < 2 || offsets.front() != 0 || offsets.back() != static_cast<uint64_t>(tokens_)) {
      throw InputError(
          fmt::format("{}: does not match {}: expected offsets from 0 up to its {} tokens, got {} offset(s){}", docs,
                      path_, tokens_, offsets.size(),
                      offsets.empty() ? "" : fmt::format(" from {} to {}", offsets.front(), offsets.back())));
    }
    const int64_t capacity = seq_len_ + 1;
    int64_t short_documents = 0, split = 0;
    for (size_t d = 0; d + 1 < offsets.size(); ++d) {
      if (offsets[d + 1] < offsets[d] || offsets[d + 1] > static_cast<uint64_t>(tokens_)) {
        throw InputError(
            fmt::format("{}: document {} ends at offset {}, before its start {} or beyond the {} tokens "
                        "of {}; expected ascending offsets",
                        docs, d, offsets[d + 1], offsets[d], tokens_, path_));
      }
      const int64_t first = static_cast<int64_t>(offsets[d]);
      const int64_t count = static_cast<int64_t>(offsets[d + 1] - offsets[d]);
      if (count < 2) {  // nothing to predict
        ++short_documents;
        continue;
      }
      std::vector<DocumentPiece> pieces;
      try {
        pieces = document_pieces(count, capacity, policy);
      } catch (const std::runtime_error& error) {
        throw InputError(fmt::format("{}: document {} (tokens {}..{} of {}): {}", docs, d, first, first + count - 1,
                                     path_, error.what()));
      }
      if (pieces.size() > 1) ++split;
      for (const DocumentPiece& piece : pieces) spans_.push_back(DocumentPiece{first + piece.first, piece.count});
    }
    if (spans_.empty()) throw InputError(fmt::format("{}: no document of two tokens or more", docs));
    std::vector<int64_t> lengths;
    for (const DocumentPiece& span : spans_) lengths.push_back(span.count);
    windows_ = pack_documents(lengths, capacity);
    log::info(fmt::format(
        "{}: {} documents{}{} packed into {} windows of seq_len = {} ({:.2f} per window)", path_, offsets.size() - 1,
        split > 0 ? fmt::format(" ({} split into pieces)", split) : std::string(),
        short_documents > 0 ? fmt::format(" ({} of fewer than 2 tokens left out)", short_documents) : std::string(),
        windows_.size(), seq_len_, static_cast<double>(spans_.size()) / static_cast<double>(windows_.size())));
  }

  Sample packed_window(int64_t index) const {
    std::vector<Sample> documents;
    std::vector<int64_t> ids;
    for (const int64_t d : windows_.at(static_cast<size_t>(index))) {
      const DocumentPiece& span = spans_[static_cast<size_t>(d)];
      read_ids(span.first, span.count, ids);
      Sample document;
      document.tokens.assign(ids.begin(), ids.end());
      document.target.assign(ids.size(), 1);
      documents.push_back(std::move(document));
    }
    std::vector<const Sample*> pointers;
    for (const Sample& document : documents) pointers.push_back(&document);
    return concatenate_documents(pointers);  // no document's first token is a target
  }

  std::string path_;
  int64_t seq_len_, vocab_size_;
  size_t width_;
  bool shuffle_, pack_;
  int fd_ = -1;
  int64_t tokens_ = 0;
  std::vector<DocumentPiece> spans_;           // pack: documents (and pieces) of at most seq_len + 1 tokens
  std::vector<std::vector<int64_t>> windows_;  // pack: the spans_ each window holds
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, nullptr, "the binary token file"},
    {"dtype", ValueType::String, "'uint16'", "width of one token id", -kNoLimit, kNoLimit, "uint16|uint32"},
    {"seq_len", ValueType::Int, "2048", "input positions per window", 1, 1 << 24},
    // Sample ids are int32: ids up to 2^31 - 1.
    {"vocab_size", ValueType::Int, nullptr, "every token id must be below this", 1, 2147483648.0},
    {"shuffle", ValueType::Bool, "true", "false: step t takes windows t*G .. (t+1)*G - 1 in file order"},
    {"pack", ValueType::Bool, "false",
     "windows of whole documents (the .docs offsets; best fit in file order), each with its own positions and "
     "attention; false: windows cut from the stream"},
    {"docs", ValueType::String, "''", "the document offsets for pack ('': path + '.docs', as trainer tokenize writes)"},
    {"long_documents", ValueType::String, "'split'",
     "pack: a document of more than seq_len + 1 tokens is split into overlapping pieces, truncated, or refused",
     -kNoLimit, kNoLimit, "split|truncate|refuse"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Dataset, TokensDataset, "tokens", "0.1.0", "fixed-length windows of a flat binary token file",
                      kKeys)
