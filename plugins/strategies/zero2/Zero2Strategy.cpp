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
// zeroed only after the update (or a discarded step).
//
// With shard_group_size = s < world (hybrid sharding) "world" above reads
// s: buckets are reduced within each group of s ranks every micro-step; in
// the step's last backward, as soon as a bucket's part of the shard is
// final, its sum over the groups starts (fp32, ShardGroups), so it runs
// behind the rest of backward. The parameters are gathered within the group.
#include <algorithm>
#include <memory>

#include "trainer/FlatParameters.h"
#include "trainer/GradientBuckets.h"
#include "trainer/ShardedAdamW.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

class Zero2Strategy final : public Strategy {
 public:
  explicit Zero2Strategy(const Options& options)
      : reduce_dtype_(options.text("reduce_dtype") == "bf16" ? torch::kBFloat16 : torch::kFloat32),
        bucket_numel_(std::max<int64_t>(1, static_cast<int64_t>(options.real("bucket_mb") * 1024 * 1024 / 4))),
        shard_group_size_(options.integer("shard_group_size")) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    groups_of_ = ShardGroups(comm, shard_group_size_, "zero2");
    comm_ = &groups_of_.shard();
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/comm_->world_size(), torch::kFloat32,
                                 env.compute_dtype);
    optimizer_ = ShardedAdamW::viewing(groups_, *comm_);
    gradients_ = std::make_unique<StreamedGradients>(
        groups_, bucket_numel_, [this](const GradientBucket& bucket, const torch::Tensor& buffer) {
          // Reduced in reduce_dtype (fp32 by default), then added into the fp32 accumulator.
          const torch::Tensor sent = reduce_dtype_ == torch::kFloat32 ? buffer : buffer.to(reduce_dtype_);
          auto reduction = std::make_shared<ShardReduction>(
              optimizer_.reduce_to_owners(*comm_, bucket.group, bucket.begin, sent));
          return [this, reduction] {
            const torch::Tensor added = reduction->finish();
            // Hybrid: in the step's last backward this part of the shard is
            // final, so its sum over the replica groups starts at once.
            if (last_micro_ && added.defined()) groups_of_.start_sum_over_replicas(added);
          };
        });
  }

  void backward(const torch::Tensor& loss, const MicroStep& micro) override {
    last_micro_ = micro.is_last;
    gradients_->backward(loss);
  }

  double reduce_gradients_and_norm() override {
    groups_of_.finish_sums_over_replicas();
    return optimizer_.gradient_norm(*comm_);
  }

  void apply_update(const UpdateArgs& args) override {
    optimizer_.update(adamw_, args);
    all_gather_parameters(optimizer_, groups_, *comm_);
    discard_gradients();
  }

  void discard_gradients() override { optimizer_.zero_gradients(); }

  MemoryReport memory() const override {
    MemoryReport report;
    report.gradient_bytes = optimizer_.gradient_bytes();
    report.optimizer_bytes = optimizer_.moment_bytes();
    report.peak_transient_gradient_bytes = gradients_->peak_bytes();
    for (const ParameterGroup& group : groups_) {
      report.parameter_bytes += group.compute.numel() * group.compute.element_size();
      // the fp32 master weights, when parameters compute in bf16
      if (separate_compute(group)) report.optimizer_bytes += group.values.numel() * 4;
    }
    return report;
  }

  std::vector<FlatSlice> gradient_slices() const override { return optimizer_.gradient_slices(); }
  std::vector<StateSlice> state_slices() override { return optimizer_.state_slices(); }
  void state_loaded() override { all_gather_parameters(optimizer_, groups_, *comm_); }
  std::vector<FlatSlice> parameter_slices() const override { return optimizer_.parameter_slices(); }

 private:
  torch::Dtype reduce_dtype_;
  int64_t bucket_numel_;
  int64_t shard_group_size_;
  ShardGroups groups_of_;
  bool last_micro_ = false;
  Comm* comm_ = nullptr;  // the shard group
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  ShardedAdamW optimizer_;
  std::unique_ptr<StreamedGradients> gradients_;
};

constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of each bucket's reduce", -kNoLimit, kNoLimit, "fp32|bf16"},
    {"bucket_mb", ValueType::Float, "25.0", "full-gradient bytes per bucket (whole parameters)", 1e-6, 1e6},
    kShardGroupSizeKey,
};

Component* create(const Options& options, const Context&) { return new Zero2Strategy(options); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Strategy, "zero2", "0.1.0",
                                           "ZeRO stage 2: gradients and AdamW state sharded", TRAINER_TORCH_VERSION,
                                           kKeys, std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
