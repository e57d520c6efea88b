// `trainer tokenize`: a jsonl corpus into the `tokens` dataset's flat file.
//
// Lines are read in blocks; each block's lines are tokenized by a pool of
// threads (the tokenizer is immutable and thread-safe) and written in input
// order, so the output does not depend on the thread count. Each document
// is its ids followed by the tokenizer's EOS (where it has one). Beside the
// tokens, OUT.docs holds the document boundaries: uint64 little-endian token
// offsets, one per document start and the total at the end. Both files are
// written under temporary names and renamed only when complete, so an
// existing output is never left half-written.
#include "tools/Tokenize.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Tokenizer.h"
#include "util/FaultInjection.h"
#include "util/FileLock.h"
#include "util/Files.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;

constexpr size_t kBlockLines = 4096;

struct Line {
  int64_t number = 0;
  std::string text;
  std::vector<int64_t> ids;
  std::string error;  ///< non-empty: the line is bad
};

void tokenize_line(Line& line, const Tokenizer& tokenizer) {
  try {
    const Json record = json_parse(line.text);
    const Json* text = json_find(record, "text");
    if (!text || !text->is_string()) {
      line.error = "expected a JSON object with a string field \"text\"";
      return;
    }
    line.ids = tokenizer.encode(text->get_ref<const std::string&>());
    if (const auto eos = tokenizer.eos_id()) line.ids.push_back(*eos);
  } catch (const std::runtime_error& error) {
    line.error = error.what();
  }
}

// Writes `values` as little-endian integers of `width` bytes (x86 and ARM hosts are little-endian).
void write_ids(std::ofstream& out, const std::vector<int64_t>& ids, int width) {
  if (width == 2) {
    std::vector<uint16_t> narrow(ids.begin(), ids.end());
    out.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
  } else {
    std::vector<uint32_t> wide(ids.begin(), ids.end());
    out.write(reinterpret_cast<const char*>(wide.data()), static_cast<std::streamsize>(wide.size() * 4));
  }
}

class Progress {
 public:
  explicit Progress(uint64_t total_bytes) : total_(total_bytes), tty_(isatty(STDERR_FILENO) == 1) {}

  void update(uint64_t bytes, int64_t tokens, double seconds, bool final = false) {
    const double share = total_ > 0 ? static_cast<double>(bytes) / static_cast<double>(total_) : 1.0;
    if (!tty_ && !final && share < next_report_) return;  // a log, not a terminal: every 10%
    next_report_ = share + 0.1;
    constexpr int width = 30;
    const int filled = static_cast<int>(share * width);
    const std::string bar =
        std::string(filled, '=') + (filled < width ? ">" : "") + std::string(std::max(0, width - filled - 1), ' ');
    fmt::print(stderr, "{}[{}] {:3.0f}%  {} tokens  {:.2f} MB/s  {:.0f} tokens/s{}", tty_ ? "\r" : "", bar, 100 * share,
               tokens, seconds > 0 ? bytes / seconds / 1e6 : 0.0, seconds > 0 ? tokens / seconds : 0.0,
               tty_ && !final ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  uint64_t total_;
  bool tty_;
  double next_report_ = 0.0;
};

// SIGINT or SIGTERM while tokenizing: the loop stops at the next block, the
// partial files are removed, and the signal ends the process as it would
// have (its default action), so an interrupted command leaves nothing.
std::atomic<int> g_stop_signal{0};

extern "C" void note_stop_signal(int number) { g_stop_signal.store(number); }

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction action {};
    action.sa_handler = note_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

struct Stopped {
  int signal;
};

int tokenize_until_stopped(const TokenizeRequest& request) {
  const auto load_start = std::chrono::steady_clock::now();
  std::shared_ptr<const Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::load(request.tokenizer);
  } catch (const InputError& error) {
    throw InputError(std::string("--tokenizer: ") + error.what());
  }
  const auto start = std::chrono::steady_clock::now();  // throughput counts tokenizing, not loading
  const double load_seconds = std::chrono::duration<double>(start - load_start).count();
  int width = request.dtype == "uint16" ? 2 : request.dtype == "uint32" ? 4 : 0;
  if (width == 0) width = tokenizer->vocab_size() <= 65536 ? 2 : 4;
  if (width == 2 && tokenizer->vocab_size() > 65536) {
    throw InputError(fmt::format("--dtype uint16: the tokenizer's vocabulary has {} ids, more than uint16 holds",
                                 tokenizer->vocab_size()));
  }
  if (fs::exists(request.input) && !fs::is_regular_file(request.input)) {
    throw InputError(fmt::format("{}: not a regular file", request.input));
  }
  std::ifstream in(request.input, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot be read", request.input));
  const uint64_t total_bytes = fs::file_size(request.input);
  const fs::path out_path = request.out, docs_path = request.out + ".docs";
  // Both destinations are checked before any work: neither may be a
  // directory, nor one of this command's inputs (it would be replaced by
  // token ids), so that the two renames at the end cannot fail halfway.
  const std::string tokenizer_file = (fs::path(request.tokenizer) / "tokenizer.json").string();
  for (const fs::path& destination : {out_path, docs_path}) {
    check_destination("--out", request.out, destination,
                      {{"--input file", request.input},
                       {"--tokenizer file", request.tokenizer},
                       {"--tokenizer file", tokenizer_file}},
                      "tokenizing would replace it with token ids");
  }
  // One tokenize at a time per destination: two would each rename their
  // own pair, and the last of four renames could pair one's ids with the
  // other's offsets. The lock file (hidden, beside --out) goes with the lock.
  std::string holder;
  const fs::path lock_path = out_path.parent_path() / ("." + out_path.filename().string() + ".lock");
  const std::optional<FileLock> lock = [&] {
    try {
      return FileLock::take(lock_path, true, &holder);
    } catch (const InputError& error) {
      throw InputError(fmt::format("--out {}: {}", request.out, error.what()));
    }
  }();
  if (!lock) {
    throw InputError(
        fmt::format("--out {} is being written by another trainer tokenize ({}); wait for it to end "
                    "or choose another --out",
                    request.out, holder));
  }
  // What a tokenize killed part-way left (this one holds the lock on --out).
  for (const fs::path& destination : {out_path, docs_path}) remove_files_left_beside(destination, "a tokenize");
  // The ids and offsets go to files of this command's own beside the
  // destinations (never an existing file, whatever its name: an input named
  // like a temporary is not truncated), renamed into place once whole.
  const StopSignals stop_signals;  // before the partial files exist
  // The partial files go unless renamed into place.
  struct Cleanup {
    fs::path a, b;
    bool done = false;
    ~Cleanup() {
      if (done) return;
      std::error_code ignored;
      if (!a.empty()) fs::remove(a, ignored);
      if (!b.empty()) fs::remove(b, ignored);
    }
  } cleanup;
  const auto create = [&](const fs::path& destination, fs::path& temporary) {
    try {
      const FileBeside beside = create_file_beside(destination);
      close(beside.fd);
      temporary = beside.path;
    } catch (const InputError& error) {
      throw InputError(fmt::format("--out {}: {}", request.out, error.what()));
    }
  };
  create(out_path, cleanup.a);
  create(docs_path, cleanup.b);
  const fs::path& out_tmp = cleanup.a;
  const fs::path& docs_tmp = cleanup.b;
  std::ofstream out(out_tmp, std::ios::binary | std::ios::trunc), docs(docs_tmp, std::ios::binary | std::ios::trunc);
  if (!out || !docs) {
    throw InputError(fmt::format("--out {}: cannot open {} ({})", request.out, (out ? docs_tmp : out_tmp).string(),
                                 std::strerror(errno)));
  }

  const unsigned threads =
      request.threads > 0 ? static_cast<unsigned>(request.threads) : std::max(1u, std::thread::hardware_concurrency());
  Progress progress(total_bytes);
  uint64_t bytes_read = 0, offset = 0;
  int64_t documents = 0, skipped = 0, number = 0;
  std::vector<int64_t> lengths;  // tokens per document, for the length distribution
  std::string first_bad;
  std::vector<Line> block;
  bool more = true;
  while (more) {
    block.clear();
    std::string text;
    while (block.size() < kBlockLines && (more = static_cast<bool>(std::getline(in, text)))) {
      ++number;
      bytes_read += text.size() + 1;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      block.push_back(Line{number, std::move(text), {}, {}});
    }
    if (const int number = g_stop_signal.load()) throw Stopped{number};
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < std::min<size_t>(threads, block.size()); ++t) {
      pool.emplace_back([&] {
        for (size_t i = next++; i < block.size(); i = next++) tokenize_line(block[i], *tokenizer);
      });
    }
    for (std::thread& thread : pool) thread.join();
    for (Line& line : block) {
      if (!line.error.empty()) {
        const std::string where = fmt::format("{}:{}: {}", request.input, line.number, line.error);
        if (!request.skip_bad_lines) throw InputError(where + " (--skip-bad-lines skips such lines)");
        if (skipped++ == 0) first_bad = where;
        continue;
      }
      docs.write(reinterpret_cast<const char*>(&offset), sizeof(offset));
      write_ids(out, line.ids, width);
      offset += line.ids.size();
      lengths.push_back(static_cast<int64_t>(line.ids.size()));
      ++documents;
    }
    if (!out || !docs) break;  // reported below, before anything is renamed
    // Tests: a signal arrives while the partial files exist.
    inject_slow_write("slow-tokenize");
    if (more) {
      progress.update(bytes_read, static_cast<int64_t>(offset),
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  docs.write(reinterpret_cast<const char*>(&offset), sizeof(offset));
  out.flush();
  docs.flush();
  const auto written = [&] {
    if (!out || !docs) {
      throw TrainingError(fmt::format("{}: write failed ({}); the partial files were removed",
                                      (out ? docs_path : out_path).string(), std::strerror(errno)));
    }
  };
  written();
  out.close();
  docs.close();
  written();
  if (documents == 0) throw InputError(fmt::format("{}: no documents", request.input));
  if (const int number = g_stop_signal.load()) throw Stopped{number};  // the last chance to leave nothing
  fsync_path(out_tmp);
  fsync_path(docs_tmp);
  fs::rename(out_tmp, out_path);
  fs::rename(docs_tmp, docs_path);
  cleanup.done = true;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.update(total_bytes, static_cast<int64_t>(offset), seconds, /*final=*/true);
  if (skipped > 0) log::warn(fmt::format("skipped {} bad line(s); the first: {}", skipped, first_bad));
  // What a window of seq_len holds of these documents, unpacked or packed
  // (dataset.pack): the distribution of their lengths.
  std::sort(lengths.begin(), lengths.end());
  const auto quantile = [&](double q) {
    return lengths[std::min(lengths.size() - 1, static_cast<size_t>(q * static_cast<double>(lengths.size())))];
  };
  log::info(fmt::format("document lengths in tokens: min {}, median {}, p90 {}, p99 {}, max {}, mean {:.1f}",
                        lengths.front(), quantile(0.5), quantile(0.9), quantile(0.99), lengths.back(),
                        static_cast<double>(offset) / static_cast<double>(documents)));
  log::info(
      fmt::format("tokenized {} documents into {} tokens in {:.2f} s (after {:.2f} s loading the tokenizer): "
                  "{:.0f} tokens/s, {:.2f} MB/s with {} thread(s); {} (dtype = \"{}\", vocab_size = {}) and {} "
                  "(document offsets)",
                  documents, offset, seconds, load_seconds, offset / seconds, total_bytes / seconds / 1e6, threads,
                  out_path.string(), width == 2 ? "uint16" : "uint32", tokenizer->vocab_size(), docs_path.string()));
  return 0;
}

}  // namespace

int tokenize_corpus(const TokenizeRequest& request) {
  try {
    return tokenize_until_stopped(request);
  } catch (const Stopped& stopped) {
    log::warn(fmt::format("{}: stopped by {}; no output written", request.out, strsignal(stopped.signal)));
    signal(stopped.signal, SIG_DFL);
    raise(stopped.signal);
    return 128 + stopped.signal;
  }
}

}  // namespace trainer
