// Optimizer `adamw`: torch.optim.AdamW's arithmetic on every parameter
// (trainer/sharding/AdamW.h: LibTorch's fused kernel or the project's on
// CUDA, an element-wise loop on the CPU), decoupled weight decay on the
// parameters the model marks for it. The default optimizer: its state and
// its bits are those of every run before optimizers were plugins, and a
// checkpoint of format 3 loads as its state.
#include "trainer/Optimizer.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/LowPrecisionState.h"

namespace {

using namespace trainer;

class AdamWOptimizer final : public Optimizer {
 public:
  explicit AdamWOptimizer(const Options& options)
      : config_{options.real("beta1"), options.real("beta2"), options.real("eps"), options.real("weight_decay")},
        bf16_state_(options.text("state_dtype") == "bf16") {}

  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  torch::Dtype state_dtype() const override { return bf16_state_ ? torch::kBFloat16 : torch::kFloat32; }

  bool update(UpdateSlice& slice, const UpdateArgs& args) override {
    if (bf16_state_) {
      // On CUDA one pass, with the bits of the widened path below
      // (OpsGpu.Bf16StateAdamWGivesTheBitsOfTheWidenedPath).
      AdamWState state{slice.state.at(0), slice.state.at(1)};
      if (adamw_update_bf16_state(slice.values, slice.gradient, state, config_, slice.decay, args.lr, args.adam_step,
                                  args.grad_scale, slice.compute, state_stream(args.adam_step, 0, slice.group),
                                  state_stream(args.adam_step, 1, slice.group), slice.offset)) {
        return true;
      }
    }
    with_wide_state(slice, args.adam_step, [&](UpdateSlice& part, int64_t, int64_t) {
      AdamWState state{part.state.at(0), part.state.at(1)};
      adamw_update(part.values, part.gradient, state, config_, part.decay, args.lr, args.adam_step, args.grad_scale,
                   part.compute);
    });
    return true;  // adamw_update writes the compute copy when one is given
  }

 private:
  AdamWConfig config_;
  bool bf16_state_;
};

constexpr KeySpec kKeys[] = {
    {"beta1", ValueType::Float, "0.9", "first-moment decay", 0, 0.999999999},
    {"beta2", ValueType::Float, "0.999", "second-moment decay", 0, 0.999999999},
    {"eps", ValueType::Float, "1e-8", "added to the denominator", 0, kNoLimit},
    {"weight_decay", ValueType::Float, "0.0", "decoupled weight decay of matrices (not biases or norms)", 0, kNoLimit},
    {"state_dtype", ValueType::String, "'fp32'",
     "dtype of the moments: fp32, or bf16 (stochastic rounding seeded per element and step: runs repeat bit for bit)",
     -kNoLimit, kNoLimit, "fp32|bf16"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Optimizer, AdamWOptimizer, "adamw", "0.1.0",
                      "AdamW (torch.optim.AdamW's arithmetic), decoupled weight decay", kKeys)
