// The conformance kit's fixture and its fp64 reference. Fixture: the qwen2
// plugin at a small size and a global batch of 8 samples whose
// target-token counts are 1 (first half) or 24 (second half). Reference:
// the same model in fp64, one process, the whole global batch in one
// forward pass, gradient of (sum of token losses) / N.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "kit/Conformance.h"
#include "plugin/PluginRegistry.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/OptimizerShards.h"

namespace trainer::kit {

inline constexpr int64_t kGlobalBatch = 8;
inline constexpr int64_t kSeqLen = 24;
inline constexpr int64_t kVocab = 32;
inline constexpr int kSteps = 5;
inline constexpr double kLr = 1e-2;
inline constexpr uint64_t kSeed = 11;
inline constexpr const char* kModel =
    "vocab_size = 32\nhidden_size = 16\nintermediate_size = 24\nnum_hidden_layers = 2\n"
    "num_attention_heads = 4\nnum_key_value_heads = 2\n";

// The fixture batch of optimizer step `step`: random tokens, the last 1 or
// 24 positions are targets.
struct Fixture {
  torch::Tensor ids, labels;  // [8, seq], CPU
  int64_t target_tokens = 0;
};

Fixture fixture(int step, int64_t samples = kGlobalBatch);

/// Rows `indices` of the fixture as a batch on `device`.
Batch rows(const Fixture& f, const std::vector<int64_t>& indices, torch::Device device);

/// The kit's qwen2 model, seeded: the same initial weights on every rank.
std::unique_ptr<Model> make_model(PluginRegistry& registry);

/// The optimizer `name` (a name or path) with the kit's settings: its
/// defaults, weight decay 0.1 where it has the key (so that decay is
/// exercised), and `settings` (TOML lines) over them.
std::unique_ptr<Optimizer> make_optimizer(PluginRegistry& registry, const std::string& name, const Context& context,
                                          const std::vector<std::string>& settings = {});

// The fp64 single-process reference: flat fp64 groups laid out exactly as
// flatten_parameters lays out the strategy's fp32 ones.
// The optimizer's own step, in fp64, on the whole model at one rank.
class Reference {
 public:
  Reference(PluginRegistry& registry, Optimizer& optimizer, torch::Device device) : model_(make_model(registry)) {
    groups_ = flatten_parameters(model_->parameters(), device, 1, torch::kFloat64);
    shards_ = OptimizerShards::viewing(optimizer, groups_, 0, 1);
    for (size_t g = 0; g < groups_.size(); ++g) {
      grads_.push_back(shards_.groups()[g].gradient);
      bind_gradients(groups_[g], grads_.back());
    }
    device_ = device;
  }

  // Gradient of the whole global batch; returns its norm.
  double gradient(const Fixture& f) {
    for (torch::Tensor& g : grads_) g.zero_();
    std::vector<int64_t> all(kGlobalBatch);
    for (int64_t i = 0; i < kGlobalBatch; ++i) all[i] = i;
    const LossSum out = model_->forward(rows(f, all, device_));
    (out.loss_sum / static_cast<double>(f.target_tokens)).backward();
    double squares = 0;
    for (const torch::Tensor& g : grads_) squares += squared_norm(g);
    return std::sqrt(squares);
  }

  void update(double scale, int64_t step) { shards_.update(UpdateArgs{kLr, scale, step}, nullptr); }

  const std::vector<torch::Tensor>& grads() const { return grads_; }
  std::vector<torch::Tensor> values() const {
    std::vector<torch::Tensor> out;
    for (const ParameterGroup& g : groups_) out.push_back(g.values.clone());
    return out;
  }

 private:
  std::unique_ptr<Model> model_;
  std::vector<ParameterGroup> groups_;
  OptimizerShards shards_;
  std::vector<torch::Tensor> grads_;  // shards_'s, bound as the parameters' .grad
  torch::Device device_ = torch::kCPU;
};

/// ||a - b|| / ||b|| over the slices, comparing each slice with the same
/// range of the reference; `mask` (same layout as reference) selects elements.
double relative_error(const std::vector<FlatSlice>& slices, const std::vector<torch::Tensor>& reference,
                      const std::vector<torch::Tensor>* mask = nullptr);

/// Each slice minus the same range of `before`, in fp64.
std::vector<FlatSlice> minus(const std::vector<FlatSlice>& a, const std::vector<torch::Tensor>& before);

/// The strategy's state and parameter slices equal, bit for bit, the same
/// ranges of the checkpoint in `dir` (`state_names`: the optimizer's).
bool holds_checkpoint(Strategy& strategy, const std::string& dir, const std::vector<std::string>& state_names);

/// Where each parameter keeps its memory (with `gradients`, also its bound
/// gradient's, or null), for a strategy that declared `claim` (work a CUDA
/// graph may replay, whose replays read the addresses its capture saw); a
/// parameter holding no memory `when` is a TrainingError naming `name`.
std::vector<const void*> replay_addresses(Model& model, const std::string& name, const std::string& claim,
                                          const std::string& when, bool gradients);

/// One optimizer step of the strategy on this rank's part of the fixture;
/// returns the norm it reports. A micro-step the strategy declares
/// replayable (Strategy::replayable_micro_step) must leave every parameter
/// and bound gradient where it found them: else a TrainingError naming
/// `name`, the strategy.
double strategy_step(Strategy& strategy, Model& model, const Fixture& f, const Split& split, int rank,
                     torch::Device device, const std::string& name);

}  // namespace trainer::kit
