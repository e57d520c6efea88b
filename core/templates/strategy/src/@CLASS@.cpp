// Strategy `@NAME@`: data parallelism in its plainest form. Every rank holds
// the whole model, an fp32 gradient buffer per parameter group that
// autograd accumulates into over the micro-steps, and the whole AdamW
// state. At the step's end each buffer is all-reduced as a sum; every rank
// then applies the same update.
//
// The accumulation contract (`trainer check-plugin @NAME@` checks it): the
// loss handed to backward() is already divided by the step's target tokens
// over all micro-batches and ranks, so the strategy only sums: across
// micro-steps (never overwriting) and across ranks (never averaging).
#include <cmath>

#include "trainer/FlatParameters.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

class @CLASS@ final : public Strategy {
 public:
  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    adamw_ = env.adamw;
    // Flat fp32 master values per group (decay / no decay) on the device; the
    // model's parameters become views of them (or of a bf16 copy).
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/1, torch::kFloat32, env.compute_dtype);
    for (ParameterGroup& group : groups_) {
      grads_.push_back(torch::zeros_like(group.values));
      bind_gradients(group, grads_.back());  // autograd adds each micro-step's gradient here, in fp32
      states_.push_back(adamw_init(group.values));
    }
  }

  void backward(const torch::Tensor& loss, const MicroStep&) override { loss.backward(); }

  double reduce_gradients_and_norm() override {
    torch::NoGradGuard no_grad;
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
      ParameterGroup& group = groups_[g];
      adamw_update(group.values, grads_[g], states_[g], adamw_, group.decay, args.lr, args.adam_step,
                   args.grad_scale, separate_compute(group) ? group.compute : torch::Tensor());
    }
    discard_gradients();
  }

  void discard_gradients() override {
    for (torch::Tensor& grads : grads_) grads.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    for (const ParameterGroup& group : groups_) {
      const int64_t fp32 = group.values.numel() * 4;
      report.parameter_bytes += group.compute.numel() * group.compute.element_size();
      report.gradient_bytes += fp32;
      report.optimizer_bytes += 2 * fp32 + (separate_compute(group) ? fp32 : 0);
    }
    return report;
  }

  // This rank holds everything, so each slice is a whole group (offset 0).
  std::vector<FlatSlice> gradient_slices() const override {
    std::vector<FlatSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) slices.push_back({g, 0, grads_[g]});
    return slices;
  }

  std::vector<FlatSlice> parameter_slices() const override {
    std::vector<FlatSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) slices.push_back({g, 0, groups_[g].values});
    return slices;
  }

  std::vector<StateSlice> state_slices() override {
    std::vector<StateSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) {
      slices.push_back({g, 0, groups_[g].values, states_[g].exp_avg, states_[g].exp_avg_sq});
    }
    return slices;
  }

  void state_loaded() override {
    for (ParameterGroup& group : groups_) sync_compute(group);
  }

 private:
  Comm* comm_ = nullptr;
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  std::vector<torch::Tensor> grads_;
  std::vector<AdamWState> states_;
};

Component* create(const Options&, const Context&) { return new @CLASS@(); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Strategy, "@NAME@", "0.1.0",
                                           "all-reduce of whole fp32 gradients, full AdamW state on every rank",
                                           TRAINER_TORCH_VERSION, nullptr, 0, &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
