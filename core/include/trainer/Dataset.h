// The dataset plugin interface: numbered samples of token ids with a mask of
// which tokens count in the loss. No LibTorch here; the core collates.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/Plugin.h"

namespace trainer {

/// One training sequence. tokens[i] is predicted from tokens[0..i-1] and
/// counts in the loss when target[i] != 0 (target[0] is ignored). At most
/// seq_len() + 1 tokens: the model sees tokens[0..n-2] as inputs.
///
/// A packed sample holds several documents back to back: document_starts
/// lists where each begins (ascending, the first 0, each below
/// tokens.size()); empty means one document. Each document's positions
/// start at 0, attention never crosses a start, and the first token of a
/// document is never a target (nothing before it in its document predicts
/// it); the core enforces all three whatever target says.
struct Sample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> target;
  std::vector<int64_t> document_starts;
};

/// A finite, indexable set of samples. get() must be deterministic in its
/// index (and the dataset's options) and safe to call from any thread.
class Dataset : public Component {
 public:
  ~Dataset() override;
  /// Number of distinct samples; the sampler walks epochs over [0, size()).
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;
  /// Input positions per sample after collation (padding up to it).
  virtual int64_t seq_len() const = 0;
  /// One more than the largest token id get() can return.
  virtual int64_t vocab_size() const = 0;
  /// false: step t takes samples t*G .. (t+1)*G - 1 in order (wrapping), for
  /// curricula and for comparing with other frameworks sample by sample.
  virtual bool shuffle() const { return true; }
  /// true when get() may return several documents in one sample (packing):
  /// the run then needs a model that keeps documents apart
  /// (Model::separates_documents) and refuses one that does not.
  virtual bool packs_documents() const { return false; }
};

}  // namespace trainer
