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

/// The same within documents: `document_ids` [batch, seq] (Batch::document_ids)
/// numbers each position's document, and a position attends to the earlier
/// positions of its own document only. Undefined `document_ids`: plain
/// causal_attention. A dense boolean mask [batch, 1, seq, seq] on every
/// device (SDPA's memory-efficient or math kernel on 2.x).
torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const torch::Tensor& document_ids);

/// The mask document_causal_attention applies: true where query position i
/// may attend to key position j (j <= i, one document), [batch, 1, seq, seq].
torch::Tensor document_causal_mask(const torch::Tensor& document_ids);

}  // namespace trainer::ops
