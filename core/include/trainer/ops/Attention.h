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

/// Where a packed batch's documents lie (Batch::document_ids,
/// document_offsets and longest_document). `offsets` may be undefined.
struct DocumentLayout {
  torch::Tensor ids;
  torch::Tensor offsets;
  int64_t longest = 0;
};

/// The layout of `document_ids` [batch, seq] (documents numbered within each
/// row, as Batch::document_ids): offsets as int32 on the host. Reads the ids
/// on the host (a copy and a wait when they lie on a GPU).
DocumentLayout document_layout(const torch::Tensor& document_ids);

/// The same within documents: a position attends to the earlier positions
/// of its own document only. Undefined `documents.ids`: plain
/// causal_attention. On CUDA in bf16 or fp16 with offsets (and head_dim a
/// multiple of 8, at most 256): the variable-length flash kernel over the
/// rows laid end to end, whose work is each document's own square. Else a
/// dense boolean mask [batch, 1, seq, seq] (SDPA's memory-efficient or math
/// kernel on 2.x, the explicit softmax form on 1.13).
torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const DocumentLayout& documents);
/// The same for document_ids alone (the masked path).
torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const torch::Tensor& document_ids);

/// The mask document_causal_attention applies: true where query position i
/// may attend to key position j (j <= i, one document), [batch, 1, seq, seq].
torch::Tensor document_causal_mask(const torch::Tensor& document_ids);

}  // namespace trainer::ops
