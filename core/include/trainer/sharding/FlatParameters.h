// Flat fp32 buffers of parameters, one per weight-decay group, and the shard
// arithmetic ("which slice is mine") the ZeRO strategies share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Model.h"

namespace trainer {

/// Where one parameter lives inside its group's flat buffer.
struct ParameterSlot {
  std::string name;
  torch::Tensor param;  ///< the model's tensor, now a view of the flat buffer
  int64_t offset = 0;
  int64_t numel = 0;
  size_t position = 0;  ///< its index in Model::parameters()
};

/// Parameters with the same weight-decay setting, stored back to back.
struct ParameterGroup {
  bool decay = true;
  torch::Tensor values;   ///< flat master copy (fp32), `padded_numel` elements
  torch::Tensor compute;  ///< what the parameters are views of: `values` itself, or a bf16 copy of it
  std::vector<ParameterSlot> slots;
  int64_t numel = 0;         ///< sum of parameter sizes
  int64_t padded_numel = 0;  ///< numel rounded up to a multiple of pad_to; the tail is zero
};

/// Moves every parameter into its group's flat buffer on `device` and makes
/// the parameter a view of it (Tensor::set_data), so the model keeps working
/// on the same tensor objects. Groups: decay first, then no-decay; empty
/// groups are left out. Parameter order within a group is the model's.
/// `dtype` is the master dtype (fp32 for training; the conformance kit's
/// reference uses fp64). With a narrower `compute_dtype` (bf16) the
/// parameters become views of a separate `compute` buffer instead, which
/// sync_compute() refreshes from `values` after each update.
std::vector<ParameterGroup> flatten_parameters(const std::vector<NamedParameter>& params, torch::Device device,
                                               int64_t pad_to, torch::Dtype dtype = torch::kFloat32,
                                               c10::optional<torch::Dtype> compute_dtype = c10::nullopt);

/// True when the parameters compute in another dtype than the master copy.
inline bool separate_compute(const ParameterGroup& group) { return !group.compute.is_same(group.values); }

/// compute = values (rounded to the compute dtype); nothing when they are one buffer.
void sync_compute(ParameterGroup& group);

/// Makes each parameter's .grad a view of `grads` (laid out as
/// group.values, in the compute dtype), so autograd accumulates in place
/// into the flat buffer.
void bind_gradients(ParameterGroup& group, const torch::Tensor& grads);

/// Part of one unit (Model::units) in one group's flat buffer: the elements
/// [begin, end), which hold `slots` back to back in layout order.
struct UnitSpan {
  size_t group = 0;
  int64_t begin = 0, end = 0;
  std::vector<const ParameterSlot*> slots;
};

/// Where each of `units` (Model::units(), in order) lies in `groups`
/// (flatten_parameters of the same Model::parameters()): per unit, its
/// spans in the order of their first parameter, parameters adjacent in a
/// group joined into one span. Throws std::invalid_argument naming the unit
/// or the parameter when a unit names a parameter the model lacks, or when a
/// parameter lies in no unit or in more than one.
std::vector<std::vector<UnitSpan>> unit_spans(const std::vector<ParameterUnit>& units,
                                              const std::vector<ParameterGroup>& groups);

/// The contiguous slice [offset, offset + numel) of a padded flat buffer that
/// rank `rank` of `world_size` owns. padded_numel must divide evenly.
struct Shard {
  int64_t offset = 0;
  int64_t numel = 0;
};
Shard shard_of(int64_t padded_numel, int rank, int world_size);

/// Every shard starts on a multiple of this many elements (256 bytes of
/// fp32): the fused kernels' vector loads and NCCL's buffers stay aligned,
/// and no shard runs AdamW's scalar path for want of alignment.
inline constexpr int64_t kShardAlignment = 64;

/// What flat groups sharded over `world_size` ranks are padded to, so that
/// each shard's length, and so each start, is a multiple of kShardAlignment.
inline int64_t shard_padding(int world_size) { return static_cast<int64_t>(world_size) * kShardAlignment; }

/// The part of `shard` that holds real elements of `group` (not padding):
/// same offset, numel clipped at group.numel; a shard wholly in the padding
/// gives an empty one at group.numel.
Shard unpadded(const ParameterGroup& group, const Shard& shard);

}  // namespace trainer
