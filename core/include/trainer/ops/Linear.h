// A linear layer over several weights stacked along the output dimension
// (q/k/v, gate/up): one GEMM each way instead of one per weight.
#pragma once

#include <functional>
#include <vector>

#include <torch/types.h>

namespace trainer::ops {

/// x W^T + b, where W stacks `weights` ([out_k, in] each) and b the
/// `biases` (none, or one per weight). When the weights lie back to back in
/// one storage (as flat parameter buffers put a block's projections) W is a
/// view of them and nothing is copied; otherwise they are concatenated.
/// Gradients are returned per weight and bias, as views of one GEMM's result;
/// except on CUDA in bf16 where every weight's .grad is an fp32 buffer of its
/// shape, back to back (as the strategies bind them): there the GEMM adds the
/// weight gradient into those buffers in fp32 and returns it undefined.
torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                     const std::vector<torch::Tensor>& biases = {});

/// f(s, f_params), the cheap function in front of linear_of's GEMM.
using InputFunction = std::function<torch::Tensor(const torch::Tensor&, const std::vector<torch::Tensor>&)>;

/// linear(f(s, f_params), weights, biases) that keeps `s`, not f's output,
/// for backward and runs f again there. For an elementwise f in front of a
/// GEMM (a norm, an activation) this saves the memory of f's output for one
/// more pass of f; the gradients are those of the plain composition. f's
/// parameters (a norm's weight) go in `f_params` so that they receive their
/// gradients. f must be deterministic and must outlive the backward.
torch::Tensor linear_of(InputFunction f, const torch::Tensor& s, const std::vector<torch::Tensor>& f_params,
                        const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases = {});

/// linear_of(swiglu, gate_up, {}, weights, biases): SwiGLU in front of a
/// linear layer, its output recomputed in backward; the same values and
/// gradients, bit for bit. Where the layer runs in FP8, backward never
/// writes SwiGLU's output in bf16: one kernel reads `gate_up` and writes the
/// weight gradient's transposed FP8 operand.
torch::Tensor swiglu_linear(const torch::Tensor& gate_up, const std::vector<torch::Tensor>& weights,
                            const std::vector<torch::Tensor>& biases = {});

/// linear_of(rms_norm with `norm_weight` and `eps`, x, {norm_weight},
/// weights, biases): RMSNorm in front of a linear layer, its output
/// recomputed in backward; the same values and gradients, bit for bit. On
/// CUDA in bf16 backward keeps each row's reciprocal RMS from the forward
/// (4 bytes a row), and where the layer runs in FP8 it never writes the
/// norm's output in bf16: one kernel reads x and writes the weight
/// gradient's transposed FP8 operand.
torch::Tensor norm_linear(const torch::Tensor& x, const torch::Tensor& norm_weight, double eps,
                          const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases = {});

}  // namespace trainer::ops
