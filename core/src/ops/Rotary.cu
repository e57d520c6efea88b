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

// Which pair each thread handles: blocks tile a token's slots x half pairs
// along x (32-bit indices: a slot and a pair index come from one 32-bit
// division) and walk the tokens along y, so no thread divides 64-bit
// integers per element (three 64-bit div/mod per element cost more than the
// rotation). Launched with pair_grid. f(token, slot, i): slot < heads is a
// query head, then kv_heads key heads, then kv_heads value heads.
template <typename F>
__device__ void for_each_pair(int64_t tokens, int slots, int half, F&& f) {
  const int pairs = slots * half;
  for (int64_t token = blockIdx.y; token < tokens; token += gridDim.y) {
    for (int pair = blockIdx.x * blockDim.x + threadIdx.x; pair < pairs; pair += gridDim.x * blockDim.x) {
      f(token, pair / half, pair % half);
    }
  }
}

constexpr unsigned kThreads = 256;

dim3 pair_grid(int64_t tokens, int heads, int kv_heads, int head_dim) {
  const int64_t pairs = int64_t(heads + 2 * kv_heads) * (head_dim / 2);
  const int64_t x = (pairs + kThreads - 1) / kThreads;
  const int64_t y = tokens < 65535 ? tokens : 65535;
  return dim3(static_cast<unsigned>(x > 0 ? x : 1), static_cast<unsigned>(y > 0 ? y : 1));
}

template <typename T>
__global__ void qkv_rotary_forward_kernel(const T* qkv, int64_t qkv_stride, T* q, T* k, T* v,
                                          const typename Acc<T>::type* cos, const typename Acc<T>::type* sin,
                                          int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim) {
  using A = typename Acc<T>::type;
  const int half = head_dim / 2;
  for_each_pair(tokens, heads + 2 * kv_heads, half, [&](int64_t token, int slot, int i) {
    const T* in = qkv + token * qkv_stride + int64_t(slot) * head_dim;
    const A x1 = load(in + i), x2 = load(in + i + half);
    if (slot >= heads + kv_heads) {
      T* out = v + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
      store(out + i, x1);
      store(out + i + half, x2);
      return;
    }
    T* out = slot < heads ? q + (token * heads + slot) * head_dim : k + (token * kv_heads + (slot - heads)) * head_dim;
    const int64_t at = (token % seq) * half + i;
    const A c = cos[at], s = sin[at];
    store(out + i, x1 * c - x2 * s);
    store(out + i + half, x2 * c + x1 * s);
  });
}

template <typename T>
__global__ void qkv_rotary_backward_kernel(const T* dq, const T* dk, const T* dv, T* dqkv,
                                           const typename Acc<T>::type* cos, const typename Acc<T>::type* sin,
                                           int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim) {
  using A = typename Acc<T>::type;
  const int half = head_dim / 2;
  const int slots = heads + 2 * kv_heads;
  for_each_pair(tokens, slots, half, [&](int64_t token, int slot, int i) {
    T* out = dqkv + (token * slots + slot) * head_dim;
    if (slot >= heads + kv_heads) {
      const T* g = dv + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
      out[i] = g[i];
      out[i + half] = g[i + half];
      return;
    }
    const T* g =
        slot < heads ? dq + (token * heads + slot) * head_dim : dk + (token * kv_heads + (slot - heads)) * head_dim;
    const A g1 = load(g + i), g2 = load(g + i + half);
    const int64_t at = (token % seq) * half + i;
    const A c = cos[at], s = sin[at];
    store(out + i, g1 * c + g2 * s);
    store(out + i + half, g2 * c - g1 * s);
  });
}

}  // namespace

void qkv_rotary_forward(Dtype dtype, const void* qkv, int64_t qkv_stride, void* q, void* k, void* v, const void* cos,
                        const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim,
                        cudaStream_t stream) {
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Acc<T>::type;
    qkv_rotary_forward_kernel<T><<<pair_grid(tokens, heads, kv_heads, head_dim), kThreads, 0, stream>>>(
        static_cast<const T*>(qkv), qkv_stride, static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v),
        static_cast<const A*>(cos), static_cast<const A*>(sin), tokens, seq, heads, kv_heads, head_dim);
  });
}

void qkv_rotary_backward(Dtype dtype, const void* dq, const void* dk, const void* dv, void* dqkv, const void* cos,
                         const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim,
                         cudaStream_t stream) {
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Acc<T>::type;
    qkv_rotary_backward_kernel<T><<<pair_grid(tokens, heads, kv_heads, head_dim), kThreads, 0, stream>>>(
        static_cast<const T*>(dq), static_cast<const T*>(dk), static_cast<const T*>(dv), static_cast<T*>(dqkv),
        static_cast<const A*>(cos), static_cast<const A*>(sin), tokens, seq, heads, kv_heads, head_dim);
  });
}

const char* last_error() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace trainer::ops::kernels
