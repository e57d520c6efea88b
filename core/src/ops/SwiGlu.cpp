// swiglu: the autograd function around the CUDA kernels of SwiGlu.cu, and
// the composite CPU path (which autograd differentiates).
#include "trainer/ops/SwiGlu.h"

#include <torch/autograd.h>

#include "Dispatch.h"

namespace trainer::ops {

namespace {

#ifdef TRAINER_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SwiGluFunction : torch::autograd::Function<SwiGluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate_up_in) {
    const torch::Tensor gate_up = gate_up_in.contiguous();
    const int64_t width = gate_up.size(-1) / 2;
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() = width;
    torch::Tensor out = torch::empty(sizes, gate_up.options());
    const torch::Tensor amax = fp8_amax_buffer(gate_up);
    const KernelLaunch launch("swiglu_forward", {gate_up, out});
    kernels::swiglu_forward(kernel_dtype(gate_up), gate_up.data_ptr(), out.data_ptr(), gate_up.numel() / (2 * width),
                            width, amax.defined() ? amax.data_ptr<float>() : nullptr, launch.stream());
    check_launch("swiglu_forward");
    if (amax.defined()) offer_fp8_amax(out, amax);  // the down projection's cast reads `out` next
    ctx->save_for_backward({gate_up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {swiglu_gradient(ctx->get_saved_variables()[0], grads[0])};
  }
};
#endif

}  // namespace

#ifdef TRAINER_CUDA_KERNELS
torch::Tensor swiglu_gradient(const torch::Tensor& gate_up_in, const torch::Tensor& d_out_in,
                              const torch::Tensor& value) {
  const torch::Tensor gate_up = gate_up_in.contiguous();
  const torch::Tensor d_out = d_out_in.contiguous();
  const int64_t width = gate_up.size(-1) / 2;
  torch::Tensor d_gate_up = torch::empty_like(gate_up);
  const torch::Tensor amax = fp8_amax_buffer(gate_up);
  if (value.defined()) {
    TORCH_CHECK(value.is_contiguous() && value.scalar_type() == gate_up.scalar_type() &&
                    value.numel() == gate_up.numel() / 2 && value.device() == gate_up.device(),
                "swiglu_gradient: the forward's value wants a contiguous tensor of half gate_up's elements, got ",
                value.sizes(), " ", value.scalar_type());
  }
  const KernelLaunch launch("swiglu_backward", {gate_up, d_out, d_gate_up});
  kernels::swiglu_backward(kernel_dtype(gate_up), gate_up.data_ptr(), d_out.data_ptr(), d_gate_up.data_ptr(),
                           gate_up.numel() / (2 * width), width, amax.defined() ? amax.data_ptr<float>() : nullptr,
                           launch.stream(), value.defined() ? value.data_ptr() : nullptr);
  check_launch("swiglu_backward");
  if (amax.defined()) offer_fp8_amax(d_gate_up, amax);  // the gate/up projection's gradient cast reads it next
  return d_gate_up;
}
#endif

torch::Tensor swiglu_reference(const torch::Tensor& gate_up) {
  const int64_t width = gate_up.size(-1) / 2;
  return torch::silu(gate_up.narrow(-1, 0, width)) * gate_up.narrow(-1, width, width);
}

torch::Tensor swiglu(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) > 0 && gate_up.size(-1) % 2 == 0,
              "swiglu: the last dimension must hold gate and up (an even width of at least 2), got shape ",
              gate_up.sizes());
#ifdef TRAINER_CUDA_KERNELS
  if (use_kernels(gate_up)) return SwiGluFunction::apply(gate_up);
#endif
  return swiglu_reference(gate_up);
}

}  // namespace trainer::ops
