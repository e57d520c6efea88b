// What the project's CUDA kernels share: element types, the arithmetic type
// each computes in, loads and stores, and the launch shape.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>

#include "Kernels.h"

namespace trainer::ops::kernels {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load(const float* p) { return *p; }
__device__ inline double load(const double* p) { return *p; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(double* p, double v) { *p = v; }

// Grid-stride launches: enough blocks to fill the GPU several times over.
inline unsigned blocks_for(int64_t items, unsigned threads) {
  const int64_t wanted = (items + threads - 1) / threads;
  return static_cast<unsigned>(wanted < 65535 * 8 ? (wanted > 0 ? wanted : 1) : 65535 * 8);
}

// Calls f with a typed null pointer of the element type of `dtype`.
template <typename F>
void dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::Float32: f(static_cast<float*>(nullptr)); break;
    case Dtype::Float64: f(static_cast<double*>(nullptr)); break;
    case Dtype::BFloat16: f(static_cast<__nv_bfloat16*>(nullptr)); break;
  }
}

}  // namespace trainer::ops::kernels
