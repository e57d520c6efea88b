// The language-model head and its loss in one operation that never holds
// the full logits: the loss *sum* of the accumulation contract.
#pragma once

#include <torch/types.h>

namespace trainer::ops {

/// Sum over target rows of -log softmax(hidden W^T)[label], rows with label
/// kIgnoreIndex left out; `hidden` [rows, dim], `weight` [vocab, dim],
/// `labels` [rows] int64. Returns an fp32 scalar (fp64 for fp64 inputs).
///
/// Logits exist one chunk of rows at a time (at most ~1 GiB of fp32 each),
/// and only for target rows. Because the loss ends the graph, the gradients
/// of hidden and weight are computed in the forward pass, chunk by chunk
/// (softmax - one-hot, two GEMMs), and the backward only scales them by the
/// incoming gradient: no logits are recomputed and none are saved.
/// `chunk_rows` > 0 sets the rows per chunk instead (for tests).
/// `target_rows`, when the caller knows it (a batch's target count: the
/// labels other than kIgnoreIndex), spares the host sync of counting them:
/// when every row is a target, and on CUDA with LibTorch >= 2.6 always.
torch::Tensor linear_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& labels, int64_t chunk_rows = 0, int64_t target_rows = -1);

}  // namespace trainer::ops
