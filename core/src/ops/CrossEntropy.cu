// CUDA kernel of linear_cross_entropy_sum's softmax step (LinearCrossEntropy.cpp
// has the GEMMs and the CPU path). One block per row of fp32 logits x with
// target t:
//
//   lse = log sum_j exp(x_j),  loss = lse - x_t,  grad_j = exp(x_j - lse) - [j = t]
//
// Pass 1 keeps a running (max, sum of exp) per thread and combines them
// across the block; pass 2 writes the gradient, rounded once to its dtype.
// Two reads of the logits and one write of the gradient, against LibTorch's
// log-softmax, gather, exp and scatter (about twice the traffic).
#include <cfloat>

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

template <typename G>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(const float* logits, const int64_t* targets, float* loss, G* grad, int64_t vocab) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const int64_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  // Read before pass 2, which may overwrite the logits (fp32 gradient in place).
  const float x_target = valid ? x[target] : 0.0f;
  const bool vectors = vocab % 4 == 0;  // rows then start 16-byte aligned
  Lse mine;
  if (vectors) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const float4 v = x4[i];
      mine.add(v.x);
      mine.add(v.y);
      mine.add(v.z);
      mine.add(v.w);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mine.add(x[j]);
  }
  const Lse all = block_lse(mine);
  const float lse = all.max + logf(all.sum);
  if (threadIdx.x == 0) loss[row] = valid ? lse - x_target : __int_as_float(0x7fc00000);  // NaN: a bad target
  if (grad == nullptr) return;
  G* g = grad + row * vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(x[j] - lse);
    store(g + j, j == target ? p - 1.0f : p);
  }
}

}  // namespace

void cross_entropy_rows(Dtype grad_dtype, const float* logits, const int64_t* targets, float* loss, void* grad,
                        int64_t rows, int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return;
  if (grad_dtype == Dtype::BFloat16) {
    cross_entropy_kernel<__nv_bfloat16><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, targets, loss, static_cast<__nv_bfloat16*>(grad), vocab);
  } else {
    cross_entropy_kernel<float><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, targets, loss, static_cast<float*>(grad), vocab);
  }
}

}  // namespace trainer::ops::kernels
