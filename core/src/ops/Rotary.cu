// CUDA kernels of split_qkv_rotary (Rotary.cpp has the CPU path and the
// autograd function). One pass over the fused q/k/v projection output:
// each thread rotates (or copies) pairs (i, i + d/2) of one head of one
// token, reading each pair once and writing it once, instead of HF's
// narrow/neg/cat/mul/mul/add chain with its temporaries (about 6 passes).
// bf16 rows whose halves are 16-byte aligned take the vector kernels (eight
// pairs a thread, 16-byte loads and stores); the rest the scalar ones. Both
// round every product and sum on its own (no contracted multiply-adds), so
// they give the same bits and the path taken never changes a result.
//
// Rotation by angle a = pos * inv_freq[i]:  y1 = x1 cos a - x2 sin a,
// y2 = x2 cos a + x1 sin a. Its gradient is the rotation by -a.
#include <cstdint>
#include <initializer_list>

#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

// a b - c d and a b + c d, each operation rounded on its own: nvcc would
// otherwise contract them into FMAs where it sees fit, differently in the
// scalar and vector kernels.
__device__ inline float mul_sub(float a, float b, float c, float d) {
  return __fsub_rn(__fmul_rn(a, b), __fmul_rn(c, d));
}
__device__ inline float mul_add(float a, float b, float c, float d) {
  return __fadd_rn(__fmul_rn(a, b), __fmul_rn(c, d));
}
__device__ inline double mul_sub(double a, double b, double c, double d) {
  return __dsub_rn(__dmul_rn(a, b), __dmul_rn(c, d));
}
__device__ inline double mul_add(double a, double b, double c, double d) {
  return __dadd_rn(__dmul_rn(a, b), __dmul_rn(c, d));
}

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
    store(out + i, mul_sub(x1, c, x2, s));
    store(out + i + half, mul_add(x2, c, x1, s));
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
    store(out + i, mul_add(g1, c, g2, s));
    store(out + i + half, mul_sub(g2, c, g1, s));
  });
}

// The vector kernels: bf16, eight pairs (i .. i + 7 and i + half ..) a
// thread, items laid out token-major over slots and groups of eight pairs.
constexpr int kVector = 8;

struct Floats8 {
  float v[kVector];
};

__device__ inline Floats8 load8(const __nv_bfloat16* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Floats8 out;
#pragma unroll
  for (int j = 0; j < kVector / 2; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    out.v[2 * j] = f.x;
    out.v[2 * j + 1] = f.y;
  }
  return out;
}

__device__ inline void store8(__nv_bfloat16* p, const Floats8& x) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < kVector / 2; ++j) h[j] = __floats2bfloat162_rn(x.v[2 * j], x.v[2 * j + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ inline void copy8(__nv_bfloat16* to, const __nv_bfloat16* from) {
  *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
}

__device__ inline Floats8 load8(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return Floats8{{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}

// f(token, slot, i) for every token, slot and group start i (a multiple of 8 below half).
template <typename F>
__device__ void for_each_group(int64_t tokens, int slots, int half, F&& f) {
  const int groups = half / kVector;
  const int64_t per_token = int64_t(slots) * groups;
  const int64_t items = tokens * per_token;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = item / per_token;
    const int rest = static_cast<int>(item - token * per_token);
    f(token, rest / groups, (rest % groups) * kVector);
  }
}

__global__ void qkv_rotary_forward_vector_kernel(const __nv_bfloat16* qkv, int64_t qkv_stride, __nv_bfloat16* q,
                                                 __nv_bfloat16* k, __nv_bfloat16* v, const float* cos, const float* sin,
                                                 int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim) {
  const int half = head_dim / 2;
  for_each_group(tokens, heads + 2 * kv_heads, half, [&](int64_t token, int slot, int i) {
    const __nv_bfloat16* in = qkv + token * qkv_stride + int64_t(slot) * head_dim;
    if (slot >= heads + kv_heads) {
      __nv_bfloat16* out = v + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
      copy8(out + i, in + i);
      copy8(out + i + half, in + i + half);
      return;
    }
    __nv_bfloat16* out =
        slot < heads ? q + (token * heads + slot) * head_dim : k + (token * kv_heads + (slot - heads)) * head_dim;
    const int64_t at = (token % seq) * half + i;
    const Floats8 x1 = load8(in + i), x2 = load8(in + i + half), c = load8(cos + at), s = load8(sin + at);
    Floats8 y1, y2;
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      y1.v[j] = mul_sub(x1.v[j], c.v[j], x2.v[j], s.v[j]);
      y2.v[j] = mul_add(x2.v[j], c.v[j], x1.v[j], s.v[j]);
    }
    store8(out + i, y1);
    store8(out + i + half, y2);
  });
}

__global__ void qkv_rotary_backward_vector_kernel(const __nv_bfloat16* dq, const __nv_bfloat16* dk,
                                                  const __nv_bfloat16* dv, __nv_bfloat16* dqkv, const float* cos,
                                                  const float* sin, int64_t tokens, int64_t seq, int heads,
                                                  int kv_heads, int head_dim) {
  const int half = head_dim / 2;
  const int slots = heads + 2 * kv_heads;
  for_each_group(tokens, slots, half, [&](int64_t token, int slot, int i) {
    __nv_bfloat16* out = dqkv + (token * slots + slot) * head_dim;
    if (slot >= heads + kv_heads) {
      const __nv_bfloat16* g = dv + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
      copy8(out + i, g + i);
      copy8(out + i + half, g + i + half);
      return;
    }
    const __nv_bfloat16* g =
        slot < heads ? dq + (token * heads + slot) * head_dim : dk + (token * kv_heads + (slot - heads)) * head_dim;
    const int64_t at = (token % seq) * half + i;
    const Floats8 g1 = load8(g + i), g2 = load8(g + i + half), c = load8(cos + at), s = load8(sin + at);
    Floats8 d1, d2;
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      d1.v[j] = mul_add(g1.v[j], c.v[j], g2.v[j], s.v[j]);
      d2.v[j] = mul_sub(g2.v[j], c.v[j], g1.v[j], s.v[j]);
    }
    store8(out + i, d1);
    store8(out + i + half, d2);
  });
}

bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// The vector kernels' preconditions: bf16, groups of eight pairs, and every
// row, half row and table row starting on a 16-byte boundary.
bool vectorizable(Dtype dtype, int head_dim, int64_t qkv_stride, std::initializer_list<const void*> pointers) {
  return dtype == Dtype::BFloat16 && head_dim % (2 * kVector) == 0 && qkv_stride % kVector == 0 && aligned16(pointers);
}

}  // namespace

void qkv_rotary_forward(Dtype dtype, const void* qkv, int64_t qkv_stride, void* q, void* k, void* v, const void* cos,
                        const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim,
                        cudaStream_t stream) {
  if (vectorizable(dtype, head_dim, qkv_stride, {qkv, q, k, v, cos, sin})) {
    const int64_t items = tokens * (heads + 2 * kv_heads) * (head_dim / 2 / kVector);
    qkv_rotary_forward_vector_kernel<<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(qkv), qkv_stride, static_cast<__nv_bfloat16*>(q),
        static_cast<__nv_bfloat16*>(k), static_cast<__nv_bfloat16*>(v), static_cast<const float*>(cos),
        static_cast<const float*>(sin), tokens, seq, heads, kv_heads, head_dim);
    return;
  }
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
  if (vectorizable(dtype, head_dim, (heads + 2 * kv_heads) * int64_t(head_dim), {dq, dk, dv, dqkv, cos, sin})) {
    const int64_t items = tokens * (heads + 2 * kv_heads) * (head_dim / 2 / kVector);
    qkv_rotary_backward_vector_kernel<<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(dq), static_cast<const __nv_bfloat16*>(dk),
        static_cast<const __nv_bfloat16*>(dv), static_cast<__nv_bfloat16*>(dqkv), static_cast<const float*>(cos),
        static_cast<const float*>(sin), tokens, seq, heads, kv_heads, head_dim);
    return;
  }
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
