// Comm `nccl`: NCCL called directly on the tensors' device. Each collective
// runs on a dedicated communication stream that first waits for the work
// queued so far on the caller's stream; wait() makes the caller's stream
// wait for the collective and, on the host, enforces the job's timeout
// (a hung peer aborts the communicator instead of hanging the job).
#include <chrono>
#include <cstring>
#include <thread>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>
#include <nccl.h>

#include "trainer/Comm.h"
#include "trainer/Errors.h"

namespace {

using namespace trainer;

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw TrainingError(fmt::format("nccl {} failed: {}", what, ncclGetErrorString(result)));
  }
}

void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw TrainingError(fmt::format("cuda {} failed: {}", what, cudaGetErrorString(result)));
}

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat64: return ncclFloat64;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kFloat16: return ncclFloat16;
    case torch::kInt64: return ncclInt64;
    case torch::kInt32: return ncclInt32;
    default: throw std::invalid_argument(fmt::format("nccl: unsupported dtype {}", c10::toString(t.scalar_type())));
  }
}

class NcclWork final : public CommWork {
 public:
  NcclWork(cudaEvent_t done, ncclComm_t comm, std::chrono::milliseconds timeout, const char* what,
           std::vector<torch::Tensor> keep_alive)
      : done_(done), comm_(comm), timeout_(timeout), what_(what), keep_alive_(std::move(keep_alive)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  void wait() override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (true) {
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) check_cuda(state, "event query");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        throw TrainingError(fmt::format("nccl {} failed: {}", what_, ncclGetErrorString(async)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        throw TrainingError(fmt::format("nccl {} did not finish within {} s (a peer died or hangs); communicator "
                                        "aborted", what_, timeout_.count() / 1000.0));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check_cuda(cudaStreamWaitEvent(at::cuda::getCurrentCUDAStream().stream(), done_, 0), "stream wait");
  }

 private:
  cudaEvent_t done_;
  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  const char* what_;
  std::vector<torch::Tensor> keep_alive_;
};

class NcclComm final : public Comm {
 public:
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  void connect(const CommSetup& setup) override {
    if (!setup.device.is_cuda()) throw InputError("comm 'nccl' needs run.device = 'cuda'");
    rank_ = setup.rank;
    world_size_ = setup.world_size;
    timeout_ = setup.timeout;
    device_ = setup.device;
    c10::cuda::CUDAGuard guard(device_);
    ncclUniqueId id;
    const std::string key = "nccl/unique_id";
    if (rank_ == 0) {
      check_nccl(ncclGetUniqueId(&id), "get unique id");
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      setup.store->set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    } else {
      const std::vector<uint8_t> bytes = setup.store->get(key);
      if (bytes.size() != sizeof(id)) throw TrainingError("nccl: malformed unique id in the rendezvous store");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    check_nccl(ncclCommInitRank(&comm_, world_size_, id, rank_), "communicator init");
    stream_ = at::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index());
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::unique_ptr<CommWork> all_reduce_sum_async(torch::Tensor t) override {
    return launch("all-reduce", {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), ncclSum, comm_, s);
    });
  }

  std::unique_ptr<CommWork> reduce_scatter_sum_async(torch::Tensor input, torch::Tensor output) override {
    check_sizes(input, output, "reduce-scatter");
    return launch("reduce-scatter", {input, output}, [&](cudaStream_t s) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(output), ncclSum,
                               comm_, s);
    });
  }

  std::unique_ptr<CommWork> all_gather_async(torch::Tensor input, torch::Tensor output) override {
    check_sizes(output, input, "all-gather");
    return launch("all-gather", {input, output}, [&](cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), nccl_type(input), comm_, s);
    });
  }

  std::unique_ptr<CommWork> broadcast_async(torch::Tensor t, int root) override {
    return launch("broadcast", {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root, comm_, s);
    });
  }

  std::unique_ptr<CommWork> reduce_sum_async(torch::Tensor t, int root) override {
    return launch("reduce", {t}, [&](cudaStream_t s) {
      return ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), ncclSum, root, comm_, s);
    });
  }

  void barrier() override {
    torch::Tensor one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    all_reduce_sum_async(one)->wait();
  }

 private:
  template <class Op>
  std::unique_ptr<CommWork> launch(const char* what, std::vector<torch::Tensor> tensors, Op op) {
    for (const torch::Tensor& t : tensors) {
      if (!t.is_cuda() || !t.is_contiguous()) throw std::invalid_argument(fmt::format("nccl {}: tensors must be contiguous CUDA tensors", what));
    }
    c10::cuda::CUDAGuard guard(device_);
    // Order the collective after everything the caller queued, then let the
    // caching allocator know the communication stream uses these tensors.
    cudaEvent_t ready = nullptr, done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(ready, at::cuda::getCurrentCUDAStream(device_.index()).stream()), "event record");
    check_cuda(cudaStreamWaitEvent(stream_.stream(), ready, 0), "stream wait");
    cudaEventDestroy(ready);
    for (const torch::Tensor& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    check_nccl(op(stream_.stream()), what);
    check_cuda(cudaEventRecord(done, stream_.stream()), "event record");
    return std::make_unique<NcclWork>(done, comm_, timeout_, what, std::move(tensors));
  }

  void check_sizes(const torch::Tensor& whole, const torch::Tensor& part, const char* what) const {
    if (whole.numel() != part.numel() * world_size_ || whole.scalar_type() != part.scalar_type()) {
      throw std::invalid_argument(fmt::format("nccl {}: {} elements are not world size {} x {} of the same dtype",
                                              what, whole.numel(), world_size_, part.numel()));
    }
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_{300000};
  torch::Device device_ = torch::kCPU;
  c10::cuda::CUDAStream stream_ = c10::cuda::getDefaultCUDAStream();
};

Component* create(const Options&, const Context&) { return new NcclComm(); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Comm, "nccl", "0.1.0",
                                           "CUDA collectives calling NCCL directly", TRAINER_TORCH_VERSION,
                                           nullptr, 0, &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
