// AdamW, gradient norm and clipping arithmetic shared by all strategies.
#include "trainer/sharding/AdamW.h"

#include <algorithm>
#include <cmath>

#include <ATen/Parallel.h>
#include <torch/version.h>

#include "ops/Dispatch.h"
#include "trainer/sharding/LowPrecisionState.h"

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

// The kernels' fp32 scalars of one step.
ops::kernels::AdamWScalars kernel_scalars(const AdamWConfig& config, bool decay, double lr, double grad_scale,
                                          double bias_correction1, double bias_correction2) {
  return ops::kernels::AdamWScalars{
      static_cast<float>(grad_scale),
      static_cast<float>(decay && config.weight_decay != 0.0 ? 1.0 - lr * config.weight_decay : 1.0),
      static_cast<float>(1.0 - config.beta1),
      static_cast<float>(config.beta2),
      static_cast<float>(1.0 - config.beta2),
      static_cast<float>(std::sqrt(bias_correction2)),
      static_cast<float>(config.eps),
      static_cast<float>(lr / bias_correction1)};
}
#endif

// Contiguous CPU buffers of one dtype and length.
bool plain_cpu_buffers(const torch::Tensor& params, const torch::Tensor& grads, const AdamWState& state) {
  for (const torch::Tensor* t : {&params, &grads, &state.exp_avg, &state.exp_avg_sq}) {
    if (t->is_cuda() || t->scalar_type() != params.scalar_type() || !t->is_contiguous() ||
        t->numel() != params.numel()) {
      return false;
    }
  }
  return true;
}

// The CPU update, element by element in torch.optim.AdamW's order. ATen's
// vectorised kernels finish each range with a scalar loop that can round
// differently (fused multiply-adds in the vector path), and where a range
// ends depends on a shard's bounds and the thread count; here every element
// gets the same operations wherever it lies, so a sharded strategy updates
// each element exactly as an unsharded one does.
template <typename T>
void adamw_elementwise(torch::Tensor& params, const torch::Tensor& grads, AdamWState& state, const AdamWConfig& config,
                       bool decay, double lr, double grad_scale, double bias_correction1, double bias_correction2) {
  T* p = params.data_ptr<T>();
  const T* g = grads.data_ptr<T>();
  T* m = state.exp_avg.data_ptr<T>();
  T* v = state.exp_avg_sq.data_ptr<T>();
  const T scale = static_cast<T>(grad_scale);
  const T shrink = static_cast<T>(decay && config.weight_decay != 0.0 ? 1.0 - lr * config.weight_decay : 1.0);
  const T weight1 = static_cast<T>(1.0 - config.beta1);
  const T beta2 = static_cast<T>(config.beta2), weight2 = static_cast<T>(1.0 - config.beta2);
  const T root2 = static_cast<T>(std::sqrt(bias_correction2)), eps = static_cast<T>(config.eps);
  const T step = static_cast<T>(-lr / bias_correction1);
  at::parallel_for(0, params.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T gi = g[i] * scale;
      p[i] *= shrink;
      m[i] += weight1 * (gi - m[i]);
      v[i] = v[i] * beta2 + weight2 * gi * gi;
      p[i] += step * (m[i] / (std::sqrt(v[i]) / root2 + eps));
    }
  });
}

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
  if (!params.is_cuda() && params.scalar_type() == torch::kFloat32 && plain_cpu_buffers(params, grads, state)) {
    adamw_elementwise<float>(params, grads, state, config, decay, lr, grad_scale, bias_correction1, bias_correction2);
    return;
  }
  if (!params.is_cuda() && params.scalar_type() == torch::kFloat64 && plain_cpu_buffers(params, grads, state)) {
    adamw_elementwise<double>(params, grads, state, config, decay, lr, grad_scale, bias_correction1, bias_correction2);
    return;
  }
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
    const ops::kernels::AdamWScalars scalars =
        kernel_scalars(config, decay, lr, grad_scale, bias_correction1, bias_correction2);
    const ops::KernelLaunch launch("adamw_step", {params, grads, state.exp_avg, state.exp_avg_sq, compute});
    ops::kernels::adamw_step(params.data_ptr<float>(), grads.data_ptr<float>(), state.exp_avg.data_ptr<float>(),
                             state.exp_avg_sq.data_ptr<float>(), compute.defined() ? compute.data_ptr() : nullptr,
                             params.numel(), scalars, launch.stream());
    ops::check_launch("adamw_step");
    return;
  }
#endif
  update_with_libtorch(params, grads, state, config, decay, lr, step, grad_scale, bias_correction1, bias_correction2);
  if (compute.defined()) compute.view(params.sizes()).copy_(params);
}

namespace {
// The sum of squares of `flat` as an fp64 scalar on its device: fp32
// chunks' norms squared in fp64, the tail in fp64. Nothing waits for it.
torch::Tensor squared_norm_on_device(const torch::Tensor& flat) {
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
  return squares;
}
}  // namespace

bool adamw_update_bf16_state(torch::Tensor params, const torch::Tensor& grads, AdamWState& state,
                             const AdamWConfig& config, bool decay, double lr, int64_t step, double grad_scale,
                             const torch::Tensor& compute, uint64_t stream_m, uint64_t stream_v, int64_t first_index) {
#ifdef TRAINER_CUDA_KERNELS
  const auto fits = [&](const torch::Tensor& t, torch::Dtype dtype) {
    return t.defined() && t.is_cuda() && t.device() == params.device() && t.scalar_type() == dtype &&
           t.is_contiguous() && t.numel() == params.numel();
  };
  if (!fits(params, torch::kFloat32) || !fits(grads, torch::kFloat32) || !fits(state.exp_avg, torch::kBFloat16) ||
      !fits(state.exp_avg_sq, torch::kBFloat16) || (compute.defined() && !fits(compute, torch::kBFloat16))) {
    return false;
  }
  torch::NoGradGuard no_grad;
  const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
  const ops::kernels::AdamWScalars scalars =
      kernel_scalars(config, decay, lr, grad_scale, bias_correction1, bias_correction2);
  const ops::KernelLaunch launch("adamw_step_bf16_state", {params, grads, state.exp_avg, state.exp_avg_sq, compute});
  ops::kernels::adamw_step_bf16_state(params.data_ptr<float>(), grads.data_ptr<float>(), state.exp_avg.data_ptr(),
                                      state.exp_avg_sq.data_ptr(), compute.defined() ? compute.data_ptr() : nullptr,
                                      params.numel(), scalars, stream_m, stream_v, first_index, launch.stream());
  ops::check_launch("adamw_step_bf16_state");
  return true;
#else
  (void)params, (void)grads, (void)state, (void)config, (void)decay, (void)lr, (void)step, (void)grad_scale;
  (void)compute, (void)stream_m, (void)stream_v, (void)first_index;
  return false;
#endif
}

void adamw_update_slice(UpdateSlice& slice, const AdamWConfig& config, const UpdateArgs& args) {
  if (slice.state.at(0).scalar_type() == torch::kBFloat16) {
    AdamWState state{slice.state.at(0), slice.state.at(1)};
    if (adamw_update_bf16_state(slice.values, slice.gradient, state, config, slice.decay, args.lr, args.adam_step,
                                args.grad_scale, slice.compute, state_stream(args.adam_step, 0, slice.group),
                                state_stream(args.adam_step, 1, slice.group), slice.offset)) {
      return;
    }
  }
  with_wide_state(slice, args.adam_step, [&](UpdateSlice& part, int64_t, int64_t) {
    AdamWState state{part.state.at(0), part.state.at(1)};
    adamw_update(part.values, part.gradient, state, config, part.decay, args.lr, args.adam_step, args.grad_scale,
                 part.compute);
  });
}

double squared_norm(const torch::Tensor& flat) { return squared_norm_on_device(flat).item<double>(); }

double total_norm(const std::vector<torch::Tensor>& flats) {
  if (flats.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  torch::Tensor total = torch::zeros({}, flats.front().options().dtype(torch::kFloat64));
  for (const torch::Tensor& flat : flats) total += squared_norm_on_device(flat);
  return std::sqrt(total.item<double>());
}

double sharded_norm(const std::vector<torch::Tensor>& owned, Comm& comm) {
  if (owned.empty() && comm.world_size() > 1) {
    throw std::logic_error(
        "sharded_norm: collective, and this rank owns no tensors to take the device from: pass its device "
        "(sharded_norm(owned, comm, device))");
  }
  return sharded_norm(owned, comm, owned.empty() ? torch::Device(torch::kCPU) : owned.front().device());
}

double sharded_norm(const std::vector<torch::Tensor>& owned, Comm& comm, torch::Device device) {
  torch::NoGradGuard no_grad;
  // The parts' sums added in order in fp64 on the device (the same
  // additions, and so the same bits, as on the host), then one read: one
  // host sync a step instead of one per part and a copy back.
  torch::Tensor total = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  for (const torch::Tensor& part : owned) total += squared_norm_on_device(part).to(device);
  if (comm.world_size() > 1) {
    total = total.reshape({1});
    comm.all_reduce_sum(total);
  }
  return std::sqrt(total.item<double>());
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace trainer
