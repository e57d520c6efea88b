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

#include "trainer/Comm.h"
#include "trainer/Options.h"
#include "trainer/Strategy.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/ShardGroups.h"

namespace trainer {

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
