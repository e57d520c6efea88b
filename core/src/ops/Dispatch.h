// When an op runs one of the project's CUDA kernels, and how it calls one.
#pragma once

#include <torch/types.h>

#ifdef TRAINER_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "Kernels.h"
#endif

#include "trainer/Errors.h"

namespace trainer::ops {

/// True when `t` is on a CUDA device of a build with the kernels, in a dtype they cover.
inline bool use_kernels(const torch::Tensor& t) {
#ifdef TRAINER_CUDA_KERNELS
  const auto dtype = t.scalar_type();
  return t.is_cuda() && (dtype == torch::kFloat32 || dtype == torch::kFloat64 || dtype == torch::kBFloat16);
#else
  (void)t;
  return false;
#endif
}

#ifdef TRAINER_CUDA_KERNELS
inline kernels::Dtype kernel_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat64: return kernels::Dtype::Float64;
    case torch::kBFloat16: return kernels::Dtype::BFloat16;
    default: return kernels::Dtype::Float32;
  }
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

/// Throws naming the kernel when its launch failed.
inline void check_launch(const char* kernel) {
  if (const char* error = kernels::last_error()) {
    throw TrainingError(std::string("CUDA kernel ") + kernel + " failed: " + error);
  }
}
#endif

/// Whether a weight-gradient GEMM may add straight into the fp32 .grad a
/// strategy bound (gradient-accumulation fusion). Off in reproducible mode:
/// every gradient then reaches autograd's hooks, which sum it exactly.
/// Process-wide; set before training starts.
bool gradient_fusion_enabled();
void set_gradient_fusion(bool enabled);

/// fp64 stays fp64; everything narrower computes in fp32.
inline torch::Dtype accumulate_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

}  // namespace trainer::ops
