// Reproducible mode (training.reproducible): the process-wide settings it
// needs, and the steps between ExactGradients' sum and the strategy, each
// computed the same way whatever the split, world size or strategy.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "reproducible/ExactGradients.h"
#include "trainer/Comm.h"
#include "trainer/Strategy.h"

namespace trainer {

/// Applies, for its lifetime, what makes an atom's gradient the same bits
/// wherever it is computed: ATen's deterministic algorithms (an operator
/// without a deterministic variant then throws, naming itself), cuBLAS's
/// fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless already set), one
/// intra-op thread on the CPU (ATen's CPU reductions split their sums by
/// thread count, which differs with the ranks per machine), and no
/// gradient-accumulation fusion and LibTorch's GEMMs rather than the
/// project's cuBLASLt calls (ops/Dispatch.h), and (LibTorch 2.1 and
/// later) no filling of new uninitialised tensors, which the deterministic
/// switch would otherwise turn on (a cost, never a bit). Restores the previous
/// settings when destroyed. Construct before any CUDA work.
class ReproducibleSettings {
 public:
  ReproducibleSettings();
  ~ReproducibleSettings();
  ReproducibleSettings(const ReproducibleSettings&) = delete;
  ReproducibleSettings& operator=(const ReproducibleSettings&) = delete;

 private:
  bool deterministic_ = false, warn_only_ = false, fusion_ = true, lt_gemms_ = false, fill_ = true;
  int threads_ = 1;
};

/// Collective. Runs one optimizer step's atoms as passes of `exact`:
/// `atom(k)` runs forward and backward of this rank's atom k < count
/// through the strategy (one backward each). A pass whose gradients fall
/// outside the fixed-point scales is reduced and discarded, keeping the
/// strategy's call order, and run again with scales that fit it; a second
/// refusal means the same atoms gave other gradients (TrainingError:
/// an operator is not deterministic). Returns the passes run (1 or 2).
/// The strategy, set up with StrategyEnv::exact_gradients, accumulates and
/// reduces nothing meanwhile; its reduce_gradients_and_norm is still called
/// once a pass, in the order the contract sets.
int run_exact_passes(ExactGradients& exact, Strategy& strategy, Comm& comm, int64_t count,
                     const std::function<void(int64_t)>& atom);

/// Whether the strategy's gradient_slices() are views of the gradient it
/// holds: NaN written through them reads back through a second call.
/// Throws TrainingError naming the strategy (`strategy_name`) when not;
/// leaves NaN in them.
void check_gradient_slices_are_views(Strategy& strategy, const std::string& strategy_name);

/// Writes the exact gradient `groups` (ExactGradients::reduce: whole flat
/// groups) into the gradient the strategy holds, through gradient_slices()
/// (nothing to write where a group is that gradient already), and reads it
/// back. Throws TrainingError naming the strategy when it does not land
/// (ExactGradients' construction checked the slices are views, with NaN, so
/// copies are caught even where they happen to equal the sum).
void install_gradient(Strategy& strategy, const std::vector<torch::Tensor>& groups, const std::string& strategy_name);

/// Collective. `losses` (fp64, one entry per atom of the global batch)
/// holds this rank's atoms' loss sums at their global positions and zeros
/// elsewhere; returns the sum of all ranks' entries, added in global order
/// (the all-reduce only adds zeros, which is exact).
double ordered_loss_sum(torch::Tensor losses, Comm& comm);

}  // namespace trainer
