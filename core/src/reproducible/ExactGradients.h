// Reproducible mode's gradient sum: every gradient a parameter receives in a
// backward is rounded once onto a fixed-point grid and added into an int64
// accumulator, so sums over samples, micro-steps and ranks are exact and the
// same in any order or grouping.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Comm.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"

namespace trainer {

/// The fixed-point format, per parameter p: a gradient element g becomes the
/// integer q = round(g * 2^s_p), and the step's gradient is (sum of q) * 2^-s_p,
/// converted to fp32 once. |q| < 2^bits with bits = 61 - ceil(log2 atoms)
/// (an atom: the samples of one backward), so the at most 2 x atoms
/// contributions of a step (a parameter used twice in one graph may receive
/// two per backward) sum inside an int64 in every order. s_p follows M_p, the largest |g| of p's contributions: it is
/// chosen so that M_p * 2^s_p lies in [2^(bits-5), 2^(bits-4)), and a pass is
/// accepted while M_p * 2^s_p stays in [2^(bits-9), 2^bits); a pass outside
/// (the gradient grew or shrank 16x since the scale was chosen) is run again
/// with the scale its own contributions ask for.
///
/// Precision, checked against fp64 by the conformance kit: an fp32
/// contribution g is taken exactly when |g| >= 2^(24 - s_p), which holds for
/// |g| >= M_p * 2^(33 - bits); smaller ones are off by at most 2^-(s_p+1) <=
/// M_p * 2^(8 - bits). With 1024 atoms (bits = 51): everything within
/// 2^-18 of the largest contribution is exact, and a sum of 2048 smaller
/// ones is off by at most M_p * 2^-32 (an element 2^-20 below M_p then keeps
/// 12 correct bits, one 2^-8 below it fp32's 24).
class ExactGradients {
 public:
  /// Installs a gradient hook on each of `model`'s parameters (removed by the
  /// destructor); `atoms`: backward passes of one optimizer step, all ranks.
  /// The strategy set up with StrategyEnv::exact_gradients binds no .grad:
  /// each gradient autograd then leaves in .grad is dropped as soon as it
  /// is stored (a hook after the parameter's accumulation), so no backward
  /// holds more than the gradients in flight.
  ///
  /// With `strategy` (set up with exact_gradients, named `strategy_name` in
  /// errors): its gradient_slices() are checked to be views (TrainingError
  /// otherwise) and, where they are each group whole (ddp; every stage at
  /// world size 1), each int64 sum is held as two 32-bit limbs (on CUDA
  /// added by fixed_point_add_limbs, on the CPU by ATen's arithmetic):
  /// the low one in the strategy's own fp32 gradient memory (viewed as
  /// int32; nothing else writes it in exact mode), the high one here.
  /// reduce() then converts each sum over its own low limb, so the groups it
  /// returns are the strategy's gradient itself: 4 bytes a parameter beside
  /// the strategy's buffer instead of 8. The sums, and so the bits, are the
  /// same either way.
  ExactGradients(Model& model, int64_t atoms, torch::Device device, Strategy* strategy = nullptr,
                 const std::string& strategy_name = "");
  ~ExactGradients();
  ExactGradients(const ExactGradients&) = delete;
  ExactGradients& operator=(const ExactGradients&) = delete;

  /// Zeroes the accumulators and starts adding what hooks receive, for a
  /// pass of `local_atoms` backward passes on this rank.
  void begin_pass(int64_t local_atoms);
  /// Collective. Ends the pass; true when every parameter's scale held its
  /// largest contribution with the precision promised above. Otherwise the
  /// scales now fit this pass's contributions, and running the same pass
  /// again is accepted (its contributions are the same bits).
  bool end_pass(Comm& comm);
  /// True when some contribution of the last pass was NaN or infinite.
  bool nonfinite() const { return nonfinite_; }
  /// Collective, after an accepted pass: the summed gradient of every rank,
  /// as flat fp32 groups laid out as flatten_parameters() does (decay, then
  /// no decay; empty groups left out; padding excluded). Scales then follow
  /// this step's contributions for the next step. The groups are views of
  /// the accumulator's memory (converted in place: no copy of the gradient;
  /// with limbs, the strategy's gradient itself), valid until the next
  /// begin_pass().
  std::vector<torch::Tensor> reduce(Comm& comm);
  /// Whether the sums live in the strategy's gradient (the limbs above):
  /// reduce()'s groups are then the strategy's gradient slices themselves.
  bool sums_in_strategy() const { return limbs_; }

  /// Contributions each parameter received in this pass so far, and a
  /// change to them: a CUDA graph's replay runs no hook, so its caller
  /// adds the counts the capture saw (and takes back the capture's own).
  const std::vector<int64_t>& calls() const { return calls_; }
  void count_calls(const std::vector<int64_t>& change);

  /// Per parameter, s_p (kUnknown before a parameter's first contribution).
  const std::vector<int64_t>& exponents() const { return exponents_; }
  /// Restores exponents() from a checkpoint: a resumed run then rounds
  /// exactly as the run that wrote it. Throws std::invalid_argument on a
  /// count other than the parameters'.
  void set_exponents(const std::vector<int64_t>& exponents);
  static constexpr int64_t kUnknown = INT64_MIN;
  /// reduce() converts the fixed-point sums to fp32 this many elements at a
  /// time (its fp64 scratch: 8 MiB), in place; on a CUDA device
  /// kDeviceConvertChunk (128 MiB), whose three launches per chunk would
  /// otherwise number thousands a step at the 3B shape. Each element's
  /// conversion is the same whatever the chunk: the bits do not depend on it.
  static constexpr int64_t kConvertChunk = int64_t(1) << 20;
  static constexpr int64_t kDeviceConvertChunk = int64_t(1) << 24;

 private:
  void add(size_t parameter, const torch::Tensor& gradient);
  // With limbs: the low limbs of the accumulator's elements [start, start + n)
  // (one group's), the int64 sums they make with the high limbs, and a sum stored back.
  torch::Tensor low(int64_t start, int64_t n) const;
  torch::Tensor combined(int64_t start, int64_t n) const;
  void store(int64_t start, int64_t n, const torch::Tensor& sums);

  std::vector<NamedParameter> parameters_;
  std::vector<unsigned> hook_handles_;
  // The parameters' accumulation nodes, kept alive so that their hooks
  // stay; the hooks drop .grad while the flag is set (until destruction).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::shared_ptr<std::atomic<bool>> dropping_ = std::make_shared<std::atomic<bool>>(true);
  std::vector<int64_t> offsets_;  // of each parameter in accumulator_: the decay group's first
  int64_t decay_elements_ = 0;    // the decay group's elements, at the accumulator's start
  std::vector<size_t> layout_;    // the parameters in the accumulator's order
  torch::Tensor accumulator_;     // int64, every parameter back to back (without limbs)
  bool limbs_ = false;
  torch::Tensor high_;                   // with limbs: int32, every parameter back to back
  std::vector<torch::Tensor> strategy_;  // with limbs: the strategy's fp32 gradient, per group
  torch::Tensor largest_;                // fp64 [parameters]: the pass's max |g| per parameter
  torch::Tensor scales_;  // on CUDA, fp64 [parameters]: 2^s_p for the kernel, 0 where unknown (set by begin_pass)
  // Per non-empty group, its parameters in layout_'s order; with limbs on
  // CUDA, each one's start in the group on the device (reduce()'s one launch).
  std::vector<std::vector<size_t>> group_parameters_;
  std::vector<torch::Tensor> group_starts_;
  std::vector<int64_t> exponents_;
  std::vector<int64_t> pending_;  // exponents the last accepted pass's contributions ask for
  std::vector<int64_t> calls_;    // contributions per parameter in this pass
  int64_t local_atoms_ = 0;
  int bits_;
  bool armed_ = false;
  bool nonfinite_ = false;
};

}  // namespace trainer
