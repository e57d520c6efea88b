// Hybrid sharding's process groups: the ranks a shard is split among, and
// the ranks that hold the same shard.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Comm.h"
#include "trainer/Options.h"

namespace trainer {

/// The process groups of hybrid sharding (a strategy's `shard_group_size`
/// key, FSDP's HSDP): ranks [k s, (k + 1) s) form shard group k and split
/// the state among themselves; the ranks at one position in every shard
/// group hold the same shard and form a replica group. Gradients are
/// reduced within the shard group, then summed over the replica group; the
/// parameters are gathered within the shard group only. With s = world
/// size (the default) there is one shard group and no replication.
class ShardGroups {
 public:
  ShardGroups() = default;
  /// Collective over `world`. `size` 0 means the world size; any other
  /// value must divide it, else InputError naming the strategy's key.
  ShardGroups(Comm& world, int64_t size, const std::string& strategy);

  /// The ranks this rank splits the state with.
  Comm& shard() const { return *shard_; }
  /// The ranks holding the same shard as this rank (one per shard group).
  Comm& replicas() const { return *replicas_; }
  /// Collective over replicas(): `tensor` summed over them, in place;
  /// nothing at one shard group.
  void sum_over_replicas(torch::Tensor tensor) const;
  /// The same, started: `tensor` (e.g. a range of a shard accumulator that
  /// is final, during the step's last backward) holds the sum once
  /// finish_sums_over_replicas() returns, and must not change before.
  void start_sum_over_replicas(torch::Tensor tensor);
  /// Waits for every sum started so far.
  void finish_sums_over_replicas();

 private:
  Comm* shard_ = nullptr;
  Comm* replicas_ = nullptr;
  std::vector<std::unique_ptr<Comm>> owned_;  // the groups split off the world
  std::vector<std::unique_ptr<CommWork>> started_;
};

/// The recipe key every sharded strategy declares for ShardGroups.
inline constexpr KeySpec kShardGroupSizeKey{
    "shard_group_size",
    ValueType::Int,
    "0",
    "ranks that split the state among themselves (hybrid sharding: replicated across such groups); 0: all",
    0,
    1 << 20};

}  // namespace trainer
