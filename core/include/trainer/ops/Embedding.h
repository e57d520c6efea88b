// The token embedding, with its weight gradient added where the strategy
// keeps it.
#pragma once

#include <torch/types.h>

namespace trainer::ops {

/// weight[ids]: `weight` [vocab, dim], `ids` int64 of any shape; the result
/// has ids' shape and a last dimension of dim (torch::embedding's forward).
///
/// Backward, on CUDA with gradient fusion on (off in reproducible mode):
/// where the weight's .grad is a bound fp32 buffer of its shape (a
/// strategy's gradient buffer, as for linear()), each row's gradient is
/// summed in fp32, the tokens in a fixed order (LibTorch's sorted index_put_
/// with accumulation, deterministic on CUDA), and added into that buffer;
/// autograd then adds nothing. That replaces a dense [vocab, dim] gradient
/// in the weight's dtype (zeroed, scattered into, rounded, then added into
/// the buffer) by work on the batch's rows alone. Elsewhere, and on the CPU,
/// torch::embedding's own backward.
torch::Tensor embedding(const torch::Tensor& weight, const torch::Tensor& ids);

}  // namespace trainer::ops
