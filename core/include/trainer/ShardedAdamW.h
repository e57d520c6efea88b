// The optimizer half of a sharded (ZeRO) strategy, as a building block:
// for each flat parameter group, this rank's shard of the padded buffer,
// its real elements, an fp32 accumulator of the shard's summed gradient,
// the shard's fp32 master values and the AdamW moments of its real
// elements. A strategy composes it with what makes it its stage (how the
// gradient reaches the accumulator, where the full parameters live); the
// block knows nothing of stages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/AdamW.h"
#include "trainer/Comm.h"
#include "trainer/FlatParameters.h"
#include "trainer/Options.h"
#include "trainer/Strategy.h"

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

/// One group's shard on this rank.
struct OptimizerShard {
  Shard shard;             ///< this rank's slice of the padded flat buffer
  Shard owned;             ///< its real elements (padding excluded; possibly none)
  bool decay = true;       ///< weight decay applies to the group
  torch::Tensor values;    ///< shard.numel fp32 master values (a view into a full buffer, or the shard's own)
  torch::Tensor gradient;  ///< shard.numel fp32: the step's summed gradient of the shard
  AdamWState state;        ///< owned.numel elements
};

/// A bucket of one group's full gradient on its way to the ranks whose
/// shards hold its elements; finish() waits for it and adds this rank's part
/// into its accumulator, and returns that part of the accumulator
/// (undefined when this rank holds none of the bucket).
class ShardReduction {
 public:
  torch::Tensor finish();

 private:
  friend class ShardedAdamW;
  std::vector<std::unique_ptr<CommWork>> works_;
  torch::Tensor mine_, into_;
};

class ShardedAdamW {
 public:
  /// For strategies whose every rank keeps the full fp32 parameters (flat
  /// groups padded to a multiple of the world size): this rank's shard of
  /// each group, its values a view into the group's full buffer.
  static ShardedAdamW viewing(std::vector<ParameterGroup>& groups, const Comm& comm);

  /// Adds group `groups().size()`: `values` are this rank's shard.numel fp32
  /// master values of it (kept, not copied). The gradient accumulator starts
  /// at zero.
  void add_group(const Shard& shard, const Shard& owned, bool decay, torch::Tensor values);

  std::vector<OptimizerShard>& groups() { return groups_; }
  const std::vector<OptimizerShard>& groups() const { return groups_; }

  /// Collective (every rank passes the same range): `bucket` holds elements
  /// [begin, begin + bucket.numel()) of group `group`'s padded flat
  /// gradient; each owner's part of it is reduced to that owner, one reduce
  /// per owner, in shard order.
  ShardReduction reduce_to_owners(Comm& comm, size_t group, int64_t begin, const torch::Tensor& bucket);

  /// Collective: the L2 norm of the whole gradient (every rank's owned
  /// elements), the same on every rank.
  double gradient_norm(Comm& comm) const;

  /// AdamW with `args` on the owned elements of every group, in place in
  /// `values`. The gradient accumulators keep their sums until
  /// zero_gradients().
  void update(const AdamWConfig& config, const UpdateArgs& args);

  void zero_gradients();

  /// The Strategy methods of the same names, over the owned elements.
  std::vector<FlatSlice> gradient_slices() const;
  std::vector<FlatSlice> parameter_slices() const;
  std::vector<StateSlice> state_slices();

  /// Bytes of the gradient accumulators, and of the moments.
  int64_t gradient_bytes() const;
  int64_t moment_bytes() const;

 private:
  std::vector<OptimizerShard> groups_;
};

/// Collective, for the same strategies: every rank's updated shard into
/// every rank's full parameters (and their compute copies).
void all_gather_parameters(const ShardedAdamW& optimizer, std::vector<ParameterGroup>& groups, Comm& comm);

}  // namespace trainer
