// The optimizer half of every strategy, as a building block: for each flat
// parameter group, the slice of it this rank updates (its shard, or the
// whole group for a strategy that replicates the state), its real
// elements, an fp32 accumulator of the slice's summed gradient, the fp32
// master values and the optimizer's per-element state. A strategy composes
// it with what makes it that strategy (how the gradient reaches the
// accumulator, where the full parameters live); the block knows no
// strategy, and no optimizer by name (trainer/Optimizer.h).
//
// How whole-matrix optimizers (Muon) are served under sharding: the state
// stays sharded per element. At the update, each whole-matrix parameter's
// directions (Optimizer::prepare on the elements each rank holds) are
// assembled into the whole matrix on the ranks that hold part of it, by an
// all-reduce over the shard group of a buffer into which each rank wrote
// only its own elements (zeros elsewhere: the sum is exact, so every holder
// sees the same bits as a single rank would); each holder transforms it and
// applies its own part. A matrix inside one rank's shard needs no
// communication, and in a strategy whose every rank updates the whole
// group (ddp) none does. Matrices of one shape are taken in stacks of the
// optimizer's stack_size(): the whole-matrix parameters of every group, in
// order of first appearance of each shape, cut into runs of that many; each
// rank stacks the ones it holds of a run (zeros fill the rest) and
// transforms them at once. The runs and the all-reduces inside them follow
// the parameter order, the same on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Comm.h"
#include "trainer/Optimizer.h"
#include "trainer/Options.h"
#include "trainer/Strategy.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/ShardGroups.h"

namespace trainer {

/// One group's slice on this rank.
struct OptimizerShard {
  Shard shard;                       ///< this rank's slice of the padded flat buffer
  Shard owned;                       ///< its real elements (padding excluded; possibly none)
  bool decay = true;                 ///< weight decay applies to the group
  torch::Tensor values;              ///< shard.numel fp32 master values (a view into a full buffer, or the shard's own)
  torch::Tensor gradient;            ///< shard.numel fp32: the step's summed gradient of the shard
  std::vector<torch::Tensor> state;  ///< per Optimizer::state_names(), owned.numel elements each
  torch::Tensor compute;             ///< optional: the owned elements' compute copy, written by the update
  std::vector<ParameterInfo> parameters;  ///< every parameter of the group (all ranks alike)
  std::vector<char> whole_matrix;         ///< per parameter: takes the whole-matrix path
};

/// A bucket of one group's full gradient on its way to the ranks whose
/// shards hold its elements; finish() waits for it and adds this rank's part
/// into its accumulator, and returns that part of the accumulator
/// (undefined when this rank holds none of the bucket).
class ShardReduction {
 public:
  torch::Tensor finish();

 private:
  friend class OptimizerShards;
  std::vector<std::unique_ptr<CommWork>> works_;
  torch::Tensor mine_, into_;
};

class OptimizerShards {
 public:
  OptimizerShards() = default;
  /// `optimizer` outlives this object. `shard_ranks`: how many ranks split
  /// each group (1 when every rank updates whole groups).
  OptimizerShards(Optimizer& optimizer, int shard_ranks);

  /// For strategies whose every rank keeps the full fp32 parameters (flat
  /// groups padded to a multiple of `ranks`): this rank's shard of each
  /// group, its values a view into the group's full buffer. With
  /// `write_compute`, the update writes the groups' compute copies of the
  /// owned elements too (for ranks = 1: ddp).
  static OptimizerShards viewing(Optimizer& optimizer, std::vector<ParameterGroup>& groups, int rank, int ranks,
                                 bool write_compute = false);

  /// Adds group `groups().size()` laid out as `layout` (its decay and
  /// parameters): `values` are this rank's shard.numel fp32 master values
  /// of it (kept, not copied). The gradient accumulator and the state start
  /// at zero.
  void add_group(const Shard& shard, const Shard& owned, const ParameterGroup& layout, torch::Tensor values);

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

  /// The optimizer's step with `args` on the owned elements of every group,
  /// in place in `values`. Collective over `shard_comm` (the ranks that
  /// split the groups) when a whole-matrix parameter spans shards; unused
  /// when shard_ranks is 1. `replica_comm`: the ranks that hold the same
  /// shards (ddp: every rank; hybrid sharding: the replica group), or null.
  /// With more than one replica the whole-matrix transforms are divided
  /// among them: the k-th run this rank holds any of is transformed by
  /// replica k mod replicas only and broadcast from it (collective over
  /// `replica_comm`; each replica computes the bits every replica would
  /// have, so the result is unchanged), at the cost of every run's result
  /// held at once until the broadcasts end (4 bytes per whole-matrix
  /// element in fp32). The gradient accumulators keep their sums until
  /// zero_gradients().
  void update(const UpdateArgs& args, Comm* shard_comm, Comm* replica_comm = nullptr);

  /// The element-wise part of update() alone, on this rank's owned elements
  /// among [from, to) of group `group` (group offsets); whole-matrix
  /// parameters there are left alone. Element-wise optimizers give the same
  /// bits however the elements are cut (trainer/Optimizer.h), so updating a
  /// group piece by piece equals updating it at once. Communicates nothing.
  void update_elements(const UpdateArgs& args, size_t group, int64_t from, int64_t to);
  /// Whether any parameter takes the whole-matrix path.
  bool has_whole_matrix() const;

  void zero_gradients();

  /// The Strategy methods of the same names, over the owned elements.
  std::vector<FlatSlice> gradient_slices() const;
  std::vector<FlatSlice> parameter_slices() const;
  std::vector<StateSlice> state_slices();

  /// Bytes of the gradient accumulators, and of the optimizer's state.
  int64_t gradient_bytes() const;
  int64_t state_bytes() const;

 private:
  Optimizer* optimizer_ = nullptr;
  int shard_ranks_ = 1;
  std::vector<OptimizerShard> groups_;
};

/// Collective, for the same strategies: every rank's updated shard into
/// every rank's full parameters (and their compute copies).
void all_gather_parameters(const OptimizerShards& optimizer, std::vector<ParameterGroup>& groups, Comm& comm);

/// The parameters of a flat layout as optimizers see them, per group.
std::vector<ParameterInfo> parameter_infos(const ParameterGroup& group, size_t group_index);

}  // namespace trainer
