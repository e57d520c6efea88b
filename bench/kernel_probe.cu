// Times the project's memory-bound CUDA kernels (core/src/ops/Kernels.h) one
// by one at the bench shapes' widths, 8192 tokens (micro-batch 4 x 2048):
// microseconds a call and the bandwidth of the bytes each must move. A probe
// for tuning a kernel without a full build and bench run (seconds of device
// time); the step's own profile (bench.py --profile) says which kernels matter.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -Icore/src/ops -o /tmp/kernel_probe bench/kernel_probe.cu
//     core/src/ops/RmsNorm.cu core/src/ops/SwiGlu.cu core/src/ops/Fp8.cu   (one line)
//   /tmp/kernel_probe
#include <cstdint>
#include <cstdio>
#include <functional>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "Kernels.h"

namespace {

namespace k = trainer::ops::kernels;

// Values of about unit size from a hash of the index: the same every run.
__global__ void fill(__nv_bfloat16* out, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    out[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
  }
}

__nv_bfloat16* values(int64_t n, uint32_t seed) {
  __nv_bfloat16* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(__nv_bfloat16)) != cudaSuccess) return nullptr;
  fill<<<1024, 256>>>(p, n, seed);
  return p;
}

template <typename T>
T* scratch(int64_t n) {
  T* p = nullptr;
  return cudaMalloc(&p, n * sizeof(T)) == cudaSuccess ? p : nullptr;
}

// Mean microseconds a call over `reps` after three warm-up calls, and the
// bandwidth of `bytes` a call.
void time(const char* shape, const char* what, double bytes, const std::function<void()>& call, int reps = 50) {
  for (int i = 0; i < 3; ++i) call();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) call();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  const double us = 1000.0 * ms / reps;
  const cudaError_t error = cudaGetLastError();
  std::printf("%-5s %-44s %9.1f us %6.2f TB/s%s%s\n", shape, what, us, bytes / us / 1e6,
              error == cudaSuccess ? "" : "  CUDA error: ", error == cudaSuccess ? "" : cudaGetErrorString(error));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace

int main() {
  const int64_t tokens = 8192;
  struct Shape {
    const char* name;
    int64_t hidden, intermediate;
  };
  for (const Shape& s : {Shape{"0.5b", 896, 4864}, Shape{"3b", 2048, 11008}}) {
    const int64_t h = tokens * s.hidden, i = tokens * s.intermediate;
    __nv_bfloat16 *x = values(h, 1), *dy = values(h, 2), *gamma = values(s.hidden, 3);
    __nv_bfloat16 *gate_up = values(2 * i, 4), *d_out = values(i, 5);
    __nv_bfloat16 *y = scratch<__nv_bfloat16>(2 * i), *dx = scratch<__nv_bfloat16>(2 * i);
    float *rstd = scratch<float>(tokens), *amax = scratch<float>(1), *inverse_scale = scratch<float>(1);
    float* partial = scratch<float>(k::rms_norm_backward_scratch(tokens, s.hidden));
    uint8_t *fp8 = scratch<uint8_t>(2 * i), *fp8_t = scratch<uint8_t>(2 * i);
    if (x == nullptr || dy == nullptr || gamma == nullptr || gate_up == nullptr || d_out == nullptr || y == nullptr ||
        dx == nullptr || rstd == nullptr || amax == nullptr || inverse_scale == nullptr || partial == nullptr ||
        fp8 == nullptr || fp8_t == nullptr) {
      std::fprintf(stderr, "kernel_probe: out of device memory at the %s shape\n", s.name);
      return 1;
    }
    const float one = 1.0f;
    cudaMemcpy(inverse_scale, &one, sizeof(float), cudaMemcpyHostToDevice);
    const cudaStream_t stream = nullptr;
    time(s.name, "rms_norm_forward [T, hidden]", 4.0 * h,
         [&] { k::rms_norm_forward(x, gamma, tokens, s.hidden, 1e-6f, y, rstd, nullptr, stream); });
    time(s.name, "rms_norm_forward + amax", 4.0 * h,
         [&] { k::rms_norm_forward(x, gamma, tokens, s.hidden, 1e-6f, y, rstd, amax, stream); });
    time(s.name, "rms_norm_backward (weight gradient in bf16)", 6.0 * h,
         [&] { k::rms_norm_backward(dy, x, gamma, rstd, tokens, s.hidden, dx, partial, nullptr, y, stream); });
    time(s.name, "rms_norm_fp8_transposed", 3.0 * h,
         [&] { k::rms_norm_fp8_transposed(x, gamma, rstd, tokens, s.hidden, inverse_scale, fp8_t, stream); });
    time(s.name, "swiglu_forward [T, 2 inter] -> [T, inter]", 6.0 * i,
         [&] { k::swiglu_forward(k::Dtype::BFloat16, gate_up, y, tokens, s.intermediate, nullptr, stream); });
    time(s.name, "swiglu_backward", 10.0 * i,
         [&] { k::swiglu_backward(k::Dtype::BFloat16, gate_up, d_out, dx, tokens, s.intermediate, nullptr, stream); });
    time(s.name, "swiglu_backward + forward's value (bf16 backward)", 12.0 * i, [&] {
      k::swiglu_backward(k::Dtype::BFloat16, gate_up, d_out, dx, tokens, s.intermediate, nullptr, stream, y);
    });
    time(s.name, "swiglu_fp8_transposed", 5.0 * i,
         [&] { k::swiglu_fp8_transposed(gate_up, tokens, s.intermediate, inverse_scale, fp8_t, stream); });
    time(s.name, "swiglu_backward_fp8_transposed (the two above)", 11.0 * i, [&] {
      k::swiglu_backward_fp8_transposed(gate_up, d_out, dx, tokens, s.intermediate, inverse_scale, fp8_t, amax, stream);
    });
    time(s.name, "fp8_amax [T, 2 inter]", 4.0 * i, [&] { k::fp8_amax(gate_up, 2 * i, amax, stream); });
    time(s.name, "fp8_quantize [T, 2 inter], amax known", 6.0 * i,
         [&] { k::fp8_quantize(gate_up, 2 * i, false, fp8, amax, true, inverse_scale, stream); });
    time(s.name, "fp8_quantize_transposed [T, 2 inter], both", 8.0 * i, [&] {
      k::fp8_quantize_transposed(gate_up, tokens, 2 * s.intermediate, true, amax, inverse_scale, fp8_t, fp8, stream);
    });
    for (void* p :
         {static_cast<void*>(x), static_cast<void*>(dy), static_cast<void*>(gamma), static_cast<void*>(gate_up),
          static_cast<void*>(d_out), static_cast<void*>(y), static_cast<void*>(dx), static_cast<void*>(rstd),
          static_cast<void*>(amax), static_cast<void*>(inverse_scale), static_cast<void*>(partial),
          static_cast<void*>(fp8), static_cast<void*>(fp8_t)}) {
      cudaFree(p);
    }
  }
  return 0;
}
