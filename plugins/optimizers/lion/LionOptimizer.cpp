// Optimizer `lion` (Chen et al. 2023, "Symbolic Discovery of Optimization
// Algorithms"): the sign of an interpolation between the momentum and the
// gradient, one state tensor.
//   c = beta1 m + (1 - beta1) g        (g: the gradient times the clipping coefficient)
//   p = p (1 - lr wd) - lr sign(c)     (decay only where the model marks it)
//   m = beta2 m + (1 - beta2) g
// On the CPU (fp32 or fp64) an element-wise loop compiled without
// multiply-add contraction: every element gets the same operations wherever
// a shard cuts the buffer. Elsewhere the same sequence in tensor operations.
#include <ATen/Parallel.h>

#include "trainer/Optimizer.h"

namespace {

using namespace trainer;

template <typename T>
void lion_loop(UpdateSlice& s, double lr, double grad_scale, double beta1, double beta2, double weight_decay) {
  T* p = s.values.data_ptr<T>();
  const T* g = s.gradient.data_ptr<T>();
  T* m = s.state[0].data_ptr<T>();
  const T scale = static_cast<T>(grad_scale);
  const T shrink = static_cast<T>(s.decay && weight_decay != 0.0 ? 1.0 - lr * weight_decay : 1.0);
  const T b1 = static_cast<T>(beta1), w1 = static_cast<T>(1.0 - beta1);
  const T b2 = static_cast<T>(beta2), w2 = static_cast<T>(1.0 - beta2);
  const T step = static_cast<T>(lr);
  at::parallel_for(0, s.values.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T gi = g[i] * scale;
      const T c = b1 * m[i] + w1 * gi;
      const T sign = static_cast<T>((c > T(0)) - (c < T(0)));
      p[i] = p[i] * shrink - step * sign;
      m[i] = b2 * m[i] + w2 * gi;
    }
  });
}

bool plain_cpu(const UpdateSlice& s) {
  for (const torch::Tensor* t : {&s.values, &s.gradient, &s.state[0]}) {
    if (t->is_cuda() || t->scalar_type() != s.values.scalar_type() || !t->is_contiguous()) return false;
  }
  return true;
}

class LionOptimizer final : public Optimizer {
 public:
  explicit LionOptimizer(const Options& options)
      : beta1_(options.real("beta1")), beta2_(options.real("beta2")), weight_decay_(options.real("weight_decay")) {}

  std::vector<std::string> state_names() const override { return {"exp_avg"}; }

  bool update(UpdateSlice& s, const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    if (plain_cpu(s) && s.values.scalar_type() == torch::kFloat32) {
      lion_loop<float>(s, args.lr, args.grad_scale, beta1_, beta2_, weight_decay_);
    } else if (plain_cpu(s) && s.values.scalar_type() == torch::kFloat64) {
      lion_loop<double>(s, args.lr, args.grad_scale, beta1_, beta2_, weight_decay_);
    } else {
      torch::Tensor& m = s.state[0];
      const torch::Tensor g = args.grad_scale != 1.0 ? s.gradient * args.grad_scale : s.gradient;
      const torch::Tensor c = m * beta1_ + g * (1.0 - beta1_);
      if (s.decay && weight_decay_ != 0.0) s.values.mul_(1.0 - args.lr * weight_decay_);
      s.values.add_(c.sign(), -args.lr);
      m.mul_(beta2_).add_(g, 1.0 - beta2_);
    }
    return false;
  }

 private:
  double beta1_, beta2_, weight_decay_;
};

constexpr KeySpec kKeys[] = {
    {"beta1", ValueType::Float, "0.9", "weight of the momentum in the update's sign", 0, 1},
    {"beta2", ValueType::Float, "0.99", "momentum decay", 0, 1},
    {"weight_decay", ValueType::Float, "0.0", "decoupled weight decay of matrices (not biases or norms)", 0, kNoLimit},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Optimizer, LionOptimizer, "lion", "0.1.0", "Lion: the sign of interpolated momentum", kKeys)
