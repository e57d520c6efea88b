// The SwiGLU activation of a fused gate/up projection.
#pragma once

#include <torch/types.h>

namespace trainer::ops {

/// silu(gate) * up for `gate_up` = [..., 2 * width] holding gate then up;
/// returns [..., width]. Saves only its input for backward. CUDA: one kernel
/// each way; CPU: composite.
torch::Tensor swiglu(const torch::Tensor& gate_up);

/// The CPU path on any device, for testing the CUDA kernel against it.
torch::Tensor swiglu_reference(const torch::Tensor& gate_up);

}  // namespace trainer::ops
