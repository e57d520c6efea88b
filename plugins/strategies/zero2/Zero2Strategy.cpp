// Strategy `zero2` (ZeRO stage 2): gradients sharded too.
//
//   state        | per rank
//   parameters   | full (fp32)
//   gradients    | 1/world: an fp32 shard accumulator; during backward at
//                | most two buckets of the full gradient (and a tied head's)
//   AdamW m, v   | 1/world
//
// In every micro-step's backward each bucket of whole parameters gets an
// fp32 buffer as its parameters' .grad just before its gradients arrive;
// once they are final it is reduced to the ranks whose shards hold it and
// *added* into their accumulators (StreamedGradients). The accumulator is
// zeroed only after the update (or a discarded step). With
// StrategyEnv::exact_gradients (reproducible mode) the core sums the
// gradients: no bucket exists and nothing is reduced.
//
// With shard_group_size = s < world (hybrid sharding) "world" above reads
// s: buckets are reduced within each group of s ranks every micro-step; in
// the step's last backward, as soon as a bucket's part of the shard is
// final, its sum over the groups starts (fp32, ShardGroups), so it runs
// behind the rest of backward. The parameters are gathered within the group.
#include <algorithm>
#include <memory>

#include "trainer/sharding/ShardedStrategy.h"
#include "trainer/sharding/StreamedGradients.h"

namespace {

using namespace trainer;

// The shared half (shards, norm, update, gather, slices) is
// ShardedStrategy's; this file is zero2's gradient path.
class Zero2Strategy final : public ShardedStrategy {
 public:
  Zero2Strategy(const Options& options, const Context& context)
      : ShardedStrategy(options, "zero2", context),
        bucket_numel_(std::max<int64_t>(1, static_cast<int64_t>(options.real("bucket_mb") * 1024 * 1024 / 4))) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    join(comm, env);
    world_ = &comm;
    device_ = env.device;
    keep_full_parameters(model, env);
    if (exact_gradients()) return;  // the core sums the gradients: no buckets
    gradients_ = std::make_unique<StreamedGradients>(
        full_groups(), bucket_numel_, [this](const GradientBucket& bucket, const torch::Tensor& buffer) {
          // Reduced in reduce_dtype (fp32 by default), then added into the fp32 accumulator.
          const torch::Tensor sent = reduce_dtype() == torch::kFloat32 ? buffer : buffer.to(reduce_dtype());
          auto reduction = std::make_shared<ShardReduction>(
              optimizer().reduce_to_owners(shard_comm(), bucket.group, bucket.begin, sent));
          return [this, reduction] {
            const torch::Tensor added = reduction->finish();
            // Hybrid: in the step's last backward this part of the shard is
            // final, so its sum over the replica groups starts at once.
            if (last_micro_ && added.defined()) shard_groups().start_sum_over_replicas(added);
          };
        });
  }

  void backward(const torch::Tensor& loss, const MicroStep& micro) override {
    if (exact_gradients()) return ShardedStrategy::backward(loss, micro);
    last_micro_ = micro.is_last;
    gradients_->backward(loss);
    // Once, over the world (the replica sums follow the same order): buckets
    // then go in the order rank 0's gradients came.
    if (!order_agreed_) gradients_->layout().agree_on_order(*world_, device_);
    order_agreed_ = true;
  }

  MemoryReport memory() const override {
    MemoryReport report = ShardedStrategy::memory();
    if (!gradients_) return report;  // exact gradients: no buckets
    report.peak_transient_gradient_bytes = gradients_->peak_bytes();
    // Its step-local buffers; a bf16 reduce_dtype adds a half-size copy of
    // each bucket while it is sent (not counted).
    report.peak_transient_bytes = gradients_->peak_bytes();
    return report;
  }

 private:
  int64_t bucket_numel_;
  bool last_micro_ = false;
  bool order_agreed_ = false;
  Comm* world_ = nullptr;
  torch::Device device_ = torch::kCPU;
  std::unique_ptr<StreamedGradients> gradients_;
};

constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of each bucket's reduce", -kNoLimit, kNoLimit, "fp32|bf16"},
    {"bucket_mb", ValueType::Float, "25.0", "full-gradient bytes per bucket (whole parameters)", 1e-6, 1e6},
    kShardGroupSizeKey,
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Strategy, Zero2Strategy, "zero2", "0.1.0", "ZeRO stage 2: gradients and AdamW state sharded",
                      kKeys)
