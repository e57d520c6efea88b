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
// and the reduced shard is summed over the groups (ShardGroups).
#include "trainer/FlatParameters.h"
#include "trainer/ShardedAdamW.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

class Zero1Strategy final : public Strategy {
 public:
  explicit Zero1Strategy(const Options& options)
      : reduce_dtype_(options.text("reduce_dtype") == "bf16" ? torch::kBFloat16 : torch::kFloat32),
        shard_group_size_(options.integer("shard_group_size")) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    groups_of_ = ShardGroups(comm, shard_group_size_, "zero1");
    comm_ = &groups_of_.shard();
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/comm_->world_size(), torch::kFloat32,
                                 env.compute_dtype);
    for (ParameterGroup& group : groups_) {
      // The full fp32 gradient buffer autograd adds into (bf16 gradients widened exactly).
      grads_.push_back(torch::zeros_like(group.values));
      bind_gradients(group, grads_.back());
    }
    optimizer_ = ShardedAdamW::viewing(groups_, *comm_);
  }

  void backward(const torch::Tensor& loss, const MicroStep&) override { loss.backward(); }

  double reduce_gradients_and_norm() override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      torch::Tensor& shard = optimizer_.groups()[g].gradient;
      if (reduce_dtype_ == torch::kFloat32) {
        comm_->reduce_scatter_sum(grads_[g], shard);
        groups_of_.sum_over_replicas(shard);
      } else {
        torch::Tensor out = torch::empty_like(shard, reduce_dtype_);
        comm_->reduce_scatter_sum(grads_[g].to(reduce_dtype_), out);
        groups_of_.sum_over_replicas(out);
        shard.copy_(out);
      }
    }
    return optimizer_.gradient_norm(*comm_);
  }

  void apply_update(const UpdateArgs& args) override {
    optimizer_.update(adamw_, args);
    all_gather_parameters(optimizer_, groups_, *comm_);
    discard_gradients();
  }

  // The shard's gradient needs no zeroing: the next reduce-scatter overwrites it.
  void discard_gradients() override {
    for (torch::Tensor& grads : grads_) grads.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    report.gradient_bytes = optimizer_.gradient_bytes();
    report.optimizer_bytes = optimizer_.moment_bytes();
    for (size_t g = 0; g < groups_.size(); ++g) {
      report.parameter_bytes += groups_[g].compute.numel() * groups_[g].compute.element_size();
      report.gradient_bytes += grads_[g].numel() * 4;
      // the fp32 master weights, when parameters compute in bf16
      if (separate_compute(groups_[g])) report.optimizer_bytes += groups_[g].values.numel() * 4;
    }
    return report;
  }

  std::vector<FlatSlice> gradient_slices() const override { return optimizer_.gradient_slices(); }
  std::vector<StateSlice> state_slices() override { return optimizer_.state_slices(); }
  void state_loaded() override { all_gather_parameters(optimizer_, groups_, *comm_); }
  std::vector<FlatSlice> parameter_slices() const override { return optimizer_.parameter_slices(); }

 private:
  torch::Dtype reduce_dtype_;
  int64_t shard_group_size_;
  ShardGroups groups_of_;
  Comm* comm_ = nullptr;  // the shard group
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  std::vector<torch::Tensor> grads_;
  ShardedAdamW optimizer_;
};

constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of the gradient reduce-scatter", -kNoLimit, kNoLimit,
     "fp32|bf16"},
    kShardGroupSizeKey,
};

Component* create(const Options& options, const Context&) { return new Zero1Strategy(options); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Strategy, "zero1", "0.1.0",
                                           "ZeRO stage 1: AdamW state sharded across ranks", TRAINER_TORCH_VERSION,
                                           kKeys, std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
