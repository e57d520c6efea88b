// The conformance kit, one file because its fixture, its fp64 reference and
// its checks are only read together. Fixture: the qwen2 plugin at a small size and a global
// batch of 8 samples whose target-token counts are 1 (first half) or 24
// (second half), so micro-batches of every split differ by at least 20x in
// target tokens: averaging per micro-batch, dropping micro-batches or
// dividing twice all move the gradient far beyond rounding.
//
// Reference: the same model in fp64, one process, the whole global batch in
// one forward pass, gradient of (sum of token losses) / N.
#include "Conformance.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "Checkpoint.h"
#include "ExactGradients.h"
#include "Files.h"
#include "Manifest.h"
#include "Metrics.h"
#include "Recipe.h"
#include "Rendezvous.h"
#include "ReproducibleMode.h"
#include "RunOutputs.h"
#include "Sampler.h"
#include "trainer/FlatParameters.h"
#include "trainer/JsonSupport.h"
#include "trainer/Log.h"
#include "trainer/Random.h"
#include "trainer/ShardedAdamW.h"
#include "trainer/Strategy.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSeqLen = 24;
constexpr int64_t kVocab = 32;
constexpr int kSteps = 5;
constexpr double kLr = 1e-2;
constexpr uint64_t kSeed = 11;
constexpr const char* kModel =
    "vocab_size = 32\nhidden_size = 16\nintermediate_size = 24\nnum_hidden_layers = 2\n"
    "num_attention_heads = 4\nnum_key_value_heads = 2\n";

// The fixture batch of optimizer step `step`: random tokens, the last 1 or
// 24 positions are targets.
struct Fixture {
  torch::Tensor ids, labels;  // [8, seq], CPU
  int64_t target_tokens = 0;
};

Fixture fixture(int step, int64_t samples = kGlobalBatch) {
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

// The fp64 single-process reference: flat fp64 groups laid out exactly as
// flatten_parameters lays out the strategy's fp32 ones.
class Reference {
 public:
  Reference(PluginRegistry& registry, torch::Device device) : model_(make_model(registry)) {
    groups_ = flatten_parameters(model_->parameters(), device, 1, torch::kFloat64);
    for (ParameterGroup& group : groups_) {
      grads_.push_back(torch::zeros_like(group.values));
      bind_gradients(group, grads_.back());
      states_.push_back(adamw_init(group.values));
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

  void update(double scale, const AdamWConfig& config, int64_t step) {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      grads_[g].mul_(scale);
      adamw_update(groups_[g].values, grads_[g], states_[g], config, groups_[g].decay, kLr, step);
    }
  }

  const std::vector<torch::Tensor>& grads() const { return grads_; }
  std::vector<torch::Tensor> values() const {
    std::vector<torch::Tensor> out;
    for (const ParameterGroup& g : groups_) out.push_back(g.values.clone());
    return out;
  }

 private:
  std::unique_ptr<Model> model_;
  std::vector<ParameterGroup> groups_;
  std::vector<torch::Tensor> grads_;
  std::vector<AdamWState> states_;
  torch::Device device_ = torch::kCPU;
};

// ||a - b|| / ||b|| over the slices, comparing each slice with the same
// range of the reference; `mask` (same layout as reference) selects elements.
double relative_error(const std::vector<FlatSlice>& slices, const std::vector<torch::Tensor>& reference,
                      const std::vector<torch::Tensor>* mask = nullptr) {
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
bool holds_checkpoint(Strategy& strategy, const std::string& dir) {
  const char* names[] = {"values", "exp_avg", "exp_avg_sq"};
  std::vector<std::vector<torch::Tensor>> saved;
  for (const char* name : names) saved.push_back(checkpoint_state(dir, name));
  const auto same = [&](int k, size_t group, int64_t offset, const torch::Tensor& held) {
    const std::vector<torch::Tensor>& whole = saved[k];
    return group < whole.size() && offset + held.numel() <= whole[group].numel() &&
           torch::equal(held.to(torch::kCPU), whole[group].narrow(0, offset, held.numel()));
  };
  for (const StateSlice& s : strategy.state_slices()) {
    if (!same(0, s.group, s.offset, s.values) || !same(1, s.group, s.offset, s.exp_avg) ||
        !same(2, s.group, s.offset, s.exp_avg_sq)) {
      return false;
    }
  }
  for (const FlatSlice& s : strategy.parameter_slices()) {
    if (!same(0, s.group, s.offset, s.values)) return false;
  }
  return true;
}

// One optimizer step of the strategy on this rank's part of the fixture.
double strategy_step(Strategy& strategy, Model& model, const Fixture& f, const Split& split, int rank,
                     torch::Device device) {
  const BatchShape shape{split.micro, split.accum, split.world};
  std::vector<int64_t> all(kGlobalBatch);
  for (int64_t i = 0; i < kGlobalBatch; ++i) all[i] = i;
  for (int64_t m = 0; m < split.accum; ++m) {
    const LossSum out = strategy.forward(model, rows(f, local_micro_batch(all, shape, rank, m), device));
    strategy.backward(out.loss_sum / static_cast<double>(f.target_tokens),
                      MicroStep{m, m == split.accum - 1, split.accum, f.target_tokens});
  }
  return strategy.reduce_gradients_and_norm();
}

// bf16 compute with 16 accumulation steps at world size 1. The strategy's
// accumulated gradient is compared with the exact (fp64) sum of the same
// bf16 micro-step gradients, recomputed here one micro-batch at a time.
// Adding k terms in a precision with unit roundoff u errs by at most
// (k - 1) u sum_j |g_j| per element (first order; Higham, Accuracy and
// Stability, 4.2), so in norm by (k - 1) u ||sum_j |g_j| ||: with fp32's
// u = 2^-24 that is about 1e-6 relative here, with bf16's u = 2^-8 about 6%.
void bf16_accumulation_check(PluginRegistry& registry, const LoadedPlugin& plugin, Comm& comm, torch::Device device,
                             ConformanceRow& row) {
  constexpr int64_t kMicroSteps = 16;
  const Fixture f = fixture(0, kMicroSteps);
  Context context;
  std::unique_ptr<Model> model = make_model(registry);
  std::unique_ptr<Strategy> strategy = PluginRegistry::create<Strategy>(plugin, plugin_options(plugin, ""), context);
  strategy->setup(*model, comm, StrategyEnv{device, AdamWConfig{}, torch::kBFloat16});
  for (int64_t m = 0; m < kMicroSteps; ++m) {
    const LossSum out = strategy->forward(*model, rows(f, {m}, device));
    strategy->backward(out.loss_sum / static_cast<double>(f.target_tokens),
                       MicroStep{m, m == kMicroSteps - 1, kMicroSteps, f.target_tokens});
  }
  strategy->reduce_gradients_and_norm();

  std::unique_ptr<Model> twin = make_model(registry);
  std::vector<ParameterGroup> groups =
      flatten_parameters(twin->parameters(), device, 1, torch::kFloat32, torch::kBFloat16);
  std::vector<torch::Tensor> grads, exact, magnitude;
  for (ParameterGroup& group : groups) {
    grads.push_back(torch::zeros_like(group.compute));
    bind_gradients(group, grads.back());
    exact.push_back(torch::zeros(group.values.sizes(), group.values.options().dtype(torch::kFloat64)));
    magnitude.push_back(torch::zeros_like(exact.back()));
  }
  for (int64_t m = 0; m < kMicroSteps; ++m) {
    for (torch::Tensor& g : grads) g.zero_();
    const LossSum out = twin->forward(rows(f, {m}, device));
    (out.loss_sum / static_cast<double>(f.target_tokens)).backward();
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < grads.size(); ++g) {
      exact[g] += grads[g].to(torch::kFloat64);
      magnitude[g] += grads[g].to(torch::kFloat64).abs();
    }
  }
  double error = 0, norm = 0, spread = 0;
  for (const FlatSlice& slice : strategy->gradient_slices()) {
    const torch::Tensor ref = exact.at(slice.group).narrow(0, slice.offset, slice.values.numel());
    error += (slice.values.to(torch::kFloat64) - ref).square().sum().item<double>();
    norm += ref.square().sum().item<double>();
    spread += magnitude.at(slice.group).narrow(0, slice.offset, slice.values.numel()).square().sum().item<double>();
  }
  row.bf16_error = std::sqrt(error / norm);
  // 1% slack for the bound's own fp64 arithmetic.
  row.bf16_bound = 1.01 * (kMicroSteps - 1) * std::ldexp(1.0, -24) * std::sqrt(spread / norm);
}

}  // namespace

std::string Split::text() const {
  return shard_group > 0 ? fmt::format("{}x{}x{}g{}", micro, accum, world, shard_group)
                         : fmt::format("{}x{}x{}", micro, accum, world);
}

std::string Split::argument() const {
  return shard_group > 0 ? fmt::format("{},{},{},{}", micro, accum, world, shard_group)
                         : fmt::format("{},{},{}", micro, accum, world);
}

std::string Split::options() const {
  return shard_group > 0 ? fmt::format("shard_group_size = {}\n", shard_group) : "";
}

Split parse_split(const std::string& text) {
  Split s;
  char extra = 0;
  const int fields = std::sscanf(text.c_str(), "%ld,%ld,%d,%d%c", &s.micro, &s.accum, &s.world, &s.shard_group, &extra);
  if ((fields != 3 && fields != 4) || s.micro < 1 || s.accum < 1 || s.world < 1 ||
      s.micro * s.accum * s.world != kGlobalBatch || (fields == 4 && (s.shard_group < 1 || s.world % s.shard_group))) {
    throw InputError(fmt::format(
        "--split {}: expected micro,accum,world with micro x accum x world = {}, or micro,accum,world,shard_group_size "
        "with a shard group size that divides the world size",
        text, kGlobalBatch));
  }
  return s;
}

std::vector<Split> default_splits(const LoadedPlugin& strategy) {
  std::vector<Split> splits = {{8, 1, 1}, {2, 4, 1}, {1, 8, 1}, {4, 1, 2}, {2, 2, 2}, {1, 2, 4}};
  for (size_t k = 0; k < strategy.descriptor->num_keys; ++k) {
    if (std::string(strategy.descriptor->keys[k].name) == kShardGroupSizeKey.name) {
      splits.push_back({1, 2, 4, 2});
      splits.push_back({2, 2, 2, 1});
    }
  }
  return splits;
}

void run_conformance_worker(PluginRegistry& registry, const ConformanceRequest& request, const Split& split,
                            const WorldInfo& world, const std::string& rank_report) {
  const torch::Device device = request.device == "cuda" ? torch::Device(torch::kCUDA, world.local_rank) : torch::kCPU;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(request.timeout_s * 1000));
  std::unique_ptr<Comm> comm = connect_world(registry, request.backend, world, timeout, device,
                                             request.strategy + "/" + split.text(), request.backend_at_one_rank);
  const LoadedPlugin& plugin = registry.find(PluginKind::Strategy, request.strategy);
  Context context;
  context.rank = world.rank;
  context.world_size = world.world_size;
  auto fresh_strategy = [&] {
    return PluginRegistry::create<Strategy>(plugin, plugin_options(plugin, split.options()), context);
  };
  const AdamWConfig adamw{0.9, 0.999, 1e-8, 0.1};

  ConformanceRow row;
  row.split = split.text();
  row.rank = world.rank;

  // 1. The gradient after accumulation, against the fp64 reference.
  Reference reference(registry, device);
  const Fixture first = fixture(0);
  const double reference_norm = reference.gradient(first);
  {
    std::unique_ptr<Model> model = make_model(registry);
    std::unique_ptr<Strategy> strategy = fresh_strategy();
    strategy->setup(*model, *comm, StrategyEnv{device, adamw});
    // What checkpoints and the final weights need of the slices' layout.
    check_state_coverage(*strategy, *model, *comm, device, plugin.descriptor->name);
    const double norm = strategy_step(*strategy, *model, first, split, world.rank, device);
    // fp32 gradients of sums of ~100 token losses: relative rounding ~1e-7,
    // amplified at most tenfold by the network's depth; 1e-5 leaves margin
    // while any contract violation on this fixture costs > 1e-2.
    row.grad_error = relative_error(strategy->gradient_slices(), reference.grads());
    row.norm_error = std::abs(norm - reference_norm) / reference_norm;
  }

  // 5 (checked here, on the first fixture). Reproducible mode: the exact
  // sum of per-sample gradients, written into the strategy, matches the
  // reference as closely as the plain sum (its precision: ExactGradients.h),
  // and is the same bits at every split; check_plugin compares the hashes.
  try {
    const ReproducibleSettings settings;
    std::unique_ptr<Model> model = make_model(registry);
    std::unique_ptr<Strategy> strategy = fresh_strategy();
    strategy->setup(*model, *comm, StrategyEnv{device, adamw});
    ExactGradients exact(*model, kGlobalBatch, device);
    const int64_t count = split.micro * split.accum;
    run_exact_passes(exact, *strategy, *comm, count, [&](int64_t k) {
      const LossSum out = strategy->forward(*model, rows(first, {world.rank * count + k}, device));
      strategy->backward(out.loss_sum / static_cast<double>(first.target_tokens),
                         MicroStep{k, k == count - 1, count, first.target_tokens});
    });
    const std::vector<torch::Tensor> gradient = exact.reduce(*comm);
    install_gradient(*strategy, gradient, plugin.descriptor->name, /*probe=*/true);
    row.reproducible_error = relative_error(strategy->gradient_slices(), reference.grads());
    std::vector<torch::Tensor> host;
    for (const torch::Tensor& g : gradient) host.push_back(g.cpu().contiguous());
    // 13 hex digits: 52 bits, which a JSON number carries exactly.
    row.reproducible_hash = static_cast<double>(std::stoull(tensors_xxh3(host).substr(0, 13), nullptr, 16));
  } catch (const TrainingError& error) {
    // The mode refused this strategy (e.g. gradient slices that are copies): a failed row, with the reason.
    log::error(fmt::format("reproducible mode: {}", error.what()));
    row.reproducible_error = row.reproducible_hash = -2;
  }

  // 2. Parameters after 5 AdamW steps with clipping at a tenth of the raw norm.
  const double max_norm = 0.1 * reference_norm;
  struct Trained {
    std::unique_ptr<Model> model;
    std::unique_ptr<Strategy> strategy;
    std::vector<torch::Tensor> values;  // parameter_slices' values after the steps, copied
  };
  auto train_steps = [&](const LoadedPlugin& which, Reference* ref, std::vector<torch::Tensor>* min_ratio) {
    Trained t;
    t.model = make_model(registry);
    t.strategy = PluginRegistry::create<Strategy>(
        which, plugin_options(which, &which == &plugin ? split.options() : ""), context);
    t.strategy->setup(*t.model, *comm, StrategyEnv{device, adamw});
    for (int step = 0; step < kSteps; ++step) {
      const Fixture f = fixture(step);
      const double norm = strategy_step(*t.strategy, *t.model, f, split, world.rank, device);
      t.strategy->apply_update(UpdateArgs{kLr, clip_coefficient(norm, max_norm), step + 1});
      if (!ref) continue;
      const double ref_norm = ref->gradient(f);
      for (size_t g = 0; g < ref->grads().size(); ++g) {
        const torch::Tensor& grad = ref->grads()[g];
        const torch::Tensor ratio = grad.abs() / grad.square().mean().sqrt().clamp_min(1e-300);
        if (min_ratio->size() <= g) {
          min_ratio->push_back(ratio);
        } else {
          (*min_ratio)[g] = torch::minimum((*min_ratio)[g], ratio);
        }
      }
      ref->update(clip_coefficient(ref_norm, max_norm), adamw, step + 1);
    }
    for (const FlatSlice& slice : t.strategy->parameter_slices()) t.values.push_back(slice.values.clone());
    return t;
  };
  {
    Reference ref(registry, device);
    const std::vector<torch::Tensor> start = ref.values();
    std::vector<torch::Tensor> min_ratio;  // per element: min over steps of |g_ref| / rms(g_ref) of its group
    const Trained trained = train_steps(plugin, &ref, &min_ratio);
    const std::vector<FlatSlice> slices = trained.strategy->parameter_slices();
    const std::vector<torch::Tensor>& values = trained.values;
    // Adam divides by sqrt(v): an element whose true gradient is ~0 (e.g. the
    // key bias, to which softmax is invariant) gets an update of size lr
    // driven by rounding noise, with a sign fp32 and fp64 need not share.
    // Such elements (|g_ref| below 1e-4 of their group's RMS at some step)
    // are left out; their share is reported. Elsewhere fp32 rounding of the
    // gradient (~1e-6) passes through five steps of Adam's normalisation.
    std::vector<torch::Tensor> mask;
    double masked = 0, total = 0;
    for (const torch::Tensor& r : min_ratio) {
      mask.push_back((r >= 1e-4).to(torch::kFloat64));
      masked += (r < 1e-4).sum().item<double>();
      total += static_cast<double>(r.numel());
    }
    std::vector<torch::Tensor> reference_change;
    const std::vector<torch::Tensor> end = ref.values();
    for (size_t g = 0; g < end.size(); ++g) reference_change.push_back(end[g] - start[g]);
    row.param_error = relative_error(minus(slices, start), reference_change, &mask);
    row.masked = masked / total;

    // 3. World size 1: the same arithmetic as ddp, so the same bits.
    row.identical_to_ddp = -1;
    if (world.world_size == 1) {
      const std::vector<torch::Tensor> ddp_values =
          train_steps(registry.find(PluginKind::Strategy, "ddp"), nullptr, nullptr).values;
      bool same = ddp_values.size() == values.size();
      for (size_t i = 0; same && i < values.size(); ++i) same = torch::equal(values[i], ddp_values[i]);
      row.identical_to_ddp = same ? 1 : 0;
    }

    // 4. What a strategy must get right besides gradients. The consolidated
    // final weights (as `trainer run` exports them) against the reference;
    // a checkpoint of the trained state, read back, holds this rank's state
    // bit for bit; the previous split's checkpoint (usually another world
    // size) loads into a fresh strategy of this split as the same bits.
    const std::vector<torch::Tensor> full =
        consolidated_parameters(*trained.model, *trained.strategy, *comm, device, world.rank == 0);
    if (world.rank == 0) {
      std::vector<FlatSlice> whole;
      for (size_t g = 0; g < full.size(); ++g) whole.push_back({g, 0, full[g].to(start.at(g).device())});
      row.final_weights_error = relative_error(minus(whole, start), reference_change, &mask);
    }
    const fs::path checkpoints = fs::path(rank_report).parent_path() / "checkpoints";
    Checkpointer checkpointer(checkpoints.string(), 1, "conformance", plugin.descriptor->name);
    const std::string saved =
        checkpointer.save(*trained.strategy, *trained.model, *comm, TrainingPosition{kSteps, kSteps, {}});
    row.checkpoint_saved = holds_checkpoint(*trained.strategy, saved) ? 1 : 0;
    if (!request.load_checkpoint.empty()) {
      std::unique_ptr<Model> model = make_model(registry);
      std::unique_ptr<Strategy> strategy = fresh_strategy();
      strategy->setup(*model, *comm, StrategyEnv{device, adamw});
      const TrainingPosition position = checkpointer.load(request.load_checkpoint, *strategy, *model, *comm);
      row.checkpoint_loaded = position.step == kSteps && holds_checkpoint(*strategy, request.load_checkpoint) ? 1 : 0;
    }
  }

  row.bf16_error = row.bf16_bound = -1;
  if (request.bf16 && world.world_size == 1) bf16_accumulation_check(registry, plugin, *comm, device, row);

  const Json report{{"rank", row.rank},
                    {"grad_error", row.grad_error},
                    {"norm_error", row.norm_error},
                    {"param_error", row.param_error},
                    {"masked", row.masked},
                    {"identical_to_ddp", row.identical_to_ddp},
                    {"bf16_error", row.bf16_error},
                    {"bf16_bound", row.bf16_bound},
                    {"checkpoint_saved", row.checkpoint_saved},
                    {"checkpoint_loaded", row.checkpoint_loaded},
                    {"final_weights_error", row.final_weights_error},
                    {"reproducible_error", row.reproducible_error},
                    {"reproducible_hash", row.reproducible_hash}};
  std::ofstream(rank_report) << report.dump() << "\n";
}

int check_plugin(PluginRegistry& registry, const ConformanceRequest& request, const std::string& executable) {
  const LoadedPlugin& plugin = registry.find(PluginKind::Strategy, request.strategy);
  const fs::path scratch = fs::temp_directory_path() / fmt::format("trainer-conformance-{}", getpid());
  fs::create_directories(scratch);
  std::ofstream report;
  if (!request.report.empty()) report.open(request.report, std::ios::trunc);
  fmt::print("conformance of strategy '{}' ({})\n{:<8} {:>4} {:>12} {:>12} {:>12} {:>8} {:>8}  result\n",
             plugin.descriptor->name, plugin.file, "split", "rank", "grad err", "norm err", "param err", "masked",
             "=ddp");
  bool all_pass = true;
  double reproducible_hash = -1;    // every split and rank must report the first one's
  std::string previous_checkpoint;  // each split loads the one the split before it wrote
  for (const Split& split : request.splits) {
    const fs::path dir = scratch / split.text();
    fs::create_directories(dir);
    ConformanceRequest this_split = request;
    this_split.load_checkpoint = previous_checkpoint;
    const fs::path checkpoint = dir / "checkpoints" / fmt::format("step-{:08d}", kSteps);
    if (split.world == 1) {
      run_conformance_worker(registry, this_split, split, WorldInfo{}, (dir / "rank0.jsonl").string());
    } else {
      // Workers find plugins where this process found them (a third party's
      // strategy is often known only through --plugin-dir).
      std::vector<std::string> args = {executable};
      for (const std::string& plugin_dir : request.plugin_dirs) args.insert(args.end(), {"--plugin-dir", plugin_dir});
      args.insert(args.end(), {"check-plugin", request.strategy, "--split", split.argument(), "--device",
                               request.device, "--backend", request.backend, "--timeout",
                               fmt::format("{}", request.timeout_s), "--rank-report", dir.string()});
      if (!previous_checkpoint.empty()) args.insert(args.end(), {"--load-checkpoint", previous_checkpoint});
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int code = launch_local_workers(static_cast<int>(args.size()), argv.data(), split.world, request.timeout_s);
      if (code != 0) {
        fmt::print("{:<8} workers failed (exit code {})  FAIL\n", split.text(), code);
        all_pass = false;
        previous_checkpoint.clear();
        continue;
      }
    }
    const std::string loaded_from = previous_checkpoint;
    previous_checkpoint = fs::exists(checkpoint) ? checkpoint.string() : "";
    for (int rank = 0; rank < split.world; ++rank) {
      const std::vector<MetricsRow> rows = read_metrics((dir / fmt::format("rank{}.jsonl", rank)).string());
      const MetricsRow& r = rows.at(0);
      const bool pass = r.at("grad_error") <= kGradTolerance && r.at("norm_error") <= kGradTolerance &&
                        r.at("param_error") <= kParamTolerance && r.at("identical_to_ddp") != 0 &&
                        r.at("bf16_error") <= r.at("bf16_bound") && r.at("checkpoint_saved") == 1 &&
                        r.at("checkpoint_loaded") != 0 && r.at("final_weights_error") <= kParamTolerance;
      if (reproducible_hash < 0) reproducible_hash = r.at("reproducible_hash");
      const bool reproducible = r.at("reproducible_error") >= 0 && r.at("reproducible_error") <= kGradTolerance &&
                                r.at("reproducible_hash") == reproducible_hash;
      all_pass = all_pass && pass && reproducible;
      const double identical = r.at("identical_to_ddp");
      fmt::print("{:<8} {:>4} {:>12.3e} {:>12.3e} {:>12.3e} {:>7.3f}% {:>8}  {}\n", split.text(), rank,
                 r.at("grad_error"), r.at("norm_error"), r.at("param_error"), 100 * r.at("masked"),
                 identical < 0 ? "-" : (identical > 0 ? "bits" : "DIFFER"), pass ? "pass" : "FAIL");
      if (r.at("bf16_bound") >= 0) {
        fmt::print("{:<8} {:>4} bf16 x16 accumulation error {:.3e}, fp32-accumulation bound {:.3e}  {}\n", split.text(),
                   rank, r.at("bf16_error"), r.at("bf16_bound"),
                   r.at("bf16_error") <= r.at("bf16_bound") ? "pass" : "FAIL");
      }
      if (rank == 0 || r.at("checkpoint_saved") != 1 || r.at("checkpoint_loaded") == 0) {
        const double loaded = r.at("checkpoint_loaded");
        fmt::print("{:<8} {:>4} final weights err {:.3e}; checkpoint saved {}, {}  {}\n", split.text(), rank,
                   r.at("final_weights_error"), r.at("checkpoint_saved") == 1 ? "bit for bit" : "WRONG",
                   loaded < 0 ? std::string("nothing to load")
                              : fmt::format("{} loaded {}",
                                            fs::path(loaded_from).parent_path().parent_path().filename().string(),
                                            loaded > 0 ? "bit for bit" : "WRONG"),
                   pass ? "pass" : "FAIL");
      }
      if (rank == 0 || !reproducible) {
        const double hash = r.at("reproducible_hash");
        fmt::print(
            "{:<8} {:>4} reproducible: grad err {:.3e}, gradient {} ({} the first split's)  {}\n", split.text(), rank,
            r.at("reproducible_error"),
            hash < 0 ? std::string("none: the mode stopped") : fmt::format("{:013x}", static_cast<uint64_t>(hash)),
            hash == reproducible_hash ? "bits of" : "DIFFERS from", reproducible ? "pass" : "FAIL");
      }
      if (report.is_open()) {
        const Json line{{"split", split.text()},
                        {"micro", split.micro},
                        {"accum", split.accum},
                        {"world", split.world},
                        {"rank", rank},
                        {"grad_error", r.at("grad_error")},
                        {"norm_error", r.at("norm_error")},
                        {"param_error", r.at("param_error")},
                        {"masked", r.at("masked")},
                        {"identical_to_ddp", r.at("identical_to_ddp")},
                        {"bf16_error", r.at("bf16_error")},
                        {"bf16_bound", r.at("bf16_bound")},
                        {"checkpoint_saved", r.at("checkpoint_saved")},
                        {"checkpoint_loaded", r.at("checkpoint_loaded")},
                        {"final_weights_error", r.at("final_weights_error")},
                        {"reproducible_error", r.at("reproducible_error")},
                        {"reproducible_identical", r.at("reproducible_hash") == reproducible_hash ? 1 : 0},
                        {"pass", pass && reproducible}};
        report << line.dump() << "\n";
      }
    }
  }
  remove_tree(scratch.string());
  fmt::print("tolerances: gradient and norm {:.0e}, parameter change {:.0e}; {}\n", kGradTolerance, kParamTolerance,
             all_pass ? "all pass" : "FAILED");
  return all_pass ? 0 : 1;
}

}  // namespace trainer
