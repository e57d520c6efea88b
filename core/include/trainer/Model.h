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
  std::string name;      ///< as Hugging Face names it, e.g. "model.norm.weight"
  torch::Tensor tensor;  ///< a leaf that requires grad
  bool decay = true;     ///< weight decay applies (matrices), or not (biases, norms)
};

/// One micro-batch after collation: [batch, seq_len] int64 tensors on the
/// run's device. labels[b][i] is the token predicted at input position i, or
/// kIgnoreIndex where it does not count.
struct Batch {
  torch::Tensor input_ids;
  torch::Tensor labels;
  int64_t target_tokens = 0;  ///< labels != kIgnoreIndex
  /// Packed samples only (undefined otherwise), [batch, seq] int64 like
  /// input_ids: each input's position within its document (from 0), and
  /// its document's number within the row (from 0; padding after the last
  /// document has a number of its own). A model attends from one input to
  /// another only within one document.
  torch::Tensor position_ids;
  torch::Tensor document_ids;
  /// Packed samples only, the same documents as a variable-length attention
  /// kernel takes them: where each document (padding included) starts in
  /// the rows laid end to end, int32 [documents + 1] from 0 to batch * seq,
  /// on the run's device; and the longest one's length. Optional: a model
  /// given document_ids without them masks instead (same result, slower).
  torch::Tensor document_offsets;
  int64_t longest_document = 0;
};

inline constexpr int64_t kIgnoreIndex = -100;

/// The result of a forward pass over one micro-batch.
struct LossSum {
  torch::Tensor loss_sum;     ///< scalar: sum of per-token losses over targets (fp32 or wider), with graph
  int64_t target_tokens = 0;  ///< number of target tokens it sums over
};

/// What a step's forward and backward cost: per input token (every
/// position the model runs), per target token (positions with a label),
/// and per attended pair: attention's work for one (query, key) pair of
/// positions of one document (or unpacked sample), counted over every pair,
/// not halved for causality (the field's convention). A document of d
/// input positions has d^2 pairs: a packed window costs the sum of its
/// documents' squares, not its length squared.
struct TrainingFlops {
  double per_input_token = 0.0;
  double per_target_token = 0.0;
  double per_attended_pair = 0.0;
};

/// Parameters that run together in forward: the embedding, one block, the
/// head. Strategies that shard parameters (zero3) gather one unit at a time.
struct ParameterUnit {
  std::string name;
  std::vector<size_t> parameters;  ///< indices into Model::parameters(), ascending
};

/// Told by the model around each unit's forward (installed by a strategy).
class UnitHooks {
 public:
  virtual ~UnitHooks();
  /// Before the unit's parameters are used; they must be usable on return.
  virtual void before_unit(size_t unit) = 0;
  /// After the unit's last use of its parameters in forward; `output` is the
  /// tensor through which every gradient of the unit flows. Returns it (or a
  /// tensor equal to it) for the model to continue with.
  virtual torch::Tensor after_unit(size_t unit, const torch::Tensor& output) = 0;
};

/// Models are used from one thread.
class Model : public Component {
 public:
  ~Model() override;
  /// All trainable parameters, in a fixed order. Same order on every rank.
  virtual std::vector<NamedParameter> parameters() = 0;
  virtual LossSum forward(const Batch& batch) = 0;
  virtual int64_t vocab_size() const = 0;
  /// The units, in forward order, covering every parameter once. A model
  /// that declares units brackets each unit's forward with enter_unit and
  /// leave_unit, entering every unit in this order in every forward on
  /// every rank, whatever the data: zero3 gathers each unit with a
  /// collective, and refuses a unit skipped or entered out of order.
  /// Parameters a forward does not use (a mixture of experts' idle experts,
  /// an early exit) are fine for ddp, zero1 and zero2: their gradient counts
  /// as zero, and every rank reduces the same buckets in the same order.
  /// Default: none declared (parameter sharding unsupported).
  virtual std::vector<ParameterUnit> units() { return {}; }

  /// Logits [batch, seq, vocab] for `input_ids` (no loss), for checking a
  /// model against another implementation. Default: unsupported.
  virtual torch::Tensor logits(const torch::Tensor& input_ids);
  /// The model's Hugging Face config.json, for exporting weights; "" when
  /// the model has no Hugging Face equivalent.
  virtual std::string hf_config() const { return ""; }
  /// Training FLOPs (forward and backward) the model executes, for MFU in
  /// the metrics: per input token, per target token for work done only for
  /// targets (a head that computes logits for target rows alone), and per
  /// attended pair (TrainingFlops). Zeros when unknown.
  virtual TrainingFlops training_flops() const { return {}; }

  /// true when forward() honours Batch::position_ids and document_ids
  /// (attention within a document, positions from its start): a packing
  /// dataset is refused with a model that does not.
  virtual bool separates_documents() const { return false; }

  /// Installs (or, with nullptr, removes) the hooks; not owned.
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

 protected:
  void enter_unit(size_t unit) {
    if (unit_hooks_) unit_hooks_->before_unit(unit);
  }
  torch::Tensor leave_unit(size_t unit, const torch::Tensor& output) {
    return unit_hooks_ ? unit_hooks_->after_unit(unit, output) : output;
  }

 private:
  UnitHooks* unit_hooks_ = nullptr;
};

}  // namespace trainer
