// What the project's CUDA kernels share: element types, the arithmetic type
// each computes in, loads and stores, and the launch shape.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "Kernels.h"

namespace trainer::ops::kernels {

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load(const float* p) { return *p; }
__device__ inline double load(const double* p) { return *p; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(double* p, double v) { *p = v; }

// Whether `p` lies on a multiple of `bytes` (what a vector load or store needs).
inline bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Grid-stride launches: enough blocks to fill the GPU several times over.
inline unsigned blocks_for(int64_t items, unsigned threads) {
  const int64_t wanted = (items + threads - 1) / threads;
  return static_cast<unsigned>(wanted < 65535 * 8 ? (wanted > 0 ? wanted : 1) : 65535 * 8);
}

// One value into a running largest magnitude, and whether any was NaN
// (fmaxf drops NaN: it travels beside the maximum), for block_amax.
template <typename A>
__device__ inline void track(A value, float& mine, bool& nan) {
  nan = nan || isnan(value);
  mine = fmaxf(mine, fabsf(float(value)));
}

// Raises *amax_bits (a non-negative float's bits) to the block's largest
// `mine`, or to NaN's bits when any thread saw a NaN (they exceed +inf's,
// so NaN wins; fmaxf alone would drop it). Non-negative floats order as
// their bits do. Every thread of the block calls it, after its last value;
// at most 32 warps a block.
__device__ inline void block_amax(float mine, bool nan, unsigned* amax_bits) {
  __shared__ float partial[32];
  const bool any_nan = __syncthreads_or(nan);
  for (int offset = 16; offset > 0; offset /= 2) mine = fmaxf(mine, __shfl_xor_sync(0xffffffffu, mine, offset));
  const unsigned thread = threadIdx.y * blockDim.x + threadIdx.x, warps = (blockDim.x * blockDim.y + 31) / 32;
  if (thread % 32 == 0) partial[thread / 32] = mine;
  __syncthreads();
  if (thread == 0) {
    for (unsigned w = 1; w < warps; ++w) mine = fmaxf(mine, partial[w]);
    const unsigned bits = any_nan ? 0x7fc00000u : __float_as_uint(mine);
    // Most blocks find the maximum already there: a read instead of an atomic.
    if (bits > *static_cast<volatile unsigned*>(amax_bits)) atomicMax(amax_bits, bits);
  }
}

// Stochastic rounding to bf16 (StochasticRound.cu, and AdamW.cu's bf16
// state): element `index` of a stream draws 16 random bits from two 31-bit
// mixes of the index and the stream's low and next 31 bits (StreamSeeds);
// every product stays below 2^62, as in the CPU path's int64 tensors
// (sharding/LowPrecisionState.cpp), which compute the same bits.
struct StreamSeeds {
  unsigned long long low, high;
};
__host__ inline StreamSeeds stream_seeds(uint64_t stream) {
  return StreamSeeds{stream & 0x7fffffffull, (stream >> 31) & 0x7fffffffull};
}
__device__ inline unsigned long long mix31(unsigned long long x) {
  x = (x * 0x2c1b3c6dull) & 0x7fffffffull;
  x ^= x >> 12;
  x = (x * 0x297a2d39ull) & 0x7fffffffull;
  return x ^ (x >> 15);
}
__device__ inline unsigned rounding_noise(unsigned long long index, StreamSeeds seeds) {
  unsigned long long x = mix31((index & 0x7fffffffull) ^ seeds.low);
  x = mix31(x ^ (index >> 31) ^ seeds.high);
  return static_cast<unsigned>(x & 0xffffu);
}
// `value` rounded to bf16 away from zero when its 16 dropped bits plus
// `noise` carry into the kept ones (up with probability equal to the
// distance over the gap); NaN stays NaN (0x7fc0, whichever NaN came in).
__device__ inline __nv_bfloat16 stochastic_bf16(float value, unsigned noise) {
  const unsigned bits = __float_as_uint(value);
  const unsigned magnitude = bits & 0x7fffffffu;
  __nv_bfloat16_raw out;
  if (magnitude > 0x7f800000u) {
    out.x = 0x7fc0;
  } else {
    // Below 2^31 + 2^16: no carry into the sign; +inf (0x7f80....) stays inf.
    const unsigned rounded = (magnitude + noise) & 0x7fff0000u;
    out.x = static_cast<unsigned short>(((bits & 0x80000000u) | rounded) >> 16);
  }
  return __nv_bfloat16(out);
}

// Calls f with a typed null pointer of the element type of `dtype`.
template <typename F>
void dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::Float32:
      f(static_cast<float*>(nullptr));
      break;
    case Dtype::Float64:
      f(static_cast<double*>(nullptr));
      break;
    case Dtype::BFloat16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      break;
  }
}

}  // namespace trainer::ops::kernels
