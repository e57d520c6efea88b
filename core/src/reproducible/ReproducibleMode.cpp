// Reproducible mode's settings and the steps after the exact gradient sum
// (see ReproducibleMode.h).
#include "reproducible/ReproducibleMode.h"

#include <cmath>
#include <cstdlib>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/version.h>

#include "ops/Dispatch.h"
#include "trainer/Errors.h"

// LibTorch 2.1 and later fill new uninitialised tensors under deterministic
// algorithms, and say so by a switch of their own.
#define TRAINER_FILL_SWITCH (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))

namespace trainer {

ReproducibleSettings::ReproducibleSettings()
    : deterministic_(at::globalContext().deterministicAlgorithms()),
      warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()),
      fusion_(ops::gradient_fusion_enabled()),
      lt_gemms_(ops::lt_gemms_enabled()),
      threads_(at::get_num_threads()) {
#if TRAINER_FILL_SWITCH
  fill_ = at::globalContext().deterministicFillUninitializedMemory();
#endif
  // cuBLAS picks its reduction scheme per workspace; a fixed one makes its
  // GEMMs run-to-run deterministic (LibTorch refuses them otherwise).
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
#if TRAINER_FILL_SWITCH
  // With deterministic algorithms on, LibTorch also fills every new
  // uninitialised tensor (NaN, or an integer's largest value), a debugging
  // aid that never changes a result that is deterministic without it: on
  // CUDA thousands of fill kernels a step with atoms of 1 sample (about 17 ms
  // of a 0.5B step on an H100). The bits are held by the GPU tests that
  // compare splits, graphs and eager atoms.
  at::globalContext().setDeterministicFillUninitializedMemory(false);
#endif
  at::set_num_threads(1);
  ops::set_gradient_fusion(false);
  ops::set_lt_gemms(false);  // LibTorch's GEMMs: the bits of the mode's format
}

ReproducibleSettings::~ReproducibleSettings() {
  at::globalContext().setDeterministicAlgorithms(deterministic_, warn_only_);
#if TRAINER_FILL_SWITCH
  at::globalContext().setDeterministicFillUninitializedMemory(fill_);
#endif
  at::set_num_threads(threads_);
  ops::set_gradient_fusion(fusion_);
  ops::set_lt_gemms(lt_gemms_);
}

int run_exact_passes(ExactGradients& exact, Strategy& strategy, Comm& comm, int64_t count,
                     const std::function<void(int64_t)>& atom) {
  for (int pass = 1;; ++pass) {
    exact.begin_pass(count);
    for (int64_t k = 0; k < count; ++k) atom(k);
    strategy.reduce_gradients_and_norm();
    if (exact.end_pass(comm)) return pass;
    if (pass > 1) {
      throw TrainingError(
          "reproducible mode ran the same atoms twice and got other gradients: an operator is not "
          "deterministic on this device");
    }
    strategy.discard_gradients();
  }
}

namespace {

[[noreturn]] void refuse_copied_slices(const std::string& strategy_name) {
  throw TrainingError(
      fmt::format("strategy '{}': writing into gradient_slices() did not change the gradient it "
                  "holds; training.reproducible = true needs them to be views of the gradient "
                  "apply_update reads (trainer/Strategy.h)",
                  strategy_name));
}

}  // namespace

void check_gradient_slices_are_views(Strategy& strategy, const std::string& strategy_name) {
  torch::NoGradGuard no_grad;
  for (const FlatSlice& slice : strategy.gradient_slices()) slice.values.fill_(std::nan(""));
  for (const FlatSlice& slice : strategy.gradient_slices()) {
    if (slice.values.numel() > 0 && !slice.values.isnan().all().item<bool>()) refuse_copied_slices(strategy_name);
  }
}

void install_gradient(Strategy& strategy, const std::vector<torch::Tensor>& groups, const std::string& strategy_name) {
  torch::NoGradGuard no_grad;
  const auto refuse = [&] { refuse_copied_slices(strategy_name); };
  const auto source_of = [&](const FlatSlice& slice) {
    // A slice may lie partly or wholly in its group's padding (a shard past
    // the last element: shards are padded to 64-element boundaries); only
    // its real elements have a source.
    if (slice.group >= groups.size() || slice.offset < 0) {
      throw TrainingError(
          fmt::format("strategy '{}': a gradient slice (group {}, offset {}) lies outside the model's "
                      "flat groups",
                      strategy_name, slice.group, slice.offset));
    }
    const int64_t n = std::max<int64_t>(0, std::min(slice.values.numel(), groups[slice.group].numel() - slice.offset));
    return std::make_pair(n, n == 0 ? torch::Tensor() : groups[slice.group].narrow(0, slice.offset, n));
  };
  for (const FlatSlice& slice : strategy.gradient_slices()) {
    const auto [n, source] = source_of(slice);
    // Where the sums were converted in the strategy's own memory (ExactGradients' limbs) they are there already.
    if (n > 0 && slice.values.data_ptr() != source.data_ptr()) slice.values.narrow(0, 0, n).copy_(source);
  }
  // A slice that was written reads back what was written (a copy does not,
  // and is refused); one that is the source's own memory holds it by
  // construction, and is not read again (a pass over the gradient and a
  // wait for the device every step).
  for (const FlatSlice& slice : strategy.gradient_slices()) {
    const auto [n, source] = source_of(slice);
    if (n > 0 && slice.values.data_ptr() != source.data_ptr() &&
        !torch::equal(slice.values.narrow(0, 0, n).to(source.dtype()), source)) {
      refuse();
    }
  }
}

double ordered_loss_sum(torch::Tensor losses, Comm& comm) {
  if (comm.world_size() > 1) comm.all_reduce_sum(losses);
  const torch::Tensor host = losses.cpu().contiguous();
  const double* values = host.data_ptr<double>();
  double sum = 0.0;
  for (int64_t i = 0; i < host.numel(); ++i) sum += values[i];
  return sum;
}

}  // namespace trainer
