// Rendezvous through c10d's TCPStore.
#include "distributed/Rendezvous.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef TRAINER_CUDA_KERNELS
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "util/BriefError.h"
#include "util/Hash.h"

namespace trainer {

torch::Device bind_rank_device(bool cuda, const WorldInfo& world) {
  if (!cuda) return torch::kCPU;
  if (!torch::cuda::is_available()) throw InputError("run.device = 'cuda': this machine has no CUDA device");
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_index(
                                               world, static_cast<int>(torch::cuda::device_count()))));
#ifdef TRAINER_CUDA_KERNELS
  c10::cuda::set_device(device.index());
#endif
  // The CUDA context and LibTorch's per-device state on this GPU exist from
  // here on (they are otherwise made by the first tensor, wherever it lands).
  (void)torch::empty({0}, torch::TensorOptions().device(device));
  return device;
}

c10::intrusive_ptr<c10d::Store> join_store(const WorldInfo& world, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(world.master_port);
  options.isServer = world.rank == 0 && !world.agent_store;
  options.numWorkers = static_cast<size_t>(world.world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, options);
    if (world.master_port == 0) {
      log::info(fmt::format("rank 0 hosts the rendezvous at {}:{} (MASTER_PORT for the other ranks)", world.master_addr,
                            store->getPort()));
    }
    return store;
  } catch (const std::exception& error) {
    const std::string where = fmt::format("{}:{}", world.master_addr, world.master_port);
    if (options.isServer) {
      throw InputError(
          fmt::format("rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = {} (is the port already in "
                      "use? choose another MASTER_PORT): {}",
                      where, brief_error(error)));
    }
    throw TrainingError(fmt::format("rank {} cannot reach the rendezvous at {} (rank 0 hosts it) within {} s: {}",
                                    world.rank, where, timeout.count() / 1000.0, brief_error(error)));
  }
}

void check_same_recipe(c10d::Store& store, const WorldInfo& world, const std::string& resolved_recipe,
                       std::chrono::milliseconds timeout) {
  const std::string mine = text_xxh3(resolved_recipe);
  store.set(fmt::format("trainer/recipe/{}", world.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  // Every rank's key first, so that a rank that never comes is named (a
  // get() of its key would only say "Socket Timeout").
  std::vector<std::string> keys;
  for (int rank = 0; rank < world.world_size; ++rank) keys.push_back(fmt::format("trainer/recipe/{}", rank));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::vector<int> missing;
    for (int rank = 0; rank < world.world_size; ++rank) {
      try {
        if (!store.check({keys[rank]})) missing.push_back(rank);
      } catch (const std::exception&) {
        missing.push_back(rank);
      }
    }
    throw TrainingError(fmt::format(
        "rank {}: rank(s) {} of {} did not join the rendezvous at {}:{} within distributed.timeout_s = {} s (not "
        "started, crashed, or started with another MASTER_ADDR, MASTER_PORT or WORLD_SIZE)",
        world.rank, fmt::join(missing, ", "), world.world_size, world.master_addr,
        dynamic_cast<c10d::TCPStore*>(&store) ? dynamic_cast<c10d::TCPStore&>(store).getPort() : world.master_port,
        timeout.count() / 1000.0));
  }
  std::string mismatch;
  for (int rank = 0; rank < world.world_size && mismatch.empty(); ++rank) {
    const std::vector<uint8_t> theirs_bytes = store.get(fmt::format("trainer/recipe/{}", rank));
    const std::string theirs(theirs_bytes.begin(), theirs_bytes.end());
    if (theirs != mine) {
      mismatch = fmt::format(
          "rank {}'s resolved recipe (hash {}) differs from rank {}'s (hash {}): every rank "
          "must run the same recipe and --set overrides",
          world.rank, mine, rank, theirs);
    }
  }
  // Rank 0 hosts the store: it leaves only once every rank has compared, so
  // that each one reports the mismatch itself rather than a lost connection.
  store.set(fmt::format("trainer/recipe-checked/{}", world.rank), std::vector<uint8_t>{1});
  if (world.rank == 0) {
    std::vector<std::string> keys;
    for (int rank = 0; rank < world.world_size; ++rank) keys.push_back(fmt::format("trainer/recipe-checked/{}", rank));
    try {
      store.wait(keys);
    } catch (const std::exception&) {
      // a rank that never comes is reported by the collective that waits for it
    }
  }
  if (!mismatch.empty()) throw InputError(mismatch);
}

std::unique_ptr<Comm> connect_world(PluginRegistry& registry, const std::string& backend, const WorldInfo& world,
                                    std::chrono::milliseconds timeout, torch::Device device,
                                    const std::string& fingerprint, bool use_backend_alone,
                                    c10::intrusive_ptr<c10d::Store>* job_store) {
  if (world.world_size == 1 && !use_backend_alone) return make_single_process_comm();
  c10::intrusive_ptr<c10d::Store> store;
  if (world.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    store = join_store(world, timeout);
    check_same_recipe(*store, world, fingerprint, timeout);
    if (job_store) *job_store = store;
  }
  Context context;
  context.rank = world.rank;
  context.world_size = world.world_size;
  context.local_rank = world.local_rank;
  auto comm = PluginRegistry::create<Comm>(registry.find(PluginKind::Comm, backend), Options(), context);
  comm->connect(CommSetup{store, world.rank, world.world_size, timeout, device});
  return comm;
}

WriterGate::WriterGate(c10::intrusive_ptr<c10d::Store> store, int rank, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), timeout_(timeout) {
  if (!store_ || rank_ != 0) return;
  // The thread alone talks to the store while the gate is open.
  heartbeat_ = std::thread([this] {
    while (!closing_.load()) {
      try {
        store_->add(kWriterHeartbeatKey, 1);
      } catch (const std::exception&) {
        return;  // the store's host is gone: nobody is waiting any more
      }
      for (auto slept = std::chrono::milliseconds(0); slept < kHeartbeat && !closing_.load();
           slept += std::chrono::milliseconds(10)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  });
}

WriterGate::~WriterGate() {
  if (!closed_) {
    try {
      finish("failed");
    } catch (const std::exception&) {
      // the store is gone: the others find out through their own timeout
    }
  }
}

void WriterGate::finish(const char* outcome) {
  closed_ = true;
  if (!store_ || rank_ != 0) return;
  closing_.store(true);
  if (heartbeat_.joinable()) heartbeat_.join();
  const std::string text = outcome;
  store_->set(kWriterOutcomeKey, std::vector<uint8_t>(text.begin(), text.end()));
}

void WriterGate::close() {
  if (rank_ == 0 || !store_) {
    finish("done");
    return;
  }
  closed_ = true;
  using Clock = std::chrono::steady_clock;
  int64_t last_beat = -1;
  Clock::time_point last_change = Clock::now();
  for (;;) {
    if (store_->check({kWriterOutcomeKey})) {
      const std::vector<uint8_t> outcome = store_->get(kWriterOutcomeKey);
      if (std::string(outcome.begin(), outcome.end()) == "done") return;
      throw TrainingError("rank 0 failed to write the final outputs (see its message)");
    }
    const int64_t beat = store_->add(kWriterHeartbeatKey, 0);
    if (beat != last_beat) {
      last_beat = beat;
      last_change = Clock::now();
    } else if (Clock::now() - last_change > timeout_) {
      throw TrainingError(fmt::format(
          "rank 0 stopped answering while writing the final outputs (no heartbeat for {} s, distributed.timeout_s)",
          timeout_.count() / 1000.0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace trainer
