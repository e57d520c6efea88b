// The conformance kit's checks (see Checks.h). Tolerances live with the
// table in Driver.cpp; what each figure means is in Conformance.h.
#include "kit/Checks.h"

#include <cmath>

#include <fmt/format.h>

#include "checkpoint/Checkpoint.h"
#include "recipe/Recipe.h"
#include "reproducible/ExactGradients.h"
#include "reproducible/ReproducibleMode.h"
#include "run/RunOutputs.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/FlatParameters.h"

namespace trainer::kit {

namespace fs = std::filesystem;

std::unique_ptr<Strategy> KitRun::fresh_strategy() const {
  return PluginRegistry::create<Strategy>(plugin, plugin_options(plugin, split.options()), context);
}

void check_gradient(const KitRun& run, const Reference& reference, const Fixture& first, double reference_norm,
                    ConformanceRow& row) {
  std::unique_ptr<Model> model = make_model(run.registry);
  std::unique_ptr<Strategy> strategy = run.fresh_strategy();
  strategy->setup(*model, run.comm, StrategyEnv{run.device, &run.optimizer});
  // What checkpoints and the final weights need of the slices' layout.
  check_state_coverage(*strategy, *model, run.comm, run.device, run.plugin.descriptor->name);
  const double norm =
      strategy_step(*strategy, *model, first, run.split, run.world.rank, run.device, run.plugin.descriptor->name);
  // fp32 gradients of sums of ~100 token losses: relative rounding ~1e-7,
  // amplified at most tenfold by the network's depth; 1e-5 leaves margin
  // while any contract violation on this fixture costs > 1e-2.
  row.grad_error = relative_error(strategy->gradient_slices(), reference.grads());
  row.norm_error = std::abs(norm - reference_norm) / reference_norm;
}

namespace {

// StrategyEnv::exact_gradients: a backward and reduce_gradients_and_norm
// leave the gradient the strategy holds as it was (they accumulate and
// reduce nothing: the core sums). Slices filled with a marker keep it
// (views: ExactGradients' construction checked, else a marker proves nothing).
void check_exact_gradients_untouched(Strategy& strategy, Model& model, const Fixture& first, const KitRun& run) {
  torch::NoGradGuard no_grad;
  constexpr double kMarker = 0.375;
  for (const FlatSlice& slice : strategy.gradient_slices()) slice.values.fill_(kMarker);
  {
    torch::AutoGradMode enabled(true);
    const LossSum out = strategy.forward(model, rows(first, {run.world.rank}, run.device));
    strategy.backward(out.loss_sum / static_cast<double>(first.target_tokens),
                      MicroStep{0, true, 1, first.target_tokens});
  }
  strategy.reduce_gradients_and_norm();
  for (const FlatSlice& slice : strategy.gradient_slices()) {
    if (slice.values.numel() > 0 && !slice.values.eq(kMarker).all().item<bool>()) {
      throw TrainingError(fmt::format(
          "strategy '{}': set up with StrategyEnv::exact_gradients, its backward or reduce_gradients_and_norm "
          "changed the gradient it holds; in reproducible mode the core sums the gradients and the strategy "
          "accumulates and reduces nothing (trainer/Strategy.h)",
          run.plugin.descriptor->name));
    }
  }
  strategy.discard_gradients();
}

// Where each parameter's memory is, for a strategy that declares its atoms
// replayable (Strategy::replayable_atoms): a CUDA graph's replay reads the
// addresses its capture saw, so they must hold memory and never move.
std::vector<const void*> replayable_addresses(Strategy& strategy, Model& model, const KitRun& run) {
  if (!strategy.replayable_atoms()) return {};
  return replay_addresses(model, run.plugin.descriptor->name, "replayable_atoms()", "between atoms",
                          /*gradients=*/false);
}

}  // namespace

void check_reproducible(const KitRun& run, const Reference& reference, const Fixture& first, ConformanceRow& row) {
  try {
    const ReproducibleSettings settings;
    std::unique_ptr<Model> model = make_model(run.registry);
    std::unique_ptr<Strategy> strategy = run.fresh_strategy();
    strategy->setup(*model, run.comm, StrategyEnv{run.device, &run.optimizer, torch::kFloat32, true});
    ExactGradients exact(*model, kGlobalBatch, run.device, strategy.get(), run.plugin.descriptor->name);
    const int64_t count = run.split.micro * run.split.accum;
    check_exact_gradients_untouched(*strategy, *model, first, run);
    const std::vector<const void*> where = replayable_addresses(*strategy, *model, run);
    run_exact_passes(exact, *strategy, run.comm, count, [&](int64_t k) {
      const LossSum out = strategy->forward(*model, rows(first, {run.world.rank * count + k}, run.device));
      strategy->backward(out.loss_sum / static_cast<double>(first.target_tokens),
                         MicroStep{k, k == count - 1, count, first.target_tokens});
    });
    if (replayable_addresses(*strategy, *model, run) != where) {
      throw TrainingError(fmt::format(
          "strategy '{}': declares replayable_atoms() but a parameter's memory moved during forward and backward; "
          "a CUDA graph's replay reads the addresses its capture saw (trainer/Strategy.h)",
          run.plugin.descriptor->name));
    }
    const std::vector<torch::Tensor> gradient = exact.reduce(run.comm);
    install_gradient(*strategy, gradient, run.plugin.descriptor->name);
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
}

namespace {

// kSteps AdamW steps of `which` (the strategy under test with this split's
// options, or another with its defaults), clipped at `max_norm`; with a
// reference, it takes the same steps and `min_ratio` collects per element
// the minimum over steps of |g_ref| / rms(g_ref) of its group.
Trained train_steps(const KitRun& run, const LoadedPlugin& which, double max_norm, Reference* ref,
                    std::vector<torch::Tensor>* min_ratio) {
  Trained t;
  t.model = make_model(run.registry);
  t.strategy = PluginRegistry::create<Strategy>(
      which, plugin_options(which, &which == &run.plugin ? run.split.options() : ""), run.context);
  t.strategy->setup(*t.model, run.comm, StrategyEnv{run.device, &run.optimizer});
  for (int step = 0; step < kSteps; ++step) {
    const Fixture f = fixture(step);
    const double norm =
        strategy_step(*t.strategy, *t.model, f, run.split, run.world.rank, run.device, run.plugin.descriptor->name);
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
    ref->update(clip_coefficient(ref_norm, max_norm), step + 1);
  }
  for (const FlatSlice& slice : t.strategy->parameter_slices()) t.values.push_back(slice.values.clone());
  return t;
}

}  // namespace

Trained train_against_reference(const KitRun& run, double max_norm) {
  Reference ref(run.registry, run.optimizer, run.device);
  const std::vector<torch::Tensor> start = ref.values();
  std::vector<torch::Tensor> min_ratio;
  Trained trained = train_steps(run, run.plugin, max_norm, &ref, &min_ratio);
  trained.start = start;
  // Adam divides by sqrt(v): an element whose true gradient is ~0 (e.g. the
  // key bias, to which softmax is invariant) gets an update of size lr
  // driven by rounding noise, with a sign fp32 and fp64 need not share.
  // Such elements (|g_ref| below 1e-4 of their group's RMS at some step)
  // are left out; their share is reported. Elsewhere fp32 rounding of the
  // gradient (~1e-6) passes through five steps of Adam's normalisation.
  double masked = 0, total = 0;
  for (const torch::Tensor& r : min_ratio) {
    trained.mask.push_back((r >= 1e-4).to(torch::kFloat64));
    masked += (r < 1e-4).sum().item<double>();
    total += static_cast<double>(r.numel());
  }
  trained.masked = masked / total;
  const std::vector<torch::Tensor> end = ref.values();
  for (size_t g = 0; g < end.size(); ++g) trained.reference_change.push_back(end[g] - start[g]);
  return trained;
}

void check_parameters(const Trained& trained, ConformanceRow& row) {
  row.param_error = relative_error(minus(trained.strategy->parameter_slices(), trained.start), trained.reference_change,
                                   &trained.mask);
  row.masked = trained.masked;
}

void check_identical_to_ddp(const KitRun& run, const Trained& trained, double max_norm, ConformanceRow& row) {
  row.identical_to_ddp = -1;
  if (run.world.world_size != 1) return;
  const std::vector<torch::Tensor> ddp_values =
      train_steps(run, run.registry.find(PluginKind::Strategy, "ddp"), max_norm, nullptr, nullptr).values;
  const std::vector<torch::Tensor>& values = trained.values;
  bool same = ddp_values.size() == values.size();
  for (size_t i = 0; same && i < values.size(); ++i) same = torch::equal(values[i], ddp_values[i]);
  row.identical_to_ddp = same ? 1 : 0;
}

void check_final_weights(const KitRun& run, const Trained& trained, ConformanceRow& row) {
  const std::vector<torch::Tensor> full =
      consolidated_parameters(*trained.model, *trained.strategy, run.comm, run.device, run.world.rank == 0);
  if (run.world.rank != 0) return;
  std::vector<FlatSlice> whole;
  for (size_t g = 0; g < full.size(); ++g) whole.push_back({g, 0, full[g].to(trained.start.at(g).device())});
  const std::vector<FlatSlice> change = minus(whole, trained.start);
  row.final_weights_error = relative_error(change, trained.reference_change, &trained.mask);
  // Per parameter, by the flat layout's slots.
  std::unique_ptr<Model> layout_model = make_model(run.registry);
  const std::vector<ParameterGroup> layout = flatten_parameters(layout_model->parameters(), torch::kCPU, 1);
  row.unchanged_parameters = row.wrong_parameters = 0;
  for (size_t g = 0; g < layout.size(); ++g) {
    for (const ParameterSlot& slot : layout[g].slots) {
      const std::vector<FlatSlice> mine = {{g, slot.offset, change.at(g).values.narrow(0, slot.offset, slot.numel)}};
      const bool moved = mine[0].values.abs().max().item<double>() > 0;
      const double error = relative_error(mine, trained.reference_change, &trained.mask);
      if (!moved) ++row.unchanged_parameters;
      const double tolerance = kPerParameterFactor * row.param_tolerance;
      if (error > tolerance) ++row.wrong_parameters;
      if (!moved || error > tolerance) {
        log::error(fmt::format("parameter '{}' {} (relative error of its change {:.3e})", slot.name,
                               moved ? "moved otherwise than the reference's" : "did not move", error));
      }
    }
  }
}

void check_checkpoints(const KitRun& run, const Trained& trained, const std::string& dir, const std::string& load,
                       ConformanceRow& row) {
  Checkpointer checkpointer(dir, 1, "conformance", "conformance", run.plugin.descriptor->name, run.device,
                            run.optimizer.state_names());
  const std::string saved =
      checkpointer.save(*trained.strategy, *trained.model, run.comm, TrainingPosition{kSteps, kSteps, {}});
  row.checkpoint_saved = holds_checkpoint(*trained.strategy, saved, run.optimizer.state_names()) ? 1 : 0;
  {
    // Resumed with nothing but the checkpoint: a fresh model, strategy and
    // optimizer take the next step beside the trained ones.
    std::unique_ptr<Optimizer> optimizer =
        make_optimizer(run.registry, run.optimizer_name, run.context, run.optimizer_settings);
    std::unique_ptr<Model> model = make_model(run.registry);
    std::unique_ptr<Strategy> strategy = run.fresh_strategy();
    strategy->setup(*model, run.comm, StrategyEnv{run.device, optimizer.get()});
    checkpointer.load(saved, *strategy, *model, run.comm);
    const Fixture next = fixture(kSteps);
    for (auto [s, m] : {std::pair<Strategy*, Model*>{trained.strategy.get(), trained.model.get()},
                        std::pair<Strategy*, Model*>{strategy.get(), model.get()}}) {
      strategy_step(*s, *m, next, run.split, run.world.rank, run.device, run.plugin.descriptor->name);
      s->apply_update(UpdateArgs{kLr, 1.0, kSteps + 1});
    }
    const std::vector<FlatSlice> a = trained.strategy->parameter_slices(), b = strategy->parameter_slices();
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = torch::equal(a[i].values, b[i].values);
    row.resumed_identical = same ? 1 : 0;
  }
  if (load.empty()) return;
  std::unique_ptr<Model> model = make_model(run.registry);
  std::unique_ptr<Strategy> strategy = run.fresh_strategy();
  strategy->setup(*model, run.comm, StrategyEnv{run.device, &run.optimizer});
  const TrainingPosition position = checkpointer.load(load, *strategy, *model, run.comm);
  row.checkpoint_loaded =
      position.step == kSteps && holds_checkpoint(*strategy, load, run.optimizer.state_names()) ? 1 : 0;
}

// bf16 compute with 16 accumulation steps at world size 1. The strategy's
// accumulated gradient is compared with the exact (fp64) sum of the same
// bf16 micro-step gradients, recomputed here one micro-batch at a time.
// Adding k terms in a precision with unit roundoff u errs by at most
// (k - 1) u sum_j |g_j| per element (first order; Higham, Accuracy and
// Stability, 4.2), so in norm by (k - 1) u ||sum_j |g_j| ||: with fp32's
// u = 2^-24 that is about 1e-6 relative here, with bf16's u = 2^-8 about 6%.
void check_bf16_accumulation(const KitRun& run, ConformanceRow& row) {
  PluginRegistry& registry = run.registry;
  const LoadedPlugin& plugin = run.plugin;
  Comm& comm = run.comm;
  const torch::Device device = run.device;
  constexpr int64_t kMicroSteps = 16;
  const Fixture f = fixture(0, kMicroSteps);
  Context context;
  std::unique_ptr<Model> model = make_model(registry);
  std::unique_ptr<Strategy> strategy = PluginRegistry::create<Strategy>(plugin, plugin_options(plugin, ""), context);
  strategy->setup(*model, comm, StrategyEnv{device, &run.optimizer, torch::kBFloat16});
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

}  // namespace trainer::kit
