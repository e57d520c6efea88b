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
  torch::Tensor grads;   // full gradient buffer, bound as the parameters' .grad
  torch::Tensor reduced; // this rank's shard of the summed gradient
  AdamWState state;      // of the owned elements only
};

class Zero1Strategy final : public Strategy {
 public:
  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/comm.world_size());
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

  void begin_step(const StepPlan&) override {}

  void backward(const torch::Tensor& loss, const MicroStep&) override { loss.backward(); }

  double reduce_gradients() override {
    for (ShardedGroup& s : shards_) comm_->reduce_scatter_sum(s.grads, s.reduced);
    return global_norm();
  }

  void apply_update(const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      ShardedGroup& s = shards_[g];
      torch::Tensor grads = s.reduced.narrow(0, 0, s.owned.numel);
      if (args.grad_scale != 1.0) grads.mul_(args.grad_scale);
      adamw_update(groups_[g].values.narrow(0, s.owned.offset, s.owned.numel), grads, s.state, adamw_,
                   groups_[g].decay, args.lr, args.adam_step);
      comm_->all_gather(groups_[g].values.narrow(0, s.shard.offset, s.shard.numel), groups_[g].values);
    }
    discard_gradients();
  }

  void discard_gradients() override {
    for (ShardedGroup& s : shards_) s.grads.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    for (size_t g = 0; g < groups_.size(); ++g) {
      report.parameter_bytes += groups_[g].values.numel() * 4;
      report.gradient_bytes += (shards_[g].grads.numel() + shards_[g].reduced.numel()) * 4;
      report.optimizer_bytes += 2 * shards_[g].owned.numel * 4;
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

  std::vector<FlatSlice> parameter_slices() const override {
    std::vector<FlatSlice> out;
    for (size_t g = 0; g < shards_.size(); ++g) {
      out.push_back({g, shards_[g].owned.offset, groups_[g].values.narrow(0, shards_[g].owned.offset, shards_[g].owned.numel)});
    }
    return out;
  }

 private:
  // Sum of squares of every rank's owned shard, then across ranks: the norm
  // of the whole gradient, padding excluded.
  double global_norm() {
    double squares = 0.0;
    for (const ShardedGroup& s : shards_) squares += squared_norm(s.reduced.narrow(0, 0, s.owned.numel));
    torch::Tensor total = torch::tensor({squares}, torch::kFloat64).to(groups_.front().values.device());
    comm_->all_reduce_sum(total);
    return std::sqrt(total.item<double>());
  }

  Comm* comm_ = nullptr;
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  std::vector<ShardedGroup> shards_;
};

Component* create(const Options&, const Context&) { return new Zero1Strategy(); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Strategy, "zero1", "0.1.0",
                                           "ZeRO stage 1: AdamW state sharded across ranks", TRAINER_TORCH_VERSION,
                                           nullptr, 0, &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
