// CUDA kernel of linear_cross_entropy_sum's softmax step (LinearCrossEntropy.cpp
// has the GEMMs and the CPU path). One block per row of fp32 logits x with
// target t:
//
//   lse = log sum_j exp(x_j),  loss = lse - x_t,  grad_j = exp(x_j - lse) - [j = t]
//
// Pass 1 keeps a running (max, sum of exp) per thread and combines them
// across the block; pass 2 writes the gradient, rounded once to its dtype.
// Rows of a vocabulary that is a multiple of 4 are read 16 bytes at a time
// with several loads in flight per thread (the kernel is bound by memory:
// a row of 151,936 logits is 594 KiB, read twice).
// Two reads of the logits and one write of the gradient, against LibTorch's
// log-softmax, gather, exp and scatter (about twice the traffic).
#include <cfloat>
#include <cstdint>

#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 512;

// A running log-sum-exp: the largest value seen and the sum of exp(v - max).
// Starting from the lowest finite float keeps -inf logits harmless
// (exp(-inf - m) = 0); NaN and +inf reach the loss as non-finite values.
struct Lse {
  float max = -FLT_MAX;
  float sum = 0.0f;

  __device__ void add(float v) {
    if (v > max) {
      sum = sum * expf(max - v) + 1.0f;
      max = v;
    } else {
      sum += expf(v - max);
    }
  }
  // Four values at once: one rescale at most, then four exponentials.
  __device__ void add4(const float4& v) {
    const float m4 = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    if (m4 > max) {
      sum *= expf(max - m4);
      max = m4;
    }
    sum += (expf(v.x - max) + expf(v.y - max)) + (expf(v.z - max) + expf(v.w - max));
  }
  __device__ void merge(const Lse& o) {
    const float m = o.max > max ? o.max : max;
    sum = sum * expf(max - m) + o.sum * expf(o.max - m);
    max = m;
  }
};

__device__ Lse block_lse(Lse mine) {
  __shared__ float maxes[kThreads / 32], sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    Lse other;
    other.max = __shfl_xor_sync(0xffffffffu, mine.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, mine.sum, offset);
    mine.merge(other);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    maxes[warp] = mine.max;
    sums[warp] = mine.sum;
  }
  __syncthreads();
  Lse all;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) {  // every thread, in the same order
    Lse part;
    part.max = maxes[w];
    part.sum = sums[w];
    all.merge(part);
  }
  return all;
}

// Four gradient entries softmax - one-hot from logits v; `at_target` is the
// target's index relative to the first of them (in [0, 4) when one is it).
__device__ inline float4 gradient4(const float4& v, float lse, int64_t at_target) {
  float4 p = make_float4(expf(v.x - lse), expf(v.y - lse), expf(v.z - lse), expf(v.w - lse));
  if (at_target == 0) p.x -= 1.0f;
  if (at_target == 1) p.y -= 1.0f;
  if (at_target == 2) p.z -= 1.0f;
  if (at_target == 3) p.w -= 1.0f;
  return p;
}

__device__ inline void store4(float* g, const float4& v, float lse, int64_t at_target) {
  *reinterpret_cast<float4*>(g) = gradient4(v, lse, at_target);
}

__device__ inline void store4(__nv_bfloat16* g, const float4& v, float lse, int64_t at_target) {
  const float4 p = gradient4(v, lse, at_target);
  uint2 raw;
  reinterpret_cast<__nv_bfloat162*>(&raw)[0] = __floats2bfloat162_rn(p.x, p.y);
  reinterpret_cast<__nv_bfloat162*>(&raw)[1] = __floats2bfloat162_rn(p.z, p.w);
  *reinterpret_cast<uint2*>(g) = raw;
}

template <typename G>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(const float* logits, const int64_t* targets,
                                                                 float* loss, G* grad, int64_t vocab, bool vectors) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const int64_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  // Read before pass 2, which may overwrite the logits (fp32 gradient in place).
  const float x_target = valid ? x[target] : 0.0f;
  Lse mine;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int64_t n4 = vocab / 4, stride = blockDim.x;
  if (vectors) {
    // Four 16-byte loads in flight per thread before their values are used.
    int64_t i = threadIdx.x;
    for (; i + 3 * stride < n4; i += 4 * stride) {
      const float4 a = x4[i], b = x4[i + stride], c = x4[i + 2 * stride], d = x4[i + 3 * stride];
      mine.add4(a);
      mine.add4(b);
      mine.add4(c);
      mine.add4(d);
    }
    for (; i < n4; i += stride) mine.add4(x4[i]);
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mine.add(x[j]);
  }
  const Lse all = block_lse(mine);
  const float lse = all.max + logf(all.sum);
  if (threadIdx.x == 0) loss[row] = valid ? lse - x_target : __int_as_float(0x7fc00000);  // NaN: a bad target
  if (grad == nullptr) return;
  G* g = grad + row * vocab;
  if (vectors) {
    // Rows of bf16 gradients start 8-byte aligned, fp32 ones 16-byte aligned.
    int64_t i = threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {
      const float4 a = x4[i], b = x4[i + stride];
      store4(g + 4 * i, a, lse, target - 4 * i);
      store4(g + 4 * (i + stride), b, lse, target - 4 * (i + stride));
    }
    for (; i < n4; i += stride) store4(g + 4 * i, x4[i], lse, target - 4 * i);
    return;
  }
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(x[j] - lse);
    store(g + j, j == target ? p - 1.0f : p);
  }
}

}  // namespace

void cross_entropy_rows(Dtype grad_dtype, const float* logits, const int64_t* targets, float* loss, void* grad,
                        int64_t rows, int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return;
  // Vector accesses when every row starts aligned: 16 bytes for the fp32
  // logits and an fp32 gradient, 8 for a bf16 one (four elements).
  const size_t grad_alignment = grad_dtype == Dtype::BFloat16 ? 8 : 16;
  const bool vectors = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(grad) % grad_alignment == 0;
  if (grad_dtype == Dtype::BFloat16) {
    cross_entropy_kernel<__nv_bfloat16><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, targets, loss, static_cast<__nv_bfloat16*>(grad), vocab, vectors);
  } else {
    cross_entropy_kernel<float><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, targets, loss, static_cast<float*>(grad), vocab, vectors);
  }
}

}  // namespace trainer::ops::kernels
