// The strategy plugin interface: how gradients are reduced and parameters
// updated across ranks. The training loop owns the accumulation state
// (micro-step index, boundary, N_t) and tells the strategy what happens.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "trainer/Comm.h"
#include "trainer/Model.h"
#include "trainer/Optimizer.h"
#include "trainer/Plugin.h"

namespace trainer {

/// What a strategy learns at setup besides its own options.
struct StrategyEnv {
  torch::Device device = torch::kCPU;
  /// The recipe's optimizer (outlives the strategy). Strategies update
  /// through it, never naming one: see sharding/OptimizerShards.h.
  Optimizer* optimizer = nullptr;
  /// Parameters and activations compute in this dtype (training.precision);
  /// master weights, optimizer state and gradient accumulation stay fp32.
  torch::Dtype compute_dtype = torch::kFloat32;
  /// Reproducible mode (training.reproducible): the core sums every
  /// backward's gradient itself, exactly, from hooks on the parameters, and
  /// writes the step's sum through gradient_slices() before apply_update.
  /// The strategy then accumulates and reduces nothing: it binds no .grad
  /// and keeps no gradient buffer beyond what gradient_slices() views,
  /// backward() only backpropagates (gathering parameters where it shards
  /// them), and reduce_gradients_and_norm() communicates nothing and returns
  /// 0 (the core computes the norm). Autograd leaves each backward's
  /// gradient in .grad for the core, which drops it as soon as it is added.
  bool exact_gradients = false;
};

/// Where a micro-step stands in its optimizer step; the loop knows all of
/// it before the step's first forward (contract, point 2).
struct MicroStep {
  int64_t index = 0;          ///< 0-based within the optimizer step
  bool is_last = false;       ///< no micro-step follows before reduce_gradients_and_norm
  int64_t micro_steps = 1;    ///< micro-steps on this rank in this optimizer step
  int64_t target_tokens = 0;  ///< N_t over the whole global batch (all ranks), > 0
};

/// Per-rank bytes of model state, for checking the ZeRO memory formulas.
struct MemoryReport {
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;                ///< master weights (if separate) + the optimizer's state
  int64_t peak_gathered_parameter_bytes = 0;  ///< zero3: largest live gathered units
  int64_t peak_transient_gradient_bytes = 0;  ///< zero2: most full-gradient bucket bytes live at once in backward
  /// The most bytes at once of every buffer the strategy holds only within
  /// a step (gathered parameters, gradient buckets, collectives' staging):
  /// what a step adds to the steady state besides the model's activations.
  /// The run measures the step's peak and holds this figure to it
  /// (memory.json).
  int64_t peak_transient_bytes = 0;
};

/// A piece of the flat layout that flatten_parameters() defines (group
/// `group`, elements [offset, offset + values.numel())) held by this rank.
struct FlatSlice {
  size_t group = 0;
  int64_t offset = 0;
  torch::Tensor values;
};

/// Views of the optimizer state this rank owns for one piece of the flat
/// layout: fp32 master values and the optimizer's state tensors (one per
/// Optimizer::state_names() entry), all of one length. Writing into them
/// (then calling state_loaded) restores a checkpoint.
struct StateSlice {
  size_t group = 0;
  int64_t offset = 0;
  torch::Tensor values;
  std::vector<torch::Tensor> state;
};

/// Call order per optimizer step: for each micro-step forward and backward
/// (the last with is_last), then reduce_gradients_and_norm, then exactly one
/// of apply_update or discard_gradients. After either, gradients
/// are zero for the next step. Steps whose global batch has no target token
/// (N_t = 0) are skipped by the loop: the strategy sees none of these calls.
/// Every method is called on every rank, in the same order, from one thread;
/// methods that communicate are collective. Autograd hooks a strategy
/// installs run on autograd's threads during backward().
class Strategy : public Component {
 public:
  ~Strategy() override;
  /// Called once, before anything else. Takes over the model's parameters
  /// (e.g. moves them into flat buffers on `device`, keeping the same tensor
  /// objects, see NamedParameter) and may install hooks on them or unit hooks
  /// on the model. The model and `comm` outlive the strategy; the strategy
  /// keeps no other reference into the caller's memory.
  virtual void setup(Model& model, Comm& comm, const StrategyEnv& env) = 0;
  /// Runs the model on one micro-batch and returns its loss sum. Strategies
  /// that shard parameters gather them here (or from unit hooks); others just
  /// call model.forward. Must not scale the loss.
  virtual LossSum forward(Model& model, const Batch& batch) { return model.forward(batch); }
  /// `loss` is loss_sum / N_t (contract, point 3); the strategy backpropagates
  /// it unscaled and adds the gradient into its fp32 accumulation (full or
  /// sharded), never overwriting what earlier micro-steps of the step added.
  /// It may start reductions during the backward; `micro.is_last` says no
  /// micro-step follows before reduce_gradients_and_norm.
  virtual void backward(const torch::Tensor& loss, const MicroStep& micro) = 0;
  /// Collective. Completes every reduction of this step's gradients (after it
  /// returns, gradient_slices() holds the summed gradient) and returns the L2
  /// norm of the whole gradient over all ranks, before clipping, the same
  /// value on every rank. The loop decides clipping and skipping from it.
  virtual double reduce_gradients_and_norm() = 0;
  /// One optimizer step (StrategyEnv::optimizer) with `args` on the state
  /// this rank owns, then whatever
  /// makes every rank's parameters current again (e.g. an all-gather), then
  /// zeroes the gradient accumulators. Collective.
  virtual void apply_update(const UpdateArgs& args) = 0;
  /// Instead of apply_update (a non-finite step under on_nonfinite = "skip"):
  /// zeroes the gradient accumulators and changes nothing else.
  virtual void discard_gradients() = 0;
  /// This rank's bytes of model state, measured from the buffers it holds
  /// (written to memory.json and checked against the ZeRO formulas).
  virtual MemoryReport memory() const = 0;

  /// After reduce_gradients_and_norm(): the reduced gradient this rank holds (all of
  /// it, or its shard), padding excluded. For the conformance kit, and
  /// writable: views of the gradient apply_update reads. In reproducible
  /// mode (training.reproducible) the core writes the exact sum of the
  /// step's gradients through them between reduce_gradients_and_norm and
  /// apply_update, and stops the run, naming the strategy, if it does not land.
  virtual std::vector<FlatSlice> gradient_slices() const = 0;
  /// The fp32 parameter values this rank updates (all, or its shard).
  virtual std::vector<FlatSlice> parameter_slices() const = 0;
  /// Views of the state this rank updates, padding excluded. Checkpoints are
  /// written from them and loaded into them. Together over all ranks they
  /// cover every element of every group; ranks may hold the same elements
  /// (replicas, which must hold the same values): each element is written
  /// once, by one of its holders, and loaded into all of them. The core
  /// checks this (and parameter_slices) right after setup and stops the
  /// run, naming the elements, where it does not hold.
  virtual std::vector<StateSlice> state_slices() = 0;
  /// Called on every rank after the caller wrote into state_slices(): the
  /// strategy refreshes what derives from them (full parameters, bf16 copies).
  virtual void state_loaded() = 0;
  /// Set up with StrategyEnv::exact_gradients: whether forward() and
  /// backward() do the same device work for every atom whatever its
  /// MicroStep, with no collective, no host sync and no host state that
  /// changes between atoms, on parameters whose memory stays where it is.
  /// The core may then capture one atom's forward and backward in a CUDA
  /// graph and replay it for the others (training.cuda_graphs), calling
  /// neither of them again for the replays. Default: false (a strategy that
  /// gathers parameters per unit, as zero3 does, is not).
  virtual bool replayable_atoms() const { return false; }
  /// Set up without exact gradients (the fast mode): whether forward() and
  /// backward() of `micro` do the same device work as every other micro-step
  /// this returns true for, whatever the data: no collective, no host sync,
  /// no host state that changes, gradients accumulated into buffers whose
  /// memory stays where it is. The core may then capture one such
  /// micro-step in a CUDA graph and replay it for the others of its shape
  /// (training.cuda_graphs); the rest run eagerly. Default: false (ddp and
  /// zero1 replay every micro-step but a last one that starts all-reduces).
  virtual bool replayable_micro_step(const MicroStep& micro) const {
    (void)micro;
    return false;
  }
  /// Makes the current stream wait until the work apply_update launched has
  /// ended. A strategy may return from apply_update with part of the update
  /// still running on a stream of its own, ordered before each parameter's
  /// next use (ddp's overlap_update); every other method it answers waits
  /// for it first. The core marks a step's end on a stream that waits here,
  /// so the step's time covers its update. Default: nothing (the update's
  /// work is on the current stream).
  virtual void wait_for_update() {}
};

}  // namespace trainer
