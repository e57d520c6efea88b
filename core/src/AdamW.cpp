// AdamW, gradient norm and clipping arithmetic shared by all strategies.
#include "trainer/AdamW.h"

#include <algorithm>
#include <cmath>

namespace trainer {

AdamWState adamw_init(const torch::Tensor& like) {
  return AdamWState{torch::zeros_like(like), torch::zeros_like(like)};
}

void adamw_update(torch::Tensor params, const torch::Tensor& grads, AdamWState& state,
                  const AdamWConfig& config, bool decay, double lr, int64_t step) {
  torch::NoGradGuard no_grad;
  // The order of operations is torch.optim.AdamW's single-tensor path, so
  // that a PyTorch reference run differs only by rounding of fused kernels.
  if (decay && config.weight_decay != 0.0) params.mul_(1.0 - lr * config.weight_decay);
  state.exp_avg.lerp_(grads, 1.0 - config.beta1);
  state.exp_avg_sq.mul_(config.beta2).addcmul_(grads, grads, 1.0 - config.beta2);
  const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  const torch::Tensor denom = (state.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(config.eps);
  params.addcdiv_(state.exp_avg, denom, -step_size);
}

double squared_norm(const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  return flat.to(torch::kFloat64).square().sum().item<double>();
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
