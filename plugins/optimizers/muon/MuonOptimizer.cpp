// Optimizer `muon` (Jordan et al. 2024; torch.optim.Muon's arithmetic with
// adjust_lr_fn = "match_rms_adamw"): the blocks' 2-D weights move along the
// orthogonalised momentum, every other parameter (embedding, head, norms,
// biases) by AdamW with the recipe's AdamW keys. One learning rate: the
// orthogonal update is scaled by 0.2 sqrt(max(rows, cols)) so that its RMS
// matches AdamW's.
//
// For a 2-D weight W with gradient g (times the clipping coefficient):
//   m = lerp(m, g, 1 - momentum)                   (state exp_avg)
//   d = nesterov ? lerp(g, m, momentum) : m
//   O = NewtonSchulz5(d)                            (bf16 on CUDA, fp32 on the CPU, fp64 for fp64)
//   W = W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
// The momentum is per element, so it shards and reshards like AdamW's
// moments; only O needs the whole matrix (Optimizer.h's whole-matrix path).
// A weight's exp_avg_sq stays zero (the state is uniform per flat group).
#include <cmath>
#include <sstream>

#include <ATen/Parallel.h>

#include "trainer/Optimizer.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/LowPrecisionState.h"

namespace {

using namespace trainer;

// torch.lerp's formula (both branches), so that the CPU loop and the tensor path agree.
template <typename T>
T lerp(T self, T end, T weight) {
  return weight < T(0.5) ? self + weight * (end - self) : end - (end - self) * (T(1) - weight);
}

bool plain_cpu(const std::initializer_list<const torch::Tensor*> tensors, torch::Dtype dtype) {
  for (const torch::Tensor* t : tensors) {
    if (t->is_cuda() || t->scalar_type() != dtype || !t->is_contiguous()) return false;
  }
  return true;
}

// The quintic Newton-Schulz iteration's coefficients, and its normalisation's floor.
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315, kEps = 1e-7;

// bf16 on CUDA, fp32 on the CPU, fp64 for fp64 (the kit's reference).
torch::Dtype work_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : (t.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
}

class MuonOptimizer final : public Optimizer {
 public:
  explicit MuonOptimizer(const Options& options)
      : adamw_{options.real("beta1"), options.real("beta2"), options.real("eps"), options.real("weight_decay")},
        momentum_(options.real("momentum")),
        nesterov_(options.boolean("nesterov")),
        steps_(options.integer("ns_steps")),
        bf16_state_(options.text("state_dtype") == "bf16") {
    std::stringstream names(options.text("adamw_params"));
    for (std::string part; std::getline(names, part, ',');) {
      if (!part.empty()) adamw_names_.push_back(part);
    }
  }

  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  torch::Dtype state_dtype() const override { return bf16_state_ ? torch::kBFloat16 : torch::kFloat32; }

  bool whole_matrix(const ParameterInfo& p) const override {
    if (p.shape.size() != 2) return false;
    for (const std::string& part : adamw_names_) {
      if (p.name.find(part) != std::string::npos) return false;
    }
    return true;
  }

  bool update(UpdateSlice& slice, const UpdateArgs& args) override {
    adamw_update_slice(slice, adamw_, args);  // as adamw's update
    return true;
  }

  void prepare(const ParameterInfo&, UpdateSlice& slice, torch::Tensor direction, const UpdateArgs& args) override {
    with_wide_state(slice, args.adam_step, [&](UpdateSlice& s, int64_t begin, int64_t length) {
      prepare_momentum(s, direction.narrow(0, begin, length), args);
    });
  }

  torch::Tensor transform(const ParameterInfo&, const torch::Tensor& matrix, const UpdateArgs&) override {
    torch::NoGradGuard no_grad;
    torch::Tensor x = matrix.reshape({matrix.size(0), -1}).to(work_dtype(matrix));
    const bool tall = x.size(0) > x.size(1);
    if (tall) x = x.t();
    x = x / x.norm().clamp_min(kEps);
    for (int64_t i = 0; i < steps_; ++i) {
      const torch::Tensor gram = x.mm(x.t());
      const torch::Tensor polynomial = torch::addmm(gram, gram, gram, /*beta=*/kB, /*alpha=*/kC);
      x = torch::addmm(x, polynomial, x, /*beta=*/kA, /*alpha=*/1.0);
    }
    if (tall) x = x.t();
    return x.to(matrix.scalar_type()).reshape(matrix.sizes()).contiguous();
  }

  // Stacks of about 2^25 elements (at most 16 matrices): at the 0.5B shape
  // the blocks' 896 x 896 matrices alone fill a quarter of an H200's
  // multiprocessors; sixteen of them fill it. Larger matrices go alone.
  int64_t stack_size(const ParameterInfo& p) const override {
    int64_t k = 1;
    while (k < 16 && 2 * k * std::max<int64_t>(1, p.numel) <= (int64_t(1) << 25)) k *= 2;
    return k;
  }

  // The same iteration with batched products; a matrix's norm and products
  // are its own (fixed stack shape: the same kernels for every stack of a shape).
  torch::Tensor transform_stack(const std::vector<ParameterInfo>&, const torch::Tensor& matrices,
                                const UpdateArgs&) override {
    torch::NoGradGuard no_grad;
    const int64_t count = matrices.size(0);
    torch::Tensor x = matrices.reshape({count, matrices.size(1), -1}).to(work_dtype(matrices));
    const bool tall = x.size(1) > x.size(2);
    if (tall) x = x.transpose(1, 2);
    x = x / at::linalg_vector_norm(x, 2, {1, 2}, /*keepdim=*/true).clamp_min(kEps);
    for (int64_t i = 0; i < steps_; ++i) {
      const torch::Tensor gram = x.bmm(x.transpose(1, 2));
      const torch::Tensor polynomial = torch::baddbmm(gram, gram, gram, /*beta=*/kB, /*alpha=*/kC);
      x = torch::baddbmm(x, polynomial, x, /*beta=*/kA, /*alpha=*/1.0);
    }
    if (tall) x = x.transpose(1, 2);
    return x.to(matrices.scalar_type()).reshape(matrices.sizes()).contiguous();
  }

  void apply(const ParameterInfo& p, UpdateSlice& s, const torch::Tensor& direction, const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    const double rows = static_cast<double>(p.shape.at(0)), cols = static_cast<double>(p.numel) / rows;
    const double adjusted = args.lr * 0.2 * std::sqrt(std::max(rows, cols));
    const double shrink = s.decay && adamw_.weight_decay != 0.0 ? 1.0 - args.lr * adamw_.weight_decay : 1.0;
    const auto dtype = s.values.scalar_type();
    if (plain_cpu({&s.values, &direction}, dtype) && dtype == torch::kFloat32) {
      apply_loop<float>(s.values, direction, shrink, adjusted);
    } else if (plain_cpu({&s.values, &direction}, dtype) && dtype == torch::kFloat64) {
      apply_loop<double>(s.values, direction, shrink, adjusted);
    } else {
      if (shrink != 1.0) s.values.mul_(shrink);
      s.values.add_(direction, -adjusted);
    }
  }

 private:
  void prepare_momentum(UpdateSlice& s, torch::Tensor direction, const UpdateArgs& args) const {
    torch::NoGradGuard no_grad;
    torch::Tensor& m = s.state.at(0);
    const auto dtype = s.values.scalar_type();
    if (plain_cpu({&s.gradient, &m, &direction}, dtype) && dtype == torch::kFloat32) {
      prepare_loop<float>(s.gradient, m, direction, args.grad_scale);
    } else if (plain_cpu({&s.gradient, &m, &direction}, dtype) && dtype == torch::kFloat64) {
      prepare_loop<double>(s.gradient, m, direction, args.grad_scale);
    } else {
      const torch::Tensor g = args.grad_scale != 1.0 ? s.gradient * args.grad_scale : s.gradient;
      m.lerp_(g, 1.0 - momentum_);
      direction.copy_(nesterov_ ? g.lerp(m, momentum_) : m);
    }
  }

  template <typename T>
  void prepare_loop(const torch::Tensor& gradient, torch::Tensor& momentum, torch::Tensor& direction,
                    double grad_scale) const {
    const T* g = gradient.data_ptr<T>();
    T* m = momentum.data_ptr<T>();
    T* d = direction.data_ptr<T>();
    const T scale = static_cast<T>(grad_scale), mu = static_cast<T>(momentum_),
            weight = static_cast<T>(1.0 - momentum_);
    const bool nesterov = nesterov_;
    at::parallel_for(0, gradient.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T gi = g[i] * scale;
        m[i] = lerp(m[i], gi, weight);
        d[i] = nesterov ? lerp(gi, m[i], mu) : m[i];
      }
    });
  }

  template <typename T>
  static void apply_loop(torch::Tensor& values, const torch::Tensor& direction, double shrink, double adjusted) {
    T* p = values.data_ptr<T>();
    const T* d = direction.data_ptr<T>();
    const T keep = static_cast<T>(shrink), step = static_cast<T>(-adjusted);
    at::parallel_for(0, values.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = p[i] * keep + step * d[i];
    });
  }

  AdamWConfig adamw_;
  double momentum_;
  bool nesterov_;
  int64_t steps_;
  bool bf16_state_;
  std::vector<std::string> adamw_names_;
};

constexpr KeySpec kKeys[] = {
    {"momentum", ValueType::Float, "0.95", "momentum of the 2-D weights' updates", 0, 0.999999999},
    {"nesterov", ValueType::Bool, "true", "Nesterov momentum"},
    {"ns_steps", ValueType::Int, "5", "Newton-Schulz iterations (quintic, coefficients 3.4445, -4.7750, 2.0315)", 1,
     100},
    {"adamw_params", ValueType::String, "'embed_tokens,lm_head'",
     "comma-separated parts of the names of 2-D parameters left to AdamW (the embedding and the head)"},
    {"beta1", ValueType::Float, "0.9", "AdamW's first-moment decay (embedding, head, norms, biases)", 0, 0.999999999},
    {"beta2", ValueType::Float, "0.999", "AdamW's second-moment decay", 0, 0.999999999},
    {"eps", ValueType::Float, "1e-8", "AdamW's denominator term", 0, kNoLimit},
    {"weight_decay", ValueType::Float, "0.0", "decoupled weight decay (both halves; not biases or norms)", 0, kNoLimit},
    {"state_dtype", ValueType::String, "'fp32'",
     "dtype of the momentum and moments: fp32, or bf16 (stochastic rounding seeded per element and step)", -kNoLimit,
     kNoLimit, "fp32|bf16"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Optimizer, MuonOptimizer, "muon", "0.1.0",
                      "Muon for the blocks' 2-D weights (Newton-Schulz orthogonalised momentum), AdamW for the rest",
                      kKeys)
