// RMSNorm: the project's kernels (RmsNorm.cu) for bf16 on CUDA, LibTorch's
// fused kernels for other CUDA dtypes, Hugging Face's composite on the CPU.
#include "trainer/ops/RmsNorm.h"

#include <torch/autograd.h>
#include <torch/version.h>

#include "Dispatch.h"

namespace trainer::ops {

#ifdef TRAINER_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `t` contiguous and 16-byte aligned (a copy where a view starts off it), as the kernels read it.
torch::Tensor aligned_contiguous(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps) {
    RmsNormForward f = rms_norm_forward(x, weight, eps);
    ctx->save_for_backward({x});
    ctx->saved_data["weight"] = weight;  // the parameter itself, for its .grad
    ctx->saved_data["rstd"] = f.rstd;
    return f.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const RmsNormGrads g = rms_norm_gradients(grads[0], ctx->get_saved_variables()[0],
                                              ctx->saved_data["weight"].toTensor(), ctx->saved_data["rstd"].toTensor());
    return {g.dx, g.dweight, torch::Tensor()};
  }
};

}  // namespace

bool rms_norm_kernels_apply(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.is_cuda() && x.scalar_type() == torch::kBFloat16 && weight.scalar_type() == torch::kBFloat16 &&
         x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.device() == x.device() &&
         kernels::rms_norm_fits(x.size(-1));
}

RmsNormForward rms_norm_forward(const torch::Tensor& x_in, const torch::Tensor& weight_in, double eps) {
  const torch::Tensor x = aligned_contiguous(x_in), weight = aligned_contiguous(weight_in);
  const int64_t width = x.size(-1), rows = x.numel() / width;
  RmsNormForward f{torch::empty_like(x), torch::empty({rows}, x.options().dtype(torch::kFloat32))};
  const torch::Tensor amax = fp8_amax_buffer(x);
  const KernelLaunch launch("rms_norm_forward", {x, weight, f.y, f.rstd});
  TORCH_CHECK(kernels::rms_norm_forward(x.data_ptr(), weight.data_ptr(), rows, width, static_cast<float>(eps),
                                        f.y.data_ptr(), f.rstd.data_ptr<float>(),
                                        amax.defined() ? amax.data_ptr<float>() : nullptr, launch.stream()),
              "rms_norm_forward: the kernel refused rows of ", width);
  check_launch("rms_norm_forward");
  if (amax.defined()) offer_fp8_amax(f.y, amax);  // the next linear layer's cast reads y next
  return f;
}

RmsNormGrads rms_norm_gradients(const torch::Tensor& dy_in, const torch::Tensor& x_in, const torch::Tensor& weight,
                                const torch::Tensor& rstd) {
  const torch::Tensor x = aligned_contiguous(x_in), gamma = aligned_contiguous(weight);
  const torch::Tensor dy = aligned_contiguous(dy_in.to(x.scalar_type()));
  const int64_t width = x.size(-1), rows = x.numel() / width;
  RmsNormGrads g;
  g.dx = torch::empty_like(x);
  const torch::Tensor into = fused_gradient_target({weight}, dy);
  if (!into.defined()) g.dweight = torch::empty_like(gamma);
  const torch::Tensor scratch =
      torch::empty({kernels::rms_norm_backward_scratch(rows, width)}, x.options().dtype(torch::kFloat32));
  const KernelLaunch launch("rms_norm_backward", {dy, x, gamma, rstd, g.dx, into, g.dweight, scratch});
  TORCH_CHECK(kernels::rms_norm_backward(dy.data_ptr(), x.data_ptr(), gamma.data_ptr(), rstd.data_ptr<float>(), rows,
                                         width, g.dx.data_ptr(), scratch.data_ptr<float>(),
                                         into.defined() ? into.data_ptr<float>() : nullptr,
                                         g.dweight.defined() ? g.dweight.data_ptr() : nullptr, launch.stream()),
              "rms_norm_backward: the kernel refused rows of ", width);
  check_launch("rms_norm_backward");
  return g;
}

#ifdef TRAINER_FP8_LINEAR
torch::Tensor rms_norm_fp8_transposed(const torch::Tensor& x_in, const torch::Tensor& weight, const torch::Tensor& rstd,
                                      const torch::Tensor& inverse_scale) {
  const torch::Tensor x = aligned_contiguous(x_in), gamma = aligned_contiguous(weight);
  const int64_t width = x.size(-1), rows = x.numel() / width;
  torch::Tensor out_t = torch::empty({width, rows}, x.options().dtype(at::kFloat8_e4m3fn));
  const KernelLaunch launch("rms_norm_fp8_transposed", {x, gamma, rstd, inverse_scale, out_t});
  if (!kernels::rms_norm_fp8_transposed(x.data_ptr(), gamma.data_ptr(), rstd.data_ptr<float>(), rows, width,
                                        inverse_scale.data_ptr<float>(), out_t.data_ptr(), launch.stream())) {
    return torch::Tensor();
  }
  check_launch("rms_norm_fp8_transposed");
  return out_t;
}
#endif
#endif

torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // Hugging Face's Qwen2RMSNorm: normalise in at least fp32, scale in the input dtype.
  const torch::Tensor wide = x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
  const torch::Tensor normed = wide * torch::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
#ifdef TRAINER_CUDA_KERNELS
  if (rms_norm_kernels_apply(x, weight)) return RmsNormFunction::apply(x, weight, eps);
#endif
#if TORCH_VERSION_MAJOR >= 2
  // One kernel each way (LibTorch's _fused_rms_norm), statistics in fp32:
  // 4x faster than the composite's five kernels and fp32 temporaries.
  if (x.is_cuda()) return at::rms_norm(x, {x.size(-1)}, weight, eps);
#endif
  return rms_norm_reference(x, weight, eps);
}

}  // namespace trainer::ops
