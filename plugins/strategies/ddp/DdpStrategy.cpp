// Strategy `ddp`: full fp32 gradients in flat buffers that autograd
// accumulates into across micro-steps, all-reduced as sums at the boundary,
// and full AdamW state on every rank. The reference every ZeRO stage must
// match bit for bit at world size 1.
#include <cmath>

#include "trainer/FlatParameters.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

class DdpStrategy final : public Strategy {
 public:
  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/1);
    for (ParameterGroup& group : groups_) {
      // Gradients live in one flat buffer per group; autograd adds each
      // micro-step's gradient into it in place, so accumulation has no
      // separate code path that could overwrite instead of add.
      grads_.push_back(torch::zeros_like(group.values));
      bind_gradients(group, grads_.back());
      states_.push_back(adamw_init(group.values));
    }
  }

  void begin_step(const StepPlan&) override {}

  void backward(const torch::Tensor& loss, const MicroStep&) override { loss.backward(); }

  double reduce_gradients() override {
    double squares = 0.0;
    for (torch::Tensor& grads : grads_) {
      comm_->all_reduce_sum(grads);
      squares += squared_norm(grads);
    }
    return std::sqrt(squares);
  }

  void apply_update(const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (args.grad_scale != 1.0) grads_[g].mul_(args.grad_scale);
      adamw_update(groups_[g].values, grads_[g], states_[g], adamw_, groups_[g].decay, args.lr, args.adam_step);
    }
    discard_gradients();
  }

  void discard_gradients() override {
    for (torch::Tensor& grads : grads_) grads.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int64_t bytes = groups_[g].values.numel() * 4;
      report.parameter_bytes += bytes;
      report.gradient_bytes += bytes;
      report.optimizer_bytes += 2 * bytes;
    }
    return report;
  }

 private:
  Comm* comm_ = nullptr;
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  std::vector<torch::Tensor> grads_;
  std::vector<AdamWState> states_;
};

Component* create(const Options&, const Context&) { return new DdpStrategy(); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Strategy, "ddp", "0.1.0",
                                           "data parallel: full gradients all-reduced at the step boundary",
                                           TRAINER_TORCH_VERSION, nullptr, 0, &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
