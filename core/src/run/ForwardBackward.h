// One forward and backward pass on the device (an atom in reproducible
// mode, a micro-step in the fast mode): the loss scaled by 1 / N_t, and with
// training.cuda_graphs the pass replayed from a CUDA graph.
// Every atom of a run has the same shape (reproducible_atom samples of
// seq_len), as has every micro-batch of unpacked samples, so one capture
// serves them all. Without graphs, atoms of 1 sample at the 0.5B bench
// shape run at the host's pace (10,716 device events a step for 4 atoms;
// bench/README).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "reproducible/ExactGradients.h"
#include "trainer/Model.h"

namespace trainer {

/// Whether this build can capture CUDA graphs (a CUDA build of LibTorch).
bool cuda_graphs_available();

/// On a CUDA device, makes a stream from the device's pool the calling
/// thread's current one until destruction (then the previous one again,
/// after the pool stream's work is done). A graph cannot be captured on the
/// default stream, and autograd runs each parameter's accumulation on the
/// stream that was current where its node was made: a run that captures
/// makes everything on this stream. Nothing on the CPU.
class CaptureStream {
 public:
  explicit CaptureStream(torch::Device device);
  ~CaptureStream();
  CaptureStream(const CaptureStream&) = delete;
  CaptureStream& operator=(const CaptureStream&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class ForwardBackwardRunner {
 public:
  /// A forward and backward on `batch` (its loss already scaled, with
  /// scaled()); returns the batch's loss sum, detached, shape {1}.
  using Pass = std::function<torch::Tensor(const Batch& batch)>;

  /// `graphs`: capture and replay (training.cuda_graphs; CUDA only, under a
  /// CaptureStream, with a strategy whose passes are replayable).
  ForwardBackwardRunner(torch::Device device, bool graphs);
  ~ForwardBackwardRunner();
  ForwardBackwardRunner(const ForwardBackwardRunner&) = delete;
  ForwardBackwardRunner& operator=(const ForwardBackwardRunner&) = delete;

  /// This step's N_t, before its passes.
  void begin_step(int64_t target_tokens);
  /// loss_sum / N_t. On the CPU LibTorch's division by N_t. On CUDA the
  /// product with 1 / N_t held on the device (a replay reads this step's),
  /// rounded to the loss's dtype first: what LibTorch's division by a host
  /// scalar computes there (it multiplies by the reciprocal in the
  /// operands' precision), so the same bits, graphs or not.
  torch::Tensor scaled(const torch::Tensor& loss_sum) const;

  /// Runs `pass` on `batch`. With graphs: eagerly the first time a batch of
  /// its shape and target count is seen (a warm-up outside any capture:
  /// lazily made state, cuBLAS workspaces, caches), captured the second
  /// time, replayed from then on, with the batch copied into the inputs the
  /// graph reads. A replay runs no hook: `exact` is told the contributions
  /// the capture counted (reproducible mode; null in the fast mode, whose
  /// strategies sum the gradients themselves). At most kMaxGraphs shapes are
  /// captured (all in one memory pool: replays run one at a time); others
  /// run eagerly. The result is valid until the next call.
  torch::Tensor run(const Batch& batch, ExactGradients* exact, const Pass& pass);

  /// Graphs captured and passes replayed so far.
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  static constexpr size_t kMaxGraphs = 32;

 private:
  struct Graph;
  using Key = std::tuple<std::vector<int64_t>, std::vector<int64_t>, int64_t>;  // input, label shapes; targets
  std::unique_ptr<Graph> capture(const Batch& batch, ExactGradients* exact, const Pass& pass);

  torch::Device device_;
  bool graphs_;
  int64_t target_tokens_ = 0;
  torch::Tensor reciprocal_f32_, reciprocal_f64_;  // on CUDA: 1 / N_t in each dtype
  std::map<Key, std::unique_ptr<Graph>> captured_;
  std::pair<unsigned long long, unsigned long long> pool_{0, 0};  // every graph's memory pool, once made
  std::map<Key, int64_t> seen_;                                   // eager runs per shape before its capture
  int64_t captures_ = 0;
  int64_t replays_ = 0;
};

}  // namespace trainer
