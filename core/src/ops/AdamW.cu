// The AdamW step over flat fp32 buffers (AdamW.cpp's adamw_update on CUDA):
// one pass reading parameters, gradients and both moments and writing them
// back, and, where a strategy computes in bf16, the updated parameters
// rounded to bf16 in the same pass (a separate copy would read the fp32
// parameters again). The operations are adamw_update's CPU loop's, element
// by element and in its order, written with the round-to-nearest
// intrinsics (__fmul_rn, __fadd_rn, ...), which nvcc never contracts into
// FMAs: the vector and the scalar path, and the CPU loop (compiled without
// contraction), give the same bits (OpsGpu.FusedAdamWMatchesTheCpuUpdate).
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

// torch.lerp's formula, exact at both ends (below 0.5, the CPU loop's m + w (g - m)).
__device__ inline float lerp(float self, float end, float weight) {
  return fabsf(weight) < 0.5f ? __fadd_rn(self, __fmul_rn(weight, __fsub_rn(end, self)))
                              : __fsub_rn(end, __fmul_rn(__fsub_rn(end, self), __fsub_rn(1.0f, weight)));
}

__device__ inline void adamw_element(float& p, float g, float& m, float& v, const AdamWScalars& s) {
  g = __fmul_rn(g, s.grad_scale);
  p = __fmul_rn(p, s.decay_factor);
  m = lerp(m, g, s.one_minus_beta1);
  v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
}

// Vector path: 4 elements per access (16 bytes of each fp32 buffer, 8 of bf16).
__global__ void adamw_kernel4(float4* p, const float4* g, float4* m, float4* v, __nv_bfloat162* out, int64_t packs,
                              AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    float4 P = p[i], M = m[i], V = v[i];
    const float4 G = g[i];
    adamw_element(P.x, G.x, M.x, V.x, s);
    adamw_element(P.y, G.y, M.y, V.y, s);
    adamw_element(P.z, G.z, M.z, V.z, s);
    adamw_element(P.w, G.w, M.w, V.w, s);
    p[i] = P;
    m[i] = M;
    v[i] = V;
    if (out) {
      out[2 * i] = __floats2bfloat162_rn(P.x, P.y);
      out[2 * i + 1] = __floats2bfloat162_rn(P.z, P.w);
    }
  }
}

__global__ void adamw_kernel1(float* p, const float* g, float* m, float* v, __nv_bfloat16* out, int64_t n,
                              AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    adamw_element(p[i], g[i], m[i], v[i], s);
    if (out) out[i] = __float2bfloat16(p[i]);
  }
}

// bf16 moments (adamw_step_bf16_state), rounded with the seeds of their streams.
__device__ inline void adamw_bf16_element(float& p, float g, __nv_bfloat16& m, __nv_bfloat16& v,
                                          unsigned long long index, const AdamWScalars& s, StreamSeeds sm,
                                          StreamSeeds sv) {
  float M = __bfloat162float(m), V = __bfloat162float(v);
  adamw_element(p, g, M, V, s);
  m = stochastic_bf16(M, rounding_noise(index, sm));
  v = stochastic_bf16(V, rounding_noise(index, sv));
}

// Vector path: 4 elements per access (16 bytes of the fp32 buffers, 8 of each bf16 one).
__global__ void adamw_bf16_state_kernel4(float4* p, const float4* g, uint2* m, uint2* v, uint2* out, int64_t packs,
                                         AdamWScalars s, StreamSeeds sm, StreamSeeds sv, int64_t first_index) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    float4 P = p[i];
    const float4 G = g[i];
    uint2 Mbits = m[i], Vbits = v[i];
    __nv_bfloat16* M = reinterpret_cast<__nv_bfloat16*>(&Mbits);
    __nv_bfloat16* V = reinterpret_cast<__nv_bfloat16*>(&Vbits);
    const unsigned long long index = static_cast<unsigned long long>(first_index + 4 * i);
    adamw_bf16_element(P.x, G.x, M[0], V[0], index, s, sm, sv);
    adamw_bf16_element(P.y, G.y, M[1], V[1], index + 1, s, sm, sv);
    adamw_bf16_element(P.z, G.z, M[2], V[2], index + 2, s, sm, sv);
    adamw_bf16_element(P.w, G.w, M[3], V[3], index + 3, s, sm, sv);
    p[i] = P;
    m[i] = Mbits;
    v[i] = Vbits;
    if (out) {
      uint2 O;
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&O);
      o[0] = __floats2bfloat162_rn(P.x, P.y);
      o[1] = __floats2bfloat162_rn(P.z, P.w);
      out[i] = O;
    }
  }
}

__global__ void adamw_bf16_state_kernel1(float* p, const float* g, __nv_bfloat16* m, __nv_bfloat16* v,
                                         __nv_bfloat16* out, int64_t n, AdamWScalars s, StreamSeeds sm, StreamSeeds sv,
                                         int64_t first_index) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    adamw_bf16_element(p[i], g[i], m[i], v[i], static_cast<unsigned long long>(first_index + i), s, sm, sv);
    if (out) out[i] = __float2bfloat16(p[i]);
  }
}

}  // namespace

void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, void* compute_bf16, int64_t n,
                const AdamWScalars& scalars, cudaStream_t stream) {
  auto* out = static_cast<__nv_bfloat16*>(compute_bf16);
  constexpr unsigned threads = 256;
  const bool vector = aligned(params, 16) && aligned(grads, 16) && aligned(exp_avg, 16) && aligned(exp_avg_sq, 16) &&
                      (out == nullptr || aligned(out, 8));
  const int64_t packs = vector ? n / 4 : 0;
  if (packs > 0) {
    adamw_kernel4<<<blocks_for(packs, threads), threads, 0, stream>>>(
        reinterpret_cast<float4*>(params), reinterpret_cast<const float4*>(grads), reinterpret_cast<float4*>(exp_avg),
        reinterpret_cast<float4*>(exp_avg_sq), reinterpret_cast<__nv_bfloat162*>(out), packs, scalars);
  }
  const int64_t done = packs * 4;
  if (done < n) {
    adamw_kernel1<<<blocks_for(n - done, threads), threads, 0, stream>>>(
        params + done, grads + done, exp_avg + done, exp_avg_sq + done, out ? out + done : nullptr, n - done, scalars);
  }
}

void adamw_step_bf16_state(float* params, const float* grads, void* exp_avg_bf16, void* exp_avg_sq_bf16,
                           void* compute_bf16, int64_t n, const AdamWScalars& scalars, uint64_t stream_m,
                           uint64_t stream_v, int64_t first_index, cudaStream_t stream) {
  auto* m = static_cast<__nv_bfloat16*>(exp_avg_bf16);
  auto* v = static_cast<__nv_bfloat16*>(exp_avg_sq_bf16);
  auto* out = static_cast<__nv_bfloat16*>(compute_bf16);
  const StreamSeeds sm = stream_seeds(stream_m), sv = stream_seeds(stream_v);
  constexpr unsigned threads = 256;
  const bool vector = aligned(params, 16) && aligned(grads, 16) && aligned(m, 8) && aligned(v, 8) &&
                      (out == nullptr || aligned(out, 8));
  const int64_t packs = vector ? n / 4 : 0;
  if (packs > 0) {
    adamw_bf16_state_kernel4<<<blocks_for(packs, threads), threads, 0, stream>>>(
        reinterpret_cast<float4*>(params), reinterpret_cast<const float4*>(grads), reinterpret_cast<uint2*>(m),
        reinterpret_cast<uint2*>(v), reinterpret_cast<uint2*>(out), packs, scalars, sm, sv, first_index);
  }
  const int64_t done = packs * 4;
  if (done < n) {
    adamw_bf16_state_kernel1<<<blocks_for(n - done, threads), threads, 0, stream>>>(
        params + done, grads + done, m + done, v + done, out ? out + done : nullptr, n - done, scalars, sm, sv,
        first_index + done);
  }
}

}  // namespace trainer::ops::kernels
