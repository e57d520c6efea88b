// Hybrid sharding's shard and replica groups (see trainer/sharding/ShardGroups.h).
#include "trainer/sharding/ShardGroups.h"

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

ShardGroups::ShardGroups(Comm& world, int64_t size, const std::string& strategy) {
  const int ranks = world.world_size();
  if (size == 0) size = ranks;
  if (size < 1 || ranks % size != 0) {
    throw InputError(fmt::format("strategy.shard_group_size = {}: must divide the world size {} (strategy '{}')", size,
                                 ranks, strategy));
  }
  const int s = static_cast<int>(size), rank = world.rank();
  const auto own = [this](std::unique_ptr<Comm> comm) {
    owned_.push_back(std::move(comm));
    return owned_.back().get();
  };
  shard_ = s == ranks ? &world : (s == 1 ? own(make_single_process_comm()) : own(world.split(rank / s, rank % s)));
  replicas_ = s == ranks ? own(make_single_process_comm()) : (s == 1 ? &world : own(world.split(rank % s, rank / s)));
}

void ShardGroups::sum_over_replicas(torch::Tensor tensor) const {
  if (replicas_->world_size() > 1) replicas_->all_reduce_sum(tensor);
}

void ShardGroups::start_sum_over_replicas(torch::Tensor tensor) {
  if (replicas_->world_size() > 1) started_.push_back(replicas_->all_reduce_sum_async(std::move(tensor)));
}

void ShardGroups::finish_sums_over_replicas() {
  for (std::unique_ptr<CommWork>& work : started_) work->wait();
  started_.clear();
}

}  // namespace trainer
