// AdamW, gradient norm and clipping arithmetic shared by all strategies.
#include "trainer/AdamW.h"

#include <algorithm>
#include <cmath>

#include <torch/version.h>

#include "ops/Dispatch.h"

namespace trainer {

AdamWState adamw_init(const torch::Tensor& like) {
  return AdamWState{torch::zeros_like(like), torch::zeros_like(like)};
}

namespace {

#ifdef TRAINER_CUDA_KERNELS
// The project's kernel: fp32 buffers on CUDA, contiguous, and a bf16 compute copy or none.
bool own_kernel(const torch::Tensor& params, const torch::Tensor& grads, const AdamWState& state,
                const torch::Tensor& compute) {
  const auto fp32_like = [&](const torch::Tensor& t) {
    return t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() == params.numel();
  };
  return fp32_like(params) && fp32_like(grads) && fp32_like(state.exp_avg) && fp32_like(state.exp_avg_sq) &&
         (!compute.defined() || (compute.is_cuda() && compute.scalar_type() == torch::kBFloat16 &&
                                 compute.is_contiguous() && compute.numel() == params.numel()));
}
#endif

// LibTorch's fused kernel (fp32 on CUDA, 2.x) or torch.optim.AdamW's single-tensor sequence.
void update_with_libtorch(torch::Tensor& params, const torch::Tensor& grads, AdamWState& state,
                          const AdamWConfig& config, bool decay, double lr, int64_t step, double grad_scale,
                          double bias_correction1, double bias_correction2) {
  (void)step;  // the fused kernel's step count; the sequence below uses the bias corrections
#if TORCH_VERSION_MAJOR >= 2
  if (params.is_cuda() && params.scalar_type() == torch::kFloat32) {
    // The kernel divides gradients by its grad_scale (made for loss scaling).
    c10::optional<torch::Tensor> unscale;
    if (grad_scale != 1.0) unscale = torch::full({}, 1.0 / grad_scale, params.options());
    const torch::Tensor step_count = torch::full({}, static_cast<double>(step), params.options());
    at::_fused_adamw_({params}, {grads}, {state.exp_avg}, {state.exp_avg_sq}, {}, {step_count}, lr, config.beta1,
                      config.beta2, decay ? config.weight_decay : 0.0, config.eps, /*amsgrad=*/false,
                      /*maximize=*/false, unscale, /*found_inf=*/c10::nullopt);
    return;
  }
#endif
  if (grad_scale != 1.0) grads.mul_(grad_scale);
  // The order of operations is torch.optim.AdamW's single-tensor path, so
  // that a PyTorch reference run differs only by rounding of fused kernels.
  if (decay && config.weight_decay != 0.0) params.mul_(1.0 - lr * config.weight_decay);
  state.exp_avg.lerp_(grads, 1.0 - config.beta1);
  state.exp_avg_sq.mul_(config.beta2).addcmul_(grads, grads, 1.0 - config.beta2);
  const double step_size = lr / bias_correction1;
  const torch::Tensor denom = (state.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(config.eps);
  params.addcdiv_(state.exp_avg, denom, -step_size);
}

}  // namespace

void adamw_update(torch::Tensor params, const torch::Tensor& grads, AdamWState& state, const AdamWConfig& config,
                  bool decay, double lr, int64_t step, double grad_scale, const torch::Tensor& compute) {
  torch::NoGradGuard no_grad;
  const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
#ifdef TRAINER_CUDA_KERNELS
  if (own_kernel(params, grads, state, compute)) {
    const ops::kernels::AdamWScalars scalars{
        static_cast<float>(grad_scale),
        static_cast<float>(decay && config.weight_decay != 0.0 ? 1.0 - lr * config.weight_decay : 1.0),
        static_cast<float>(1.0 - config.beta1),
        static_cast<float>(config.beta2),
        static_cast<float>(1.0 - config.beta2),
        static_cast<float>(std::sqrt(bias_correction2)),
        static_cast<float>(config.eps),
        static_cast<float>(lr / bias_correction1)};
    ops::kernels::adamw_step(params.data_ptr<float>(), grads.data_ptr<float>(), state.exp_avg.data_ptr<float>(),
                             state.exp_avg_sq.data_ptr<float>(), compute.defined() ? compute.data_ptr() : nullptr,
                             params.numel(), scalars, ops::current_stream());
    ops::check_launch("adamw_step");
    return;
  }
#endif
  update_with_libtorch(params, grads, state, config, decay, lr, step, grad_scale, bias_correction1, bias_correction2);
  if (compute.defined()) compute.view(params.sizes()).copy_(params);
}

double squared_norm(const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  constexpr int64_t kChunk = int64_t(1) << 16;
  const torch::Tensor all = flat.reshape({-1});
  const int64_t whole = all.numel() / kChunk * kChunk;
  torch::Tensor squares = torch::zeros({}, all.options().dtype(torch::kFloat64));
  if (whole > 0) {
    squares +=
        at::linalg_vector_norm(all.narrow(0, 0, whole).view({-1, kChunk}), 2, {1}).to(torch::kFloat64).square().sum();
  }
  if (whole < all.numel()) squares += all.narrow(0, whole, all.numel() - whole).to(torch::kFloat64).square().sum();
  return squares.item<double>();
}

double sharded_norm(const std::vector<torch::Tensor>& owned, Comm& comm) {
  double squares = 0.0;
  for (const torch::Tensor& part : owned) squares += squared_norm(part);
  if (comm.world_size() == 1 || owned.empty()) return std::sqrt(squares);
  torch::Tensor total = torch::tensor({squares}, torch::kFloat64).to(owned.front().device());
  comm.all_reduce_sum(total);
  return std::sqrt(total.item<double>());
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace trainer
