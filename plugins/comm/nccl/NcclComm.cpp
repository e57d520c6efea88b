// Comm `nccl`: NCCL called directly on the tensors' device. Each collective
// runs on a dedicated communication stream that first waits for the work
// queued so far on the caller's stream; wait() only makes the caller's
// stream wait for it (cudaStreamWaitEvent), the host never spins. A
// watchdog thread owns the job's timeout: a collective unfinished after
// distributed.timeout_s, or an asynchronous NCCL error, aborts the
// communicator once, and the next call of this rank fails naming the
// collective; an aborted communicator is never destroyed again, and once
// one communicator of the process is aborted every other one is aborted
// too (a sub-group destroyed with work in flight to a dead peer would hang).
// Sub-groups (split) are NCCL's own (ncclCommSplit), each with its stream
// and watchdog. Communicators are non-blocking, so that init and split are
// watched by the same timeout and name the ranks that did not arrive.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
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
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kFloat64:
      return ncclFloat64;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kFloat16:
      return ncclFloat16;
    case torch::kInt64:
      return ncclInt64;
    case torch::kInt32:
      return ncclInt32;
    default:
      throw std::invalid_argument(fmt::format("nccl: unsupported dtype {}", c10::toString(t.scalar_type())));
  }
}

// Once any communicator of this process is aborted, every other one is:
// the first failure, which each watchdog reads on its next wake-up (no
// watchdog ever takes another's lock).
std::mutex g_poison_mutex;
std::string g_poison;  // "" until a communicator is aborted
std::atomic<bool> g_poisoned{false};

void poison_process(const std::string& failure) {
  std::lock_guard<std::mutex> lock(g_poison_mutex);
  if (g_poison.empty()) g_poison = failure;
  g_poisoned.store(true);
}

std::string process_poison() {
  std::lock_guard<std::mutex> lock(g_poison_mutex);
  return g_poison;
}

using Clock = std::chrono::steady_clock;

// A non-blocking communicator's pending operation (init, split, or a call
// that returned ncclInProgress) finished: polls its state until it is no
// longer in progress. On the deadline the communicator is aborted and the
// error names `what` and, through `late`, who did not arrive.
void settle(ncclComm_t comm, Clock::time_point deadline, const std::string& what,
            const std::function<std::string()>& late) {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      throw TrainingError(fmt::format("nccl {} failed: {}", what, ncclGetErrorString(state)));
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      poison_process(what + " timed out");
      throw TrainingError(fmt::format("nccl {} did not complete within distributed.timeout_s{}", what, late()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// A collective in flight: the event recorded after it on the
// communication stream. Shared by its work object and the watchdog, so
// either may outlive the other.
struct InFlight {
  cudaEvent_t done = nullptr;
  const char* what = "";
  Clock::time_point started;
  ~InFlight() { cudaEventDestroy(done); }
};

// The communicator's only timer. Every collective is queued here when it
// is launched; the thread wakes every few milliseconds (it sleeps on a
// condition variable, never spins), drops the finished ones, and on the
// first one past the timeout, or on an asynchronous NCCL error, aborts the
// communicator, once, under the lock that launches take, so no collective
// is ever enqueued on an aborted communicator.
class Watchdog {
 public:
  /// `who`: this rank in messages ("rank 3", or a sub-group's rank and the
  /// world's).
  Watchdog(ncclComm_t comm, std::chrono::milliseconds timeout, std::string who, int device)
      : comm_(comm), timeout_(timeout), who_(std::move(who)), device_(device), thread_([this] { run(); }) {}
  ~Watchdog() { stop(); }

  /// Stops the thread (idempotent). Afterwards aborted() is final: the
  /// thread can no longer abort the communicator behind the caller's back.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::mutex& launch_mutex() { return mutex_; }
  /// The stopped watchdog's communicator must be aborted, not destroyed:
  /// another of the process was (its peers may be gone).
  static bool process_poisoned() { return g_poisoned.load(); }
  /// Throws the failure, if any (call with launch_mutex() held or not).
  void check() const {
    if (aborted_.load()) throw TrainingError(failure_);
  }
  /// With launch_mutex() held, before a launch: check(), and once another
  /// communicator of the process is aborted, this one is aborted here and
  /// now (its watchdog would do it on its next wake-up, with the
  /// collective already enqueued on a communicator about to be aborted).
  void check_launch() {
    if (!aborted_.load() && g_poisoned.load()) {
      abort(fmt::format("nccl communicator of {} aborted because another communicator of this process was: {}", who_,
                        process_poison()));
    }
    check();
  }
  bool aborted() const { return aborted_.load(); }
  /// With launch_mutex() held.
  void watch(std::shared_ptr<InFlight> work) { pending_.push_back(std::move(work)); }

 private:
  void run() {
    cudaSetDevice(device_);  // the communicator's device, for the event queries
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_ && !aborted_.load()) {
      wake_.wait_for(lock, std::chrono::milliseconds(5));
      if (stopping_ || aborted_.load()) break;  // stopped, or aborted by a launch (check_launch) meanwhile
      while (!pending_.empty() && cudaEventQuery(pending_.front()->done) == cudaSuccess) pending_.pop_front();
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (g_poisoned.load()) {
        abort(fmt::format("nccl communicator of {} aborted because another communicator of this process was: {}", who_,
                          process_poison()));
      } else if (async != ncclSuccess && async != ncclInProgress) {
        abort(fmt::format("nccl failed on {}: {}{}", who_, ncclGetErrorString(async),
                          pending_.empty() ? "" : fmt::format(" (in {})", pending_.front()->what)));
      } else if (!pending_.empty() && Clock::now() - pending_.front()->started > timeout_) {
        abort(
            fmt::format("nccl {} on {} did not finish within {} s (distributed.timeout_s: a peer died or "
                        "hangs); the communicator was aborted",
                        pending_.front()->what, who_, timeout_.count() / 1000.0));
      }
    }
  }

  // With mutex_ held. The message goes to stderr at once too: a thread of
  // this rank may be blocked on the device until the abort frees it.
  // Marked aborted before ncclCommAbort: a host waiting on a collective
  // that the abort lets finish must see the failure, not a result.
  // The process is poisoned before this communicator reads as aborted: a
  // thread that sees the failure here and goes on to another communicator
  // finds that one poisoned too (its launch aborts it; check_launch()).
  void abort(const std::string& failure) {
    if (aborted_.load()) return;  // once: a second ncclCommAbort frees the communicator twice
    poison_process(failure);
    failure_ = failure;
    aborted_.store(true);
    std::fprintf(stderr, "%s\n", failure.c_str());
    released_hang().store(true);  // an injected hang lets its stream go before the abort
    ncclCommAbort(comm_);
    pending_.clear();
  }

 public:
  /// Tests: a collective held back on its stream until the watchdog aborts.
  static std::atomic<bool>& released_hang() {
    static std::atomic<bool> released{false};
    return released;
  }

 private:
  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  std::string who_;
  int device_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<InFlight>> pending_;
  std::string failure_;
  std::atomic<bool> aborted_{false};
  bool stopping_ = false;
  std::thread thread_;  // last: starts once everything above exists
};

class NcclWork final : public CommWork {
 public:
  /// `caller`: the stream that was current on the tensors' device when the
  /// collective was launched.
  NcclWork(std::shared_ptr<InFlight> work, const Watchdog& watchdog, c10::cuda::CUDAStream caller,
           std::vector<torch::Tensor> keep_alive)
      : work_(std::move(work)), watchdog_(watchdog), caller_(caller), keep_alive_(std::move(keep_alive)) {}

  // Ordered on the GPU: later work on the caller's stream (the one current
  // at launch, on the communicator's device, whichever device or stream is
  // current now) waits for the collective; the host goes on at once.
  void wait() override {
    watchdog_.check();
    check_cuda(cudaStreamWaitEvent(caller_.stream(), work_->done, 0), "stream wait");
  }

  /// Blocks the host until the collective finished, polling (a dead peer
  /// ends it through the watchdog's abort, which this sees).
  void wait_on_host() {
    for (;;) {
      watchdog_.check();
      const cudaError_t state = cudaEventQuery(work_->done);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) check_cuda(state, "event query");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  std::shared_ptr<InFlight> work_;
  const Watchdog& watchdog_;
  c10::cuda::CUDAStream caller_;
  std::vector<torch::Tensor> keep_alive_;
};

// Tests (TRAINER_FAULT_INJECT=nccl-hang at connect): a host function ahead of
// every collective on the communication stream holds it back until the
// watchdog aborts, as a peer that never comes would.
void CUDART_CB hold_until_aborted(void*) {
  while (!Watchdog::released_hang().load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

class NcclComm final : public Comm {
 public:
  ~NcclComm() override {
    // The watchdog stopped first: it may abort the communicator up to the
    // moment its thread ends, and aborting twice frees it twice.
    if (watchdog_) watchdog_->stop();
    const bool aborted = watchdog_ && watchdog_->aborted();
    watchdog_.reset();
    if (!comm_ || aborted) return;  // an aborted communicator is already freed
    // After another communicator's abort a peer may be dead: destroying
    // would wait for work in flight to it forever.
    if (Watchdog::process_poisoned()) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
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
    // Each rank says it reached init, so that a timeout can name the ranks
    // that did not.
    setup.store->set(fmt::format("nccl/init/{}", rank_), std::vector<uint8_t>{1});
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const Clock::time_point deadline = Clock::now() + timeout_;
    check_nccl(ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config), "communicator init");
    const c10::intrusive_ptr<c10d::Store> store = setup.store;
    const int world = world_size_;
    try {
      settle(comm_, deadline, fmt::format("communicator init on rank {}", rank_), [store, world] {
        std::vector<int> missing;
        for (int r = 0; r < world; ++r) {
          if (!store->check({fmt::format("nccl/init/{}", r)})) missing.push_back(r);
        }
        return missing.empty() ? std::string(": every rank reached it, a peer stopped answering")
                               : fmt::format(": rank(s) {} never arrived", fmt::join(missing, ", "));
      });
    } catch (...) {
      comm_ = nullptr;  // aborted (freed) by settle
      throw;
    }
    start(fmt::format("rank {}", rank_));
  }

  // ncclCommSplit: NCCL exchanges the colors and keys itself. The new
  // communicator gets its own stream and watchdog.
  std::unique_ptr<Comm> split(int color, int key) override {
    if (color < 0) throw std::invalid_argument("nccl split: colors are >= 0");
    auto group = std::make_unique<NcclComm>();
    group->timeout_ = timeout_;
    group->device_ = device_;
    {
      // Non-blocking: the split is watched by the timeout here, since the
      // parent's watchdog cannot run while its launch lock is held.
      c10::cuda::CUDAGuard guard(device_);
      std::lock_guard<std::mutex> lock(watchdog_->launch_mutex());
      watchdog_->check_launch();
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const Clock::time_point deadline = Clock::now() + timeout_;
      check_nccl(ncclCommSplit(comm_, color, key, &group->comm_, &config), "communicator split");
      const std::string what = fmt::format("communicator split on {}", who_);
      settle(comm_, deadline, what, [] { return std::string(": a rank of the group did not call split"); });
      try {
        settle(group->comm_, deadline, what, [] { return std::string(": a rank of the new group did not arrive"); });
      } catch (...) {
        group->comm_ = nullptr;
        throw;
      }
    }
    check_nccl(ncclCommUserRank(group->comm_, &group->rank_), "communicator rank");
    check_nccl(ncclCommCount(group->comm_, &group->world_size_), "communicator size");
    group->start(fmt::format("rank {} of a sub-group of {} ({})", group->rank_, group->world_size_, who_));
    return group;
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
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(output), ncclSum, comm_,
                               s);
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

  // A host barrier (Comm.h): the all-reduce, then the host waits for it.
  void barrier() override {
    torch::Tensor one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    std::unique_ptr<CommWork> work = all_reduce_sum_async(one);
    static_cast<NcclWork&>(*work).wait_on_host();
  }

 private:
  template <class Op>
  std::unique_ptr<CommWork> launch(const char* what, std::vector<torch::Tensor> tensors, Op op) {
    for (const torch::Tensor& t : tensors) {
      if (!t.is_cuda() || !t.is_contiguous())
        throw std::invalid_argument(fmt::format("nccl {}: tensors must be contiguous CUDA tensors", what));
    }
    c10::cuda::CUDAGuard guard(device_);
    std::lock_guard<std::mutex> lock(watchdog_->launch_mutex());
    watchdog_->check_launch();  // never enqueue on an aborted communicator
    // Order the collective after everything the caller queued, then let the
    // caching allocator know the communication stream uses these tensors
    // (their memory is not reused before the collective ends, even when the
    // caller drops them right after wait()).
    cudaEvent_t ready = nullptr;
    auto work = std::make_shared<InFlight>();
    work->what = what;
    const c10::cuda::CUDAStream caller = at::cuda::getCurrentCUDAStream(device_.index());
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventCreateWithFlags(&work->done, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(ready, caller.stream()), "event record");
    check_cuda(cudaStreamWaitEvent(stream_.stream(), ready, 0), "stream wait");
    cudaEventDestroy(ready);
    for (const torch::Tensor& t : tensors)
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    if (inject_hang_) check_cuda(cudaLaunchHostFunc(stream_.stream(), hold_until_aborted, nullptr), "host function");
    const ncclResult_t launched = op(stream_.stream());
    check_nccl(launched, what);
    // A non-blocking communicator may still be connecting: the call is
    // enqueued once its state leaves ncclInProgress.
    if (launched == ncclInProgress) {
      settle(comm_, Clock::now() + timeout_, fmt::format("{} on {}", what, who_), [] { return std::string(); });
    }
    check_cuda(cudaEventRecord(work->done, stream_.stream()), "event record");
    work->started = Clock::now();
    watchdog_->watch(work);
    return std::make_unique<NcclWork>(std::move(work), *watchdog_, caller, std::move(tensors));
  }

  // After comm_ exists: the stream, the fault injection and the watchdog.
  void start(std::string who) {
    who_ = std::move(who);
    stream_ = at::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index());
    const char* fault = std::getenv("TRAINER_FAULT_INJECT");
    inject_hang_ = fault && std::string(fault) == "nccl-hang";
    watchdog_ = std::make_unique<Watchdog>(comm_, timeout_, who_, device_.index());
  }

  void check_sizes(const torch::Tensor& whole, const torch::Tensor& part, const char* what) const {
    if (whole.numel() != part.numel() * world_size_ || whole.scalar_type() != part.scalar_type()) {
      throw std::invalid_argument(fmt::format("nccl {}: {} elements are not world size {} x {} of the same dtype", what,
                                              whole.numel(), world_size_, part.numel()));
    }
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  std::string who_;  // this rank in messages
  std::chrono::milliseconds timeout_{300000};
  torch::Device device_ = torch::kCPU;
  c10::cuda::CUDAStream stream_ = c10::cuda::getDefaultCUDAStream();
  bool inject_hang_ = false;
  std::unique_ptr<Watchdog> watchdog_;  // after comm_: stopped before the communicator goes
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Comm, NcclComm, "nccl", "0.1.0", "CUDA collectives calling NCCL directly", ::trainer::kNoKeys)
