// Causal attention with grouped key/value heads, as Qwen2/Llama compute it.
#pragma once

#include <torch/types.h>

namespace trainer::ops {

/// Causal scaled-dot-product attention: q [batch, heads, seq, head_dim], k
/// and v [batch, kv_heads, seq, head_dim] with kv_heads dividing heads
/// (grouped-query attention: each k/v head serves heads / kv_heads query
/// heads). 2.x: the fused kernels, which read k/v heads in place (the first
/// CUDA call logs the backend chosen); 1.13 has none and gets the explicit
/// softmax form over repeated k/v heads.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

}  // namespace trainer::ops
