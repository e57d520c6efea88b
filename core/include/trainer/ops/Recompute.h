// Activation checkpointing: a block whose activations are recomputed in
// backward instead of being kept from forward.
#pragma once

#include <functional>

#include <torch/types.h>

namespace trainer::ops {

/// block(x), keeping only x for backward. The backward runs block again on
/// x with gradients enabled and backpropagates through that recomputation,
/// so the gradients of x and of every parameter block uses are what they
/// would have been without checkpointing (bit for bit: the same kernels run
/// on the same inputs). `block` must be deterministic, must not change state,
/// and must outlive the backward; it is called twice.
torch::Tensor recompute(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& x);

}  // namespace trainer::ops
