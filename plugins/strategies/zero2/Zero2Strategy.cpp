// Strategy `zero2` (ZeRO stage 2): gradients sharded too.
//
//   state        | per rank
//   parameters   | full (fp32)
//   gradients    | 1/world: an fp32 shard accumulator; the full gradient of
//                | one micro-step exists only during its backward
//   AdamW m, v   | 1/world
//
// Every micro-step's gradient is reduce-scattered and *added* into the
// shard accumulator, from the first micro-step of the window to the last;
// the accumulator is zeroed only after the update (or a discarded step).
#include <cmath>

#include "trainer/FlatParameters.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

struct ShardedGroup {
  Shard shard;
  Shard owned;
  torch::Tensor accumulated;  // this rank's shard of the summed gradient, over the whole window
  AdamWState state;
};

class Zero2Strategy final : public Strategy {
 public:
  explicit Zero2Strategy(const Options& options)
      : reduce_dtype_(options.text("reduce_dtype") == "bf16" ? torch::kBFloat16 : torch::kFloat32) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/comm.world_size(), torch::kFloat32,
                                 env.compute_dtype);
    for (ParameterGroup& group : groups_) {
      ShardedGroup s;
      s.shard = shard_of(group.padded_numel, comm.rank(), comm.world_size());
      s.owned = unpadded(group, s.shard);
      s.accumulated = torch::zeros({s.shard.numel}, group.values.options());
      s.state = adamw_init(group.values.narrow(0, s.owned.offset, s.owned.numel));
      shards_.push_back(std::move(s));
    }
  }


  void backward(const torch::Tensor& loss, const MicroStep&) override {
    // A full fp32 gradient buffer, and its reduced shard, for this micro-step
    // only (bf16 gradients are widened exactly as autograd adds them).
    std::vector<torch::Tensor> full;
    for (ParameterGroup& group : groups_) {
      full.push_back(torch::zeros_like(group.values));
      bind_gradients(group, full.back());
    }
    loss.backward();
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      // Reduced in reduce_dtype (fp32 by default), then added into the fp32 accumulator.
      torch::Tensor reduced = torch::empty_like(shards_[g].accumulated, reduce_dtype_);
      comm_->reduce_scatter_sum(full[g].to(reduce_dtype_), reduced);
      shards_[g].accumulated.add_(reduced);
      for (ParameterSlot& slot : groups_[g].slots) slot.param.mutable_grad() = torch::Tensor();
    }
  }

  double reduce_gradients_and_norm() override {
    std::vector<torch::Tensor> owned;
    for (const ShardedGroup& s : shards_) owned.push_back(s.accumulated.narrow(0, 0, s.owned.numel));
    return sharded_norm(owned, *comm_);
  }

  void apply_update(const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      ShardedGroup& s = shards_[g];
      torch::Tensor grads = s.accumulated.narrow(0, 0, s.owned.numel);
      adamw_update(groups_[g].values.narrow(0, s.owned.offset, s.owned.numel), grads, s.state, adamw_,
                   groups_[g].decay, args.lr, args.adam_step, args.grad_scale);
      comm_->all_gather(groups_[g].values.narrow(0, s.shard.offset, s.shard.numel), groups_[g].values);
      sync_compute(groups_[g]);
    }
    discard_gradients();
  }

  void discard_gradients() override {
    for (ShardedGroup& s : shards_) s.accumulated.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const bool separate = separate_compute(groups_[g]);
      report.parameter_bytes += groups_[g].compute.numel() * groups_[g].compute.element_size();
      report.gradient_bytes += shards_[g].accumulated.numel() * 4;
      report.optimizer_bytes += 2 * shards_[g].owned.numel * 4 + (separate ? groups_[g].values.numel() * 4 : 0);
    }
    return report;
  }

  std::vector<FlatSlice> gradient_slices() const override {
    std::vector<FlatSlice> out;
    for (size_t g = 0; g < shards_.size(); ++g) {
      out.push_back({g, shards_[g].owned.offset, shards_[g].accumulated.narrow(0, 0, shards_[g].owned.numel)});
    }
    return out;
  }

  std::vector<StateSlice> state_slices() override {
    std::vector<StateSlice> slices;
    for (size_t g = 0; g < shards_.size(); ++g) {
      const Shard& owned = shards_[g].owned;
      slices.push_back({g, owned.offset, groups_[g].values.narrow(0, owned.offset, owned.numel),
                        shards_[g].state.exp_avg, shards_[g].state.exp_avg_sq});
    }
    return slices;
  }

  void state_loaded() override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Shard& shard = shards_[g].shard;
      comm_->all_gather(groups_[g].values.narrow(0, shard.offset, shard.numel), groups_[g].values);
      sync_compute(groups_[g]);
    }
  }

  std::vector<FlatSlice> parameter_slices() const override {
    std::vector<FlatSlice> out;
    for (size_t g = 0; g < shards_.size(); ++g) {
      out.push_back({g, shards_[g].owned.offset, groups_[g].values.narrow(0, shards_[g].owned.offset, shards_[g].owned.numel)});
    }
    return out;
  }

 private:
  torch::Dtype reduce_dtype_;
  Comm* comm_ = nullptr;
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  std::vector<ShardedGroup> shards_;
};

constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of each micro-step's reduce-scatter", -kNoLimit, kNoLimit,
     "fp32|bf16"},
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
