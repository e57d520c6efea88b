// Dataset `@NAME@`: `num_samples` sequences that count up by one modulo the
// vocabulary, each from its own start token; every token but the first is a
// target. A model learns it in a few dozen steps.
//
// get() must be a pure function of the index (and of what the constructor
// read): the core picks indices on every rank from the run seed, and exact
// resume replays them.
#include <iterator>

#include <fmt/format.h>

#include "trainer/Dataset.h"

namespace {

using namespace trainer;

class @CLASS@ final : public Dataset {
 public:
  explicit @CLASS@(const Options& options)
      : size_(options.integer("num_samples")),
        seq_len_(options.integer("seq_len")),
        vocab_size_(options.integer("vocab_size")) {
    // Checks across keys belong here; Options::fail names the file and key.
    if (vocab_size_ < 2) options.fail("vocab_size", fmt::format("at least 2, got {}", vocab_size_));
  }

  int64_t size() const override { return size_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }

  // seq_len + 1 tokens: the model reads the first seq_len and predicts the
  // next token at each; target[i] = 1 makes token i count in the loss.
  Sample get(int64_t index) const override {
    Sample sample;
    const int64_t start = (index * 7) % vocab_size_;
    for (int64_t i = 0; i <= seq_len_; ++i) sample.tokens.push_back(static_cast<int32_t>((start + i) % vocab_size_));
    sample.target.assign(sample.tokens.size(), 1);
    sample.target[0] = 0;
    return sample;
  }

 private:
  int64_t size_, seq_len_, vocab_size_;
};

constexpr KeySpec kKeys[] = {
    {"num_samples", ValueType::Int, "256", "sequences in the dataset", 1, 1e12},
    {"seq_len", ValueType::Int, "32", "tokens a model reads per sequence", 1, 1 << 20},
    {"vocab_size", ValueType::Int, "64", "tokens count modulo this", 1, 1 << 30},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Dataset, @CLASS@, "@NAME@", "0.1.0", "sequences that count up modulo the vocabulary", kKeys)
