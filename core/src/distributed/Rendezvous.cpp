// Rendezvous through c10d's TCPStore.
#include "distributed/Rendezvous.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "trainer/Errors.h"
#include "util/Hash.h"

namespace trainer {

c10::intrusive_ptr<c10d::Store> join_store(const WorldInfo& world, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(world.master_port);
  options.isServer = world.rank == 0 && !world.agent_store;
  options.numWorkers = static_cast<size_t>(world.world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(world.master_addr, options);
  } catch (const std::exception& error) {
    const std::string where = fmt::format("{}:{}", world.master_addr, world.master_port);
    if (options.isServer) {
      throw InputError(
          fmt::format("rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = {} (is the port already in "
                      "use? choose another MASTER_PORT): {}",
                      where, error.what()));
    }
    throw TrainingError(fmt::format("rank {} cannot reach the rendezvous at {} within {} s: {}", world.rank, where,
                                    timeout.count() / 1000.0, error.what()));
  }
}

void check_same_recipe(c10d::Store& store, const WorldInfo& world, const std::string& resolved_recipe) {
  const std::string mine = text_xxh3(resolved_recipe);
  store.set(fmt::format("trainer/recipe/{}", world.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
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
                                    const std::string& fingerprint, bool use_backend_alone) {
  if (world.world_size == 1 && !use_backend_alone) return make_single_process_comm();
  c10::intrusive_ptr<c10d::Store> store;
  if (world.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    store = join_store(world, timeout);
    check_same_recipe(*store, world, fingerprint);
  }
  Context context;
  context.rank = world.rank;
  context.world_size = world.world_size;
  context.local_rank = world.local_rank;
  auto comm = PluginRegistry::create<Comm>(registry.find(PluginKind::Comm, backend), Options(), context);
  comm->connect(CommSetup{store, world.rank, world.world_size, timeout, device});
  return comm;
}

}  // namespace trainer
