// Reproducible mode's atoms and the fast mode's micro-steps on the device (see ForwardBackward.h).
#include "run/ForwardBackward.h"

#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>
#include <torch/version.h>

#include "trainer/Errors.h"
#include "trainer/Log.h"

#ifdef TRAINER_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace trainer {

#ifdef TRAINER_CUDA_KERNELS

bool cuda_graphs_available() { return true; }

struct CaptureStream::State {
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream pool;
};

CaptureStream::CaptureStream(torch::Device device) {
  if (!device.is_cuda()) return;
  const c10::DeviceIndex index = device.index() < 0 ? c10::cuda::current_device() : device.index();
  state_ = std::make_unique<State>(
      State{c10::cuda::getCurrentCUDAStream(index), c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)});
  // The pool stream starts after what the previous one holds so far.
  at::cuda::CUDAEvent queued;
  queued.record(state_->previous);
  queued.block(state_->pool);
  c10::cuda::setCurrentCUDAStream(state_->pool);
}

CaptureStream::~CaptureStream() {
  if (!state_) return;
  try {
    state_->pool.synchronize();
  } catch (const std::exception& error) {
    log::error(fmt::format("the run's CUDA stream failed at its end: {}", error.what()));
  }
  c10::cuda::setCurrentCUDAStream(state_->previous);
}

struct ForwardBackwardRunner::Graph {
  at::cuda::CUDAGraph graph;
  Batch inputs;                // what the graph reads: the batch is copied in before each replay
  torch::Tensor loss;          // what it writes
  std::vector<int64_t> calls;  // the hooks' contributions per parameter in one pass
};

#else

bool cuda_graphs_available() { return false; }

struct CaptureStream::State {};
CaptureStream::CaptureStream(torch::Device device) {
  if (device.is_cuda()) throw std::logic_error("CaptureStream: a build without CUDA");
}
CaptureStream::~CaptureStream() = default;

struct ForwardBackwardRunner::Graph {};

#endif

ForwardBackwardRunner::ForwardBackwardRunner(torch::Device device, bool graphs) : device_(device), graphs_(graphs) {
  if (graphs_ && (!device.is_cuda() || !cuda_graphs_available())) {
    throw std::logic_error("ForwardBackwardRunner: CUDA graphs need a CUDA device and a CUDA build");
  }
  if (device.is_cuda()) {
    reciprocal_f32_ = torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kFloat32));
    reciprocal_f64_ = torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kFloat64));
  }
}

ForwardBackwardRunner::~ForwardBackwardRunner() = default;

void ForwardBackwardRunner::begin_step(int64_t target_tokens) {
  target_tokens_ = target_tokens;
  if (!device_.is_cuda()) return;
  // The reciprocal rounded once in each dtype, as LibTorch's CUDA division
  // by a host scalar forms it (1 / b in the operands' precision, then a
  // product): N_t is an integer below 2^53, exact in both.
  reciprocal_f32_.fill_(1.0f / static_cast<float>(target_tokens));
  reciprocal_f64_.fill_(1.0 / static_cast<double>(target_tokens));
}

torch::Tensor ForwardBackwardRunner::scaled(const torch::Tensor& loss_sum) const {
  if (!device_.is_cuda()) return loss_sum / static_cast<double>(target_tokens_);
  return loss_sum * (loss_sum.scalar_type() == torch::kFloat64 ? reciprocal_f64_ : reciprocal_f32_);
}

torch::Tensor ForwardBackwardRunner::run(const Batch& batch, ExactGradients* exact, const Pass& pass) {
  if (!graphs_ || batch.position_ids.defined()) return pass(batch);
#ifdef TRAINER_CUDA_KERNELS
  const Key key{batch.input_ids.sizes().vec(), batch.labels.sizes().vec(), batch.target_tokens};
  auto found = captured_.find(key);
  if (found == captured_.end()) {
    // The first pass of a shape runs eagerly; so do shapes past the bound.
    const int64_t seen = ++seen_[key];
    const bool full = captured_.size() >= kMaxGraphs;
    if (seen == 1 || full) {
      if (full && seen == 2) {
        log::warn(
            fmt::format("training.cuda_graphs: {} shapes captured already; {} of another shape (target count {}) "
                        "run without a graph",
                        kMaxGraphs, exact != nullptr ? "atoms" : "micro-steps", batch.target_tokens));
      }
      return pass(batch);
    }
    found = captured_.emplace(key, capture(batch, exact, pass)).first;
  }
  Graph& graph = *found->second;
  graph.inputs.input_ids.copy_(batch.input_ids);
  graph.inputs.labels.copy_(batch.labels);
  graph.graph.replay();
  if (exact != nullptr) exact->count_calls(graph.calls);
  ++replays_;
  return graph.loss;
#else
  (void)exact;
  throw std::logic_error("ForwardBackwardRunner: a build without CUDA");
#endif
}

std::unique_ptr<ForwardBackwardRunner::Graph> ForwardBackwardRunner::capture(const Batch& batch, ExactGradients* exact,
                                                                             const Pass& pass) {
#ifdef TRAINER_CUDA_KERNELS
  static_assert(std::is_same_v<decltype(pool_), at::cuda::MempoolId_t>);
  auto graph = std::make_unique<Graph>();
  graph->inputs = batch;
  graph->inputs.input_ids = batch.input_ids.clone();
  graph->inputs.labels = batch.labels.clone();
  const std::vector<int64_t> before = exact != nullptr ? exact->calls() : std::vector<int64_t>{};
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  // Every graph allocates from one memory pool: replays run one at a time
  // on this stream, and what a pass leaves (its loss) is read before the
  // next one runs.
  if (pool_ == decltype(pool_){0, 0}) {
    pool_ = at::cuda::graph_pool_handle();
    // The eager runs before the first capture left their blocks cached
    // outside the graphs' pool, where no replay can use them: a whole
    // micro-batch's activations, in the fast mode. Handed back once.
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  bool began = false;
  try {
#if TORCH_VERSION_MAJOR >= 2
    // Thread-local: another thread's CUDA calls (a communicator's watchdog) do not end the capture.
    graph->graph.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
#else
    graph->graph.capture_begin(pool_);
#endif
    began = true;
    graph->loss = pass(graph->inputs);
    graph->graph.capture_end();
  } catch (const std::exception& error) {
    // The capture is over either way: a stream left capturing fails every later call.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream.stream(), &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
    }
#if TORCH_VERSION_MAJOR >= 2
    // capture_end() ends the allocator's routing into the pool once the
    // stream's capture has ended, so not when the capture itself failed; a
    // failure after that (the graph's instantiation) has ended it already.
    if (began) {
      try {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(stream.device_index(), pool_);
      } catch (const std::exception&) {  // not routing into the pool any more
      }
    }
#else
    (void)began;
#endif
    cudaGetLastError();  // the capture's error is reported below, not by the next launch
    throw TrainingError(fmt::format(
        "training.cuda_graphs: {} forward and backward could not be captured in a CUDA graph ({}); "
        "the model and strategy must launch the same work for every {} with no host sync (set "
        "training.cuda_graphs = false to run without graphs)",
        exact != nullptr ? "an atom's" : "a micro-step's", error.what(), exact != nullptr ? "atom" : "micro-step"));
  }
  // The capture ran nothing: its hooks' counts are the replays' to add.
  if (exact != nullptr) {
    graph->calls.resize(before.size());
    std::vector<int64_t> undo(before.size());
    for (size_t i = 0; i < before.size(); ++i) {
      graph->calls[i] = exact->calls()[i] - before[i];
      undo[i] = -graph->calls[i];
    }
    exact->count_calls(undo);
  }
  ++captures_;
  log::info(fmt::format("training.cuda_graphs: {} of {} target tokens captured; its shape replays from now on",
                        exact != nullptr ? "an atom" : "a micro-step", batch.target_tokens));
  return graph;
#else
  (void)batch, (void)exact, (void)pass;
  throw std::logic_error("ForwardBackwardRunner: a build without CUDA");
#endif
}

}  // namespace trainer
