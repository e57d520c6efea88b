// Optimizer `adamw`: torch.optim.AdamW's arithmetic on every parameter
// (trainer/sharding/AdamW.h: LibTorch's fused kernel or the project's on
// CUDA, an element-wise loop on the CPU), decoupled weight decay on the
// parameters the model marks for it. The default optimizer: its state and
// its bits are those of every run before optimizers were plugins, and a
// checkpoint of format 3 loads as its state.
#include "trainer/Optimizer.h"
#include "trainer/sharding/AdamW.h"

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
    // bf16 state on CUDA in one pass, with the bits of the widened path
    // (OpsGpu.Bf16StateAdamWGivesTheBitsOfTheWidenedPath).
    adamw_update_slice(slice, config_, args);
    return true;  // the compute copy is written when one is given
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
