// The few LibTorch calls whose spelling differs between 1.13 (Debian, CPU)
// and 2.x (the GPU build). Everything version-specific lives here.
#pragma once

#include <cstdint>

#include <torch/types.h>
#include <torch/version.h>

namespace trainer::compat {

/// A CPU generator seeded with `seed`: parameter init happens on the CPU so
/// that it is the same whatever the run's device.
at::Generator cpu_generator(uint64_t seed);

/// Causal scaled-dot-product attention: q [batch, heads, seq, head_dim], k
/// and v [batch, kv_heads, seq, head_dim] with kv_heads dividing heads
/// (grouped-query attention: each k/v head serves heads / kv_heads query
/// heads). 2.x: the fused kernels, which read k/v heads in place (the first
/// CUDA call logs the backend chosen); 1.13 has none and gets the explicit
/// softmax form over repeated k/v heads.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

}  // namespace trainer::compat
