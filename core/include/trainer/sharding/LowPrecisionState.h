// Optimizer state kept in bf16 (an optimizer's state_dtype): the update runs
// on fp32 copies, a chunk at a time, and writes the state back with
// stochastic rounding, whose random bits are a function of (step, state
// tensor, flat group, element): runs repeat bit for bit, and no cut of the
// elements into shards or chunks changes a bit.
#pragma once

#include <cstdint>
#include <functional>

#include <torch/types.h>

#include "trainer/Optimizer.h"

namespace trainer {

/// dst (bf16, same length) = src (fp32) rounded to bf16 up with probability
/// equal to src's distance from the bf16 value below it (in magnitude) over
/// the gap, so that E[dst] = src: the 16 bits dropped are compared with 16
/// random bits, hash(stream, first_index + i). Integer tensor arithmetic
/// without overflow: the same bits on the CPU and CUDA. NaN stays NaN.
void stochastic_round(torch::Tensor dst, const torch::Tensor& src, uint64_t stream, int64_t first_index);

/// The stream of state tensor `which` of flat group `group` at update `step`.
uint64_t state_stream(int64_t step, size_t which, size_t group);

/// Runs `update` on `slice`, whose state may be narrower than fp32: then in
/// chunks of elements [begin, begin + length) of the slice, on a sub-slice
/// whose state tensors are fp32 copies, each written back with
/// stochastic_round (stream state_stream(step, k, slice.group), element
/// slice.offset + begin + i). With fp32 or fp64 state, once on the slice itself.
void with_wide_state(UpdateSlice& slice, int64_t step,
                     const std::function<void(UpdateSlice& part, int64_t begin, int64_t length)>& update);

}  // namespace trainer
