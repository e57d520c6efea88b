// A linear layer over several weights stacked along the output dimension
// (q/k/v, gate/up): one GEMM each way instead of one per weight.
#pragma once

#include <vector>

#include <torch/types.h>

namespace trainer::ops {

/// x W^T + b, where W stacks `weights` ([out_k, in] each) and b the
/// `biases` (none, or one per weight). When the weights lie back to back in
/// one storage (as flat parameter buffers put a block's projections) W is a
/// view of them and nothing is copied; otherwise they are concatenated.
/// Gradients are returned per weight and bias, as views of one GEMM's result.
torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                     const std::vector<torch::Tensor>& biases = {});

}  // namespace trainer::ops
