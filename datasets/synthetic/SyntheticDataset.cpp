// Dataset `synthetic`: deterministic prompt/completion sequences from the run
// seed. The completion counts up from the prompt's last token, a rule a small
// model learns in a few hundred steps; completion lengths are either very
// short or long, so micro-batches differ widely in target tokens and
// completion-only loss is exercised.
//
// Layout: BOS prompt... SEP completion... EOS. Targets: the completion and
// EOS (completion_only_loss = true), or every token after BOS.
#include <algorithm>

#include <fmt/format.h>

#include "trainer/Dataset.h"
#include "trainer/util/Random.h"

namespace {

using namespace trainer;

constexpr int32_t kBos = 1, kSep = 2, kEos = 3, kFirstContent = 4;

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(const Options& options, const Context& context)
      : seq_len_(options.integer("seq_len")),
        vocab_size_(options.integer("vocab_size")),
        size_(options.integer("num_samples")),
        prompt_min_(options.integer("prompt_min")),
        prompt_max_(options.integer("prompt_max")),
        completion_only_(options.boolean("completion_only_loss")),
        shuffle_(options.boolean("shuffle")),
        seed_(context.seed) {
    if (prompt_max_ < prompt_min_) options.fail("prompt_max", fmt::format("at least prompt_min = {}", prompt_min_));
    // BOS + prompt + SEP + at least one completion token + EOS fit in seq_len + 1.
    if (prompt_max_ + 4 > seq_len_ + 1) {
      options.fail("seq_len", fmt::format("at least prompt_max + 3 = {}", prompt_max_ + 3));
    }
  }

  int64_t size() const override { return size_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }
  bool shuffle() const override { return shuffle_; }

  Sample get(int64_t index) const override {
    uint64_t state = seed_ * 0xd1b54a32d192ed03ULL ^ (static_cast<uint64_t>(index) + 1) * 0x9e3779b97f4a7c15ULL;
    const int64_t content = vocab_size_ - kFirstContent;
    const int64_t prompt_len = prompt_min_ + static_cast<int64_t>(uniform_below(state, prompt_max_ - prompt_min_ + 1));
    const int64_t room = seq_len_ + 1 - prompt_len - 3;
    // Half the samples have one or two completion tokens, half fill at least
    // half the room: target counts per sample differ by an order of magnitude.
    const bool long_completion = uniform_below(state, 2) == 1;
    const int64_t short_max = std::min<int64_t>(2, room);
    const int64_t long_min = std::max<int64_t>(1, room / 2);
    const int64_t completion_len = long_completion
                                       ? long_min + static_cast<int64_t>(uniform_below(state, room - long_min + 1))
                                       : 1 + static_cast<int64_t>(uniform_below(state, short_max));

    Sample sample;
    sample.tokens.push_back(kBos);
    int32_t last = 0;
    for (int64_t i = 0; i < prompt_len; ++i) {
      last = static_cast<int32_t>(kFirstContent + uniform_below(state, content));
      sample.tokens.push_back(last);
    }
    sample.tokens.push_back(kSep);
    const size_t completion_start = sample.tokens.size();
    for (int64_t i = 0; i < completion_len; ++i) {
      sample.tokens.push_back(static_cast<int32_t>(kFirstContent + (last - kFirstContent + 1 + i) % content));
    }
    sample.tokens.push_back(kEos);
    sample.target.assign(sample.tokens.size(), completion_only_ ? 0 : 1);
    sample.target[0] = 0;
    std::fill(sample.target.begin() + completion_start, sample.target.end(), 1);
    return sample;
  }

 private:
  int64_t seq_len_, vocab_size_, size_, prompt_min_, prompt_max_;
  bool completion_only_, shuffle_;
  uint64_t seed_;
};

constexpr KeySpec kKeys[] = {
    {"seq_len", ValueType::Int, "32", "input positions per sample (samples are padded to it)", 5, 1 << 20},
    {"vocab_size", ValueType::Int, "64", "token ids are below this (4 special tokens + content)", 8, 1 << 30},
    {"num_samples", ValueType::Int, "65536", "distinct samples per epoch", 1, 1e12},
    {"prompt_min", ValueType::Int, "2", "shortest prompt", 1, 1 << 20},
    {"prompt_max", ValueType::Int, "8", "longest prompt", 1, 1 << 20},
    {"completion_only_loss", ValueType::Bool, "true", "loss on completion tokens only (else on every token)"},
    {"shuffle", ValueType::Bool, "true", "false: step t takes samples t*G .. (t+1)*G - 1 in index order"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Dataset, SyntheticDataset, "synthetic", "0.1.0",
                      "deterministic prompt/completion sequences with a learnable rule", kKeys)
