// Rotary position embeddings (RoPE) applied while splitting a fused q/k/v
// projection into heads: one kernel on CUDA, a composite CPU path.
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace trainer::ops {

/// cos and sin of the rotation angles pos * theta^(-2i/d), [seq, head_dim/2],
/// in fp32 (fp64 when `dtype` is fp64), as Hugging Face computes them.
/// Llama 3's frequency-dependent stretch of the rotary frequencies (Hugging
/// Face's rope_type "llama3"): wavelengths longer than
/// original_max_positions / low_freq_factor are divided by `factor`, those
/// shorter than original_max_positions / high_freq_factor are kept, and the
/// band between is interpolated. factor = 1: no scaling.
struct RopeScaling {
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192;
};

struct RotaryTables {
  torch::Tensor cos, sin;
  /// false: row p is position p (every sequence starts at 0); true: row r is
  /// token r of the flattened [batch, seq] (at_positions).
  bool per_token = false;
  static RotaryTables make(int64_t seq, int64_t head_dim, double theta, torch::Dtype dtype, torch::Device device,
                           const RopeScaling& scaling = RopeScaling());
  /// Per-token tables: row b * seq + i is the row of position
  /// position_ids[b][i] ([batch, seq], each below this table's rows), for
  /// packed documents whose positions restart at each document.
  RotaryTables at_positions(const torch::Tensor& position_ids) const;
};

struct QkvHeads {
  torch::Tensor q, k, v;  ///< [batch, seq, heads, head_dim] each, contiguous; q and k rotated
};

/// Splits `qkv` ([batch, seq, (heads + 2 kv_heads) * head_dim], q then k then
/// v, last dimension contiguous) into heads and rotates q and k by position
/// (Hugging Face's rotate_half convention: pairs (i, i + head_dim/2)).
/// Differentiable in qkv; the backward writes the gradient of qkv in one pass.
QkvHeads split_qkv_rotary(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads, const RotaryTables& tables);

/// The CPU path on any device, for testing the CUDA kernel against it.
QkvHeads split_qkv_rotary_reference(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                    const RotaryTables& tables);

}  // namespace trainer::ops
