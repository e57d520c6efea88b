// Dataset `jsonl`: one JSON object per line: text ("prompt", "completion";
// or "text" for a pretraining line), tokenized by `tokenizer` (a Hugging
// Face tokenizer.json) or byte by byte without one, or pre-tokenised ids
// ("prompt_ids", "completion_ids": used as given).
// The whole file is read and checked when the run starts, so a malformed
// line is reported before any training, with file and line.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/util/Packing.h"
#include "trainer/util/Tokenizer.h"

#include "JsonlRecord.h"

namespace {

using namespace trainer;

class JsonlDataset final : public Dataset {
 public:
  JsonlDataset(const Options& options, const Context&)
      : path_(options.text("path")),
        seq_len_(options.integer("seq_len")),
        completion_only_(options.boolean("completion_only_loss")),
        shuffle_(options.boolean("shuffle")),
        pack_(options.boolean("pack")),
        long_documents_(long_documents_from(options.text("long_documents"))) {
    if (!options.text("tokenizer").empty()) {
      try {
        tokenizer_ = Tokenizer::load(options.text("tokenizer"));
      } catch (const InputError& error) {
        throw InputError(std::string("dataset.tokenizer: ") + error.what());
      }
    }
    // 0: the tokenizer's vocabulary (bytes + BOS + EOS without one); a model
    // whose embedding is padded beyond it sets it explicitly.
    const int64_t needed = tokenizer_ ? tokenizer_->vocab_size() : 258;
    vocab_size_ = options.integer("vocab_size") == 0 ? needed : options.integer("vocab_size");
    if (tokenizer_ && vocab_size_ < needed) {
      options.fail("vocab_size",
                   fmt::format("at least the tokenizer's {} ({}), or 0 to follow it", needed, tokenizer_->path()));
    }
    // Records are read whole; fit_document applies long_documents.
    record_format_ = JsonlRecordFormat{int64_t(1) << 40, vocab_size_, completion_only_, tokenizer_.get()};
    if (std::filesystem::exists(path_) && !std::filesystem::is_regular_file(path_)) {
      options.fail("path", fmt::format("a regular file; '{}' is not one", path_));  // a FIFO would block
    }
    std::ifstream in(path_);
    if (!in) options.fail("path", fmt::format("a readable file, cannot open '{}'", path_));
    const bool skip_bad = options.boolean("skip_bad_lines");
    int64_t skipped = 0;
    std::string first_bad;
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        for (Sample& piece : fit_document(parse_jsonl_record(line, record_format_), seq_len_ + 1, long_documents_)) {
          samples_.push_back(std::move(piece));
        }
      } catch (const std::exception& error) {
        const std::string where = fmt::format("{}:{}: {}", path_, number, error.what());
        if (!skip_bad) throw InputError(where + " (set dataset.skip_bad_lines = true to skip such lines)");
        if (skipped++ == 0) first_bad = where;
      }
    }
    if (skipped > 0)
      log::warn(fmt::format("{}: skipped {} malformed line(s); the first: {}", path_, skipped, first_bad));
    if (samples_.empty()) throw InputError(fmt::format("{}: no records", path_));
    // A data set without a single target token would train zero updates and still "succeed".
    const bool any_target = std::any_of(samples_.begin(), samples_.end(), [](const Sample& sample) {
      return std::find(sample.target.begin() + 1, sample.target.end(), 1) != sample.target.end();
    });
    if (!any_target) {
      throw InputError(
          fmt::format("{}: no record has a target token after truncation to seq_len = {} (every "
                      "completion is cut off or empty); raise dataset.seq_len or shorten the prompts",
                      path_, seq_len_));
    }
    if (pack_) {
      std::vector<int64_t> lengths;
      for (const Sample& sample : samples_) lengths.push_back(static_cast<int64_t>(sample.tokens.size()));
      windows_ = pack_documents(lengths, seq_len_ + 1);
      log::info(fmt::format("{}: {} documents packed into {} windows of seq_len = {} ({:.2f} per window)", path_,
                            samples_.size(), windows_.size(), seq_len_,
                            static_cast<double>(samples_.size()) / static_cast<double>(windows_.size())));
    }
  }

  int64_t size() const override { return static_cast<int64_t>(pack_ ? windows_.size() : samples_.size()); }
  Sample get(int64_t index) const override {
    if (!pack_) return samples_.at(static_cast<size_t>(index));
    std::vector<const Sample*> documents;
    for (const int64_t d : windows_.at(static_cast<size_t>(index)))
      documents.push_back(&samples_[static_cast<size_t>(d)]);
    return concatenate_documents(documents);
  }
  bool packs_documents() const override { return pack_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }
  bool shuffle() const override { return shuffle_; }

 private:
  std::string path_;
  int64_t seq_len_, vocab_size_ = 0;
  bool completion_only_, shuffle_, pack_;
  LongDocuments long_documents_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  JsonlRecordFormat record_format_{};
  std::vector<Sample> samples_;                // one per record, or per piece of a split record
  std::vector<std::vector<int64_t>> windows_;  // pack: the samples_ each window holds
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, nullptr, "the .jsonl file"},
    {"seq_len", ValueType::Int, "512", "input positions per sample (longer records: long_documents)", 1, 1 << 24},
    {"tokenizer", ValueType::String, "''",
     "a Hugging Face tokenizer.json (or a directory holding one) for text records; '': bytes, BOS 256, EOS 257"},
    {"vocab_size", ValueType::Int, "0",
     "token ids are below this; 0: the tokenizer's vocabulary (258 without one: 256 bytes + BOS + EOS)", 0, 1 << 30},
    {"completion_only_loss", ValueType::Bool, "true",
     "loss on completion tokens only (else every token after the first)"},
    {"skip_bad_lines", ValueType::Bool, "false", "skip malformed lines (counted and reported) instead of failing"},
    {"shuffle", ValueType::Bool, "true", "false: step t takes records t*G .. (t+1)*G - 1 in file order"},
    {"pack", ValueType::Bool, "false",
     "several records per sample (best fit in file order), each with its own positions and attention"},
    {"long_documents", ValueType::String, "'truncate'",
     "a record of more than seq_len + 1 tokens: keep its start, split it into overlapping pieces, or refuse it",
     -kNoLimit, kNoLimit, "truncate|split|refuse"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Dataset, JsonlDataset, "jsonl", "0.1.0", "prompt/completion records from a JSON-lines file",
                      kKeys)
