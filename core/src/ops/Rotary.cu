// CUDA kernels of split_qkv_rotary (Rotary.cpp has the CPU path and the
// autograd function). One pass over the fused q/k/v projection output:
// each thread rotates (or copies) one pair (i, i + d/2) of one head of one
// token, reading the pair once and writing it once, instead of HF's
// narrow/neg/cat/mul/mul/add chain with its temporaries (about 6 passes).
//
// Rotation by angle a = pos * inv_freq[i]:  y1 = x1 cos a - x2 sin a,
// y2 = x2 cos a + x1 sin a. Its gradient is the rotation by -a.
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

template <typename T>
__global__ void qkv_rotary_forward_kernel(const T* qkv, int64_t qkv_stride, T* q, T* k, T* v,
                                          const typename Acc<T>::type* cos, const typename Acc<T>::type* sin,
                                          int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim) {
  using A = typename Acc<T>::type;
  const int half = head_dim / 2;
  const int slots = heads + 2 * kv_heads;
  const int64_t items = tokens * slots * half;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(item % half);
    const int slot = static_cast<int>((item / half) % slots);
    const int64_t token = item / (int64_t(half) * slots);
    const T* in = qkv + token * qkv_stride + int64_t(slot) * head_dim;
    const A x1 = load(in + i), x2 = load(in + i + half);
    T* out;
    if (slot < heads) {
      out = q + (token * heads + slot) * head_dim;
    } else if (slot < heads + kv_heads) {
      out = k + (token * kv_heads + (slot - heads)) * head_dim;
    } else {
      out = v + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
      store(out + i, x1);
      store(out + i + half, x2);
      continue;
    }
    const int64_t at = (token % seq) * half + i;
    const A c = cos[at], s = sin[at];
    store(out + i, x1 * c - x2 * s);
    store(out + i + half, x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void qkv_rotary_backward_kernel(const T* dq, const T* dk, const T* dv, T* dqkv,
                                           const typename Acc<T>::type* cos, const typename Acc<T>::type* sin,
                                           int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim) {
  using A = typename Acc<T>::type;
  const int half = head_dim / 2;
  const int slots = heads + 2 * kv_heads;
  const int64_t items = tokens * slots * half;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(item % half);
    const int slot = static_cast<int>((item / half) % slots);
    const int64_t token = item / (int64_t(half) * slots);
    T* out = dqkv + (token * slots + slot) * head_dim;
    if (slot >= heads + kv_heads) {
      const T* g = dv + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
      out[i] = g[i];
      out[i + half] = g[i + half];
      continue;
    }
    const T* g = slot < heads ? dq + (token * heads + slot) * head_dim
                              : dk + (token * kv_heads + (slot - heads)) * head_dim;
    const A g1 = load(g + i), g2 = load(g + i + half);
    const int64_t at = (token % seq) * half + i;
    const A c = cos[at], s = sin[at];
    store(out + i, g1 * c + g2 * s);
    store(out + i + half, g2 * c - g1 * s);
  }
}

}  // namespace

void qkv_rotary_forward(Dtype dtype, const void* qkv, int64_t qkv_stride, void* q, void* k, void* v,
                        const void* cos, const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads,
                        int head_dim, cudaStream_t stream) {
  const int64_t items = tokens * (heads + 2 * kv_heads) * (head_dim / 2);
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Acc<T>::type;
    qkv_rotary_forward_kernel<T><<<blocks_for(items, 256), 256, 0, stream>>>(
        static_cast<const T*>(qkv), qkv_stride, static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v),
        static_cast<const A*>(cos), static_cast<const A*>(sin), tokens, seq, heads, kv_heads, head_dim);
  });
}

void qkv_rotary_backward(Dtype dtype, const void* dq, const void* dk, const void* dv, void* dqkv, const void* cos,
                         const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim,
                         cudaStream_t stream) {
  const int64_t items = tokens * (heads + 2 * kv_heads) * (head_dim / 2);
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Acc<T>::type;
    qkv_rotary_backward_kernel<T><<<blocks_for(items, 256), 256, 0, stream>>>(
        static_cast<const T*>(dq), static_cast<const T*>(dk), static_cast<const T*>(dv), static_cast<T*>(dqkv),
        static_cast<const A*>(cos), static_cast<const A*>(sin), tokens, seq, heads, kv_heads, head_dim);
  });
}

const char* last_error() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace trainer::ops::kernels
