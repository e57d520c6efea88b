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
#include "trainer/FlatParameters.h"
#include "trainer/ShardedAdamW.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

class Zero2Strategy final : public Strategy {
 public:
  explicit Zero2Strategy(const Options& options)
      : reduce_dtype_(options.text("reduce_dtype") == "bf16" ? torch::kBFloat16 : torch::kFloat32) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/comm.world_size(), torch::kFloat32,
                                 env.compute_dtype);
    optimizer_ = ShardedAdamW::viewing(groups_, comm);
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
      torch::Tensor& accumulated = optimizer_.groups()[g].gradient;
      torch::Tensor reduced = torch::empty_like(accumulated, reduce_dtype_);
      comm_->reduce_scatter_sum(full[g].to(reduce_dtype_), reduced);
      accumulated.add_(reduced);
      for (ParameterSlot& slot : groups_[g].slots) slot.param.mutable_grad() = torch::Tensor();
    }
  }

  double reduce_gradients_and_norm() override { return optimizer_.gradient_norm(*comm_); }

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
  Comm* comm_ = nullptr;
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  ShardedAdamW optimizer_;
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
