// bf16 optimizer state's stochastic rounding on CUDA (sharding/LowPrecisionState):
// one pass over the fp32 values. The CPU path builds the same hash from
// int64 tensor operations (about twenty passes over 8-byte temporaries);
// here each element's 16 random bits come from the same 31-bit mixes in
// 64-bit integers (KernelSupport.cuh's rounding_noise), so both give the
// same bits.
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;

__global__ void stochastic_round_kernel(const float* src, __nv_bfloat16* dst, int64_t n, StreamSeeds seeds,
                                        int64_t first_index) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = stochastic_bf16(src[i], rounding_noise(static_cast<unsigned long long>(first_index + i), seeds));
  }
}

}  // namespace

void stochastic_round_bf16(const float* src, void* dst, int64_t n, uint64_t stream_bits, int64_t first_index,
                           cudaStream_t stream) {
  if (n == 0) return;
  stochastic_round_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n,
                                                                            stream_seeds(stream_bits), first_index);
}

}  // namespace trainer::ops::kernels
