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
#include <cmath>

#include "trainer/FlatParameters.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

struct ShardedGroup {
  Shard shard;           // this rank's slice of the padded buffer
  Shard owned;           // its real elements (padding excluded)
  torch::Tensor grads;   // full fp32 gradient buffer, bound as the parameters' .grad (bf16 ones too)
  torch::Tensor reduced; // this rank's shard of the summed gradient
  AdamWState state;      // of the owned elements only
};

class Zero1Strategy final : public Strategy {
 public:
  explicit Zero1Strategy(const Options& options)
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
      s.grads = torch::zeros_like(group.values);
      bind_gradients(group, s.grads);
      s.reduced = torch::zeros({s.shard.numel}, group.values.options());
      s.state = adamw_init(group.values.narrow(0, s.owned.offset, s.owned.numel));
      shards_.push_back(std::move(s));
    }
  }


  void backward(const torch::Tensor& loss, const MicroStep&) override {
    loss.backward();  // autograd adds into the fp32 buffers, bf16 gradients widened exactly
  }

  double reduce_gradients_and_norm() override {
    torch::NoGradGuard no_grad;
    for (ShardedGroup& s : shards_) {
      if (reduce_dtype_ == torch::kFloat32) {
        comm_->reduce_scatter_sum(s.grads, s.reduced);
      } else {
        torch::Tensor out = torch::empty_like(s.reduced, reduce_dtype_);
        comm_->reduce_scatter_sum(s.grads.to(reduce_dtype_), out);
        s.reduced.copy_(out);
      }
    }
    std::vector<torch::Tensor> owned;
    for (const ShardedGroup& s : shards_) owned.push_back(s.reduced.narrow(0, 0, s.owned.numel));
    return sharded_norm(owned, *comm_);
  }

  void apply_update(const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      ShardedGroup& s = shards_[g];
      torch::Tensor grads = s.reduced.narrow(0, 0, s.owned.numel);
      adamw_update(groups_[g].values.narrow(0, s.owned.offset, s.owned.numel), grads, s.state, adamw_,
                   groups_[g].decay, args.lr, args.adam_step, args.grad_scale);
      comm_->all_gather(groups_[g].values.narrow(0, s.shard.offset, s.shard.numel), groups_[g].values);
      sync_compute(groups_[g]);
    }
    discard_gradients();
  }

  void discard_gradients() override {
    for (ShardedGroup& s : shards_) s.grads.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const bool separate = separate_compute(groups_[g]);
      report.parameter_bytes += groups_[g].compute.numel() * groups_[g].compute.element_size();
      report.gradient_bytes += (shards_[g].grads.numel() + shards_[g].reduced.numel()) * 4;
      // moments of the shard, and the fp32 master weights when parameters compute in bf16
      report.optimizer_bytes += 2 * shards_[g].owned.numel * 4 + (separate ? groups_[g].values.numel() * 4 : 0);
    }
    return report;
  }

  std::vector<FlatSlice> gradient_slices() const override {
    std::vector<FlatSlice> out;
    for (size_t g = 0; g < shards_.size(); ++g) {
      out.push_back({g, shards_[g].owned.offset, shards_[g].reduced.narrow(0, 0, shards_[g].owned.numel)});
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
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of the gradient reduce-scatter", -kNoLimit, kNoLimit,
     "fp32|bf16"},
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
