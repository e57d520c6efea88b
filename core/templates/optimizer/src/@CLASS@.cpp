// Optimizer `@NAME@`: sign descent, p <- p (1 - lr wd) - lr sign(g), with
// decoupled weight decay where the model marks it. No state.
//
// An optimizer sees runs of the flat fp32 master values a rank updates
// (UpdateSlice: values, the step's summed gradient, its state tensors) and
// never which strategy or world size cut them: its update must be
// element-wise, so that any cut gives the same bits. One that needs whole
// matrices (e.g. Muon) says so in whole_matrix() and writes prepare(),
// transform() and apply() instead (trainer/Optimizer.h). Per-element state
// tensors, named in state_names(), are saved in checkpoints and resharded
// with the values.
//
// `trainer check-plugin @NAME@` checks it under every strategy against an
// fp64 run of its own update.
#include "trainer/Optimizer.h"

namespace {

using namespace trainer;

class @CLASS@ final : public Optimizer {
 public:
  explicit @CLASS@(const Options& options) : weight_decay_(options.real("weight_decay")) {}

  std::vector<std::string> state_names() const override { return {}; }

  bool update(UpdateSlice& slice, const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    // The clipping coefficient args.grad_scale is positive: it does not change a sign.
    if (slice.decay && weight_decay_ != 0.0) slice.values.mul_(1.0 - args.lr * weight_decay_);
    slice.values.add_(slice.gradient.sign(), -args.lr);
    return false;  // the caller refreshes a bf16 compute copy
  }

 private:
  double weight_decay_;
};

// Each key: name, type, default (TOML), one line of help, and for numbers the allowed range.
constexpr KeySpec kKeys[] = {
    {"weight_decay", ValueType::Float, "0.0", "decoupled weight decay of matrices (not biases or norms)", 0, kNoLimit},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Optimizer, @CLASS@, "@NAME@", "0.1.0", "sign descent with decoupled weight decay", kKeys)
