// The conformance kit's fixture and reference helpers (see Reference.h).
#include "kit/Reference.h"

#include <fmt/format.h>

#include "checkpoint/Checkpoint.h"
#include "recipe/Recipe.h"
#include "run/Sampler.h"
#include "trainer/Errors.h"
#include "trainer/util/Random.h"

namespace trainer::kit {

Fixture fixture(int step, int64_t samples) {
  Fixture f;
  f.ids = torch::zeros({samples, kSeqLen}, torch::kInt64);
  f.labels = torch::full({samples, kSeqLen}, kIgnoreIndex, torch::kInt64);
  for (int64_t row = 0; row < samples; ++row) {
    uint64_t state = (static_cast<uint64_t>(step) << 32) + static_cast<uint64_t>(row) + 1;
    std::vector<int64_t> tokens(kSeqLen + 1);
    for (int64_t& t : tokens) t = static_cast<int64_t>(uniform_below(state, kVocab));
    const int64_t targets = row < samples / 2 ? 1 : kSeqLen;
    for (int64_t i = 0; i < kSeqLen; ++i) {
      f.ids[row][i] = tokens[i];
      if (i >= kSeqLen - targets) f.labels[row][i] = tokens[i + 1];
    }
    f.target_tokens += targets;
  }
  return f;
}

Batch rows(const Fixture& f, const std::vector<int64_t>& indices, torch::Device device) {
  const torch::Tensor index = torch::tensor(indices, torch::kInt64);
  Batch b;
  b.input_ids = f.ids.index_select(0, index).to(device);
  b.labels = f.labels.index_select(0, index).to(device);
  b.target_tokens = (b.labels != kIgnoreIndex).sum().item<int64_t>();
  return b;
}

std::unique_ptr<Model> make_model(PluginRegistry& registry) {
  const LoadedPlugin& plugin = registry.find(PluginKind::Model, "qwen2");
  Context context;
  context.seed = kSeed;
  return PluginRegistry::create<Model>(plugin, plugin_options(plugin, kModel), context);
}

std::unique_ptr<Optimizer> make_optimizer(PluginRegistry& registry, const std::string& name, const Context& context,
                                          const std::vector<std::string>& settings) {
  const LoadedPlugin& plugin = registry.find(PluginKind::Optimizer, name);
  std::string table;
  bool decay_set = false;
  for (const std::string& setting : settings) {
    const size_t equals = setting.find('=');
    if (equals == std::string::npos) {
      throw InputError(fmt::format("--optimizer-set {}: expected KEY=VALUE with a TOML value", setting));
    }
    table += setting.substr(0, equals) + " = " + setting.substr(equals + 1) + "\n";
    decay_set = decay_set || setting.rfind("weight_decay", 0) == 0;
  }
  for (size_t k = 0; k < plugin.descriptor->num_keys; ++k) {
    if (!decay_set && std::string(plugin.descriptor->keys[k].name) == "weight_decay") table += "weight_decay = 0.1\n";
  }
  return PluginRegistry::create<Optimizer>(plugin, plugin_options(plugin, table), context);
}

// ||a - b|| / ||b|| over the slices, comparing each slice with the same
// range of the reference; `mask` (same layout as reference) selects elements.
double relative_error(const std::vector<FlatSlice>& slices, const std::vector<torch::Tensor>& reference,
                      const std::vector<torch::Tensor>* mask) {
  double error = 0, norm = 0;
  for (const FlatSlice& s : slices) {
    torch::Tensor ref = reference.at(s.group).narrow(0, s.offset, s.values.numel());
    torch::Tensor diff = s.values.to(torch::kFloat64) - ref;
    if (mask) {
      const torch::Tensor keep = mask->at(s.group).narrow(0, s.offset, s.values.numel());
      diff = diff * keep;
      ref = ref * keep;
    }
    error += diff.square().sum().item<double>();
    norm += ref.square().sum().item<double>();
  }
  return norm > 0 ? std::sqrt(error / norm) : std::sqrt(error);
}

std::vector<FlatSlice> minus(const std::vector<FlatSlice>& a, const std::vector<torch::Tensor>& before) {
  std::vector<FlatSlice> out;
  for (const FlatSlice& s : a) {
    out.push_back(
        {s.group, s.offset, s.values.to(torch::kFloat64) - before.at(s.group).narrow(0, s.offset, s.values.numel())});
  }
  return out;
}

// The strategy's state and parameter slices equal, bit for bit, the same
// ranges of the checkpoint in `dir`.
bool holds_checkpoint(Strategy& strategy, const std::string& dir, const std::vector<std::string>& state_names) {
  std::vector<std::vector<torch::Tensor>> saved = {checkpoint_state(dir, "values")};
  for (const std::string& name : state_names) saved.push_back(checkpoint_state(dir, name));
  const auto same = [&](size_t k, size_t group, int64_t offset, const torch::Tensor& held) {
    const std::vector<torch::Tensor>& whole = saved[k];
    return group < whole.size() && offset + held.numel() <= whole[group].numel() &&
           torch::equal(held.to(torch::kCPU), whole[group].narrow(0, offset, held.numel()));
  };
  for (const StateSlice& s : strategy.state_slices()) {
    if (s.state.size() != state_names.size() || !same(0, s.group, s.offset, s.values)) return false;
    for (size_t k = 0; k < s.state.size(); ++k) {
      if (!same(k + 1, s.group, s.offset, s.state[k].to(torch::kFloat32))) return false;
    }
  }
  for (const FlatSlice& s : strategy.parameter_slices()) {
    if (!same(0, s.group, s.offset, s.values)) return false;
  }
  return true;
}

std::vector<const void*> replay_addresses(Model& model, const std::string& name, const std::string& claim,
                                          const std::string& when, bool gradients) {
  std::vector<const void*> where;
  for (const NamedParameter& p : model.parameters()) {
    if (p.tensor.numel() > 0 && p.tensor.storage().nbytes() == 0) {
      throw TrainingError(
          fmt::format("strategy '{}': declares {} but parameter '{}' holds no memory {}; a CUDA "
                      "graph's replay would read an address it no longer owns (trainer/Strategy.h)",
                      name, claim, p.name, when));
    }
    where.push_back(p.tensor.data_ptr());
    if (gradients) where.push_back(p.tensor.grad().defined() ? p.tensor.grad().data_ptr() : nullptr);
  }
  return where;
}

// One optimizer step of the strategy on this rank's part of the fixture.
double strategy_step(Strategy& strategy, Model& model, const Fixture& f, const Split& split, int rank,
                     torch::Device device, const std::string& name) {
  const BatchShape shape{split.micro, split.accum, split.world};
  std::vector<int64_t> all(kGlobalBatch);
  for (int64_t i = 0; i < kGlobalBatch; ++i) all[i] = i;
  for (int64_t m = 0; m < split.accum; ++m) {
    const MicroStep micro{m, m == split.accum - 1, split.accum, f.target_tokens};
    // A micro-step the strategy declares replayable is captured once in a
    // CUDA graph, whose replays read and add into the addresses its capture
    // saw: its parameters and bound gradients must stay where they are.
    const bool replayable = strategy.replayable_micro_step(micro);
    const std::string claim = fmt::format("micro-step {} replayable (replayable_micro_step)", m);
    const auto addresses = [&] { return replay_addresses(model, name, claim, "there", /*gradients=*/true); };
    const std::vector<const void*> before = replayable ? addresses() : std::vector<const void*>{};
    const LossSum out = strategy.forward(model, rows(f, local_micro_batch(all, shape, rank, m), device));
    strategy.backward(out.loss_sum / static_cast<double>(f.target_tokens), micro);
    if (replayable && addresses() != before) {
      throw TrainingError(fmt::format(
          "strategy '{}': declares {} but a parameter's or its gradient's memory moved during its forward and "
          "backward; a CUDA graph's replay reads and adds into the addresses its capture saw (trainer/Strategy.h)",
          name, claim));
    }
  }
  return strategy.reduce_gradients_and_norm();
}

}  // namespace trainer::kit
