// RMSNorm as Hugging Face's Qwen2/Llama compute it, fused on CUDA.
#pragma once

#include <torch/types.h>

namespace trainer::ops {

/// weight * (x / sqrt(mean(x^2, last dim) + eps)), normalised in at least
/// fp32 and returned in x's dtype. CUDA, bf16 rows up to 4096 wide: the
/// project's kernels (one each way; the weight's gradient added in fp32 into
/// its .grad where a strategy bound an fp32 buffer there); other CUDA
/// tensors: LibTorch's fused kernels (at::rms_norm, LibTorch 2.x). CPU: the
/// composite form of Hugging Face's Qwen2RMSNorm. Differentiable in x and weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

/// The CPU path on any device, for testing the fused one against it.
torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace trainer::ops
