// The model plugin interface: parameters with names and a forward pass that
// returns a loss *sum* and a target-token count, never a mean (the
// accumulation contract, DESIGN.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Plugin.h"

namespace trainer {

/// A parameter as the model owns it. Strategies may move its data into flat
/// buffers with Tensor::set_data(), so a model must keep using these same
/// tensor objects in forward() and never re-create them.
struct NamedParameter {
  std::string name;       ///< as Hugging Face names it, e.g. "model.norm.weight"
  torch::Tensor tensor;   ///< a leaf that requires grad
  bool decay = true;      ///< weight decay applies (matrices), or not (biases, norms)
};

/// One micro-batch after collation: [batch, seq_len] int64 tensors on the
/// run's device. labels[b][i] is the token predicted at input position i, or
/// kIgnoreIndex where it does not count.
struct Batch {
  torch::Tensor input_ids;
  torch::Tensor labels;
  int64_t target_tokens = 0;  ///< labels != kIgnoreIndex
};

inline constexpr int64_t kIgnoreIndex = -100;

/// The result of a forward pass over one micro-batch.
struct LossSum {
  torch::Tensor loss_sum;     ///< scalar: sum of per-token losses over targets (fp32 or wider), with graph
  int64_t target_tokens = 0;  ///< number of target tokens it sums over
};

/// Models are used from one thread.
class Model : public Component {
 public:
  ~Model() override;
  /// All trainable parameters, in a fixed order. Same order on every rank.
  virtual std::vector<NamedParameter> parameters() = 0;
  virtual LossSum forward(const Batch& batch) = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace trainer
