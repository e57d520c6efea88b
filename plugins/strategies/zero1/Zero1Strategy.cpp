// Strategy `zero1` (ZeRO stage 1): optimizer state sharded.
//
//   state        | per rank
//   parameters   | full (fp32)
//   gradients    | full during accumulation, reduce-scattered at the boundary
//   AdamW m, v   | 1/world of each flat group (the shard this rank updates)
//
// Each rank updates its shard of the flat fp32 parameters with the core's
// AdamW, then the shards are all-gathered back into the full parameters.
// At world size 1 the shard is the whole buffer and the arithmetic is ddp's.
// With shard_group_size = s < world (hybrid sharding) "world" above reads
// s: the reduce-scatter and all-gather run within each group of s ranks,
// and the reduced shard is summed over the groups (ShardGroups). With
// StrategyEnv::exact_gradients (reproducible mode) the core sums the
// gradients: no full gradient is kept and nothing is reduced.
#include <algorithm>

#include "trainer/sharding/ShardedStrategy.h"

namespace {

using namespace trainer;

// The shared half (shards, update, gather, slices, the full gradient
// buffers) is ShardedStrategy's; this file is zero1's gradient path: the
// full fp32 gradients reduce-scattered to the shards at the boundary.
class Zero1Strategy final : public ShardedStrategy {
 public:
  Zero1Strategy(const Options& options, const Context& context) : ShardedStrategy(options, "zero1", context) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    join(comm, env);
    keep_full_parameters(model, env);
    keep_full_gradients();
  }

  double reduce_gradients_and_norm() override {
    if (exact_gradients()) return ShardedStrategy::reduce_gradients_and_norm();  // nothing to reduce
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor>& grads = full_gradients();
    for (size_t g = 0; g < grads.size(); ++g) {
      torch::Tensor& shard = optimizer().groups()[g].gradient;
      if (reduce_dtype() == torch::kFloat32) {
        shard_comm().reduce_scatter_sum(grads[g], shard);
        shard_groups().sum_over_replicas(shard);
      } else {
        torch::Tensor out = torch::empty_like(shard, reduce_dtype());
        const torch::Tensor narrow = grads[g].to(reduce_dtype());
        peak_transient_bytes_ = std::max(peak_transient_bytes_, (narrow.numel() + out.numel()) * out.element_size());
        shard_comm().reduce_scatter_sum(narrow, out);
        shard_groups().sum_over_replicas(out);
        shard.copy_(out);
      }
    }
    return ShardedStrategy::reduce_gradients_and_norm();
  }

  // backward() is ShardedStrategy's: autograd's adds into the full
  // gradients kept from setup; the reduction waits for the boundary.
  bool replayable_micro_step(const MicroStep&) const override { return !exact_gradients(); }

  MemoryReport memory() const override {
    MemoryReport report = ShardedStrategy::memory();
    report.peak_transient_bytes = peak_transient_bytes_;  // fp32 reductions run in place: none
    return report;
  }

 private:
  int64_t peak_transient_bytes_ = 0;  // a bf16 reduction's copies of one group's gradient and shard
};

constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of the gradient reduce-scatter", -kNoLimit, kNoLimit,
     "fp32|bf16"},
    kShardGroupSizeKey,
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Strategy, Zero1Strategy, "zero1", "0.1.0", "ZeRO stage 1: AdamW state sharded across ranks",
                      kKeys)
