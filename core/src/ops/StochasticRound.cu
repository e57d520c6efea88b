// bf16 optimizer state's stochastic rounding on CUDA (sharding/LowPrecisionState):
// one pass over the fp32 values. The CPU path builds the same hash from
// int64 tensor operations (about twenty passes over 8-byte temporaries);
// here each element's 16 random bits come from the same 31-bit mixes in
// 64-bit integers, so both give the same bits.
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned long long kLow31 = 0x7fffffffull;

// Every product stays below 2^62 (31-bit operand times a 31-bit constant).
__device__ inline unsigned long long mix31(unsigned long long x) {
  x = (x * 0x2c1b3c6dull) & kLow31;
  x ^= x >> 12;
  x = (x * 0x297a2d39ull) & kLow31;
  return x ^ (x >> 15);
}

__global__ void stochastic_round_kernel(const float* src, __nv_bfloat16* dst, int64_t n, unsigned long long seed_low,
                                        unsigned long long seed_high, int64_t first_index) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const unsigned long long index = static_cast<unsigned long long>(first_index + i);
    unsigned long long x = mix31((index & kLow31) ^ seed_low);
    x = mix31(x ^ (index >> 31) ^ seed_high);
    const unsigned noise = static_cast<unsigned>(x & 0xffffu);
    const unsigned bits = __float_as_uint(src[i]);
    const unsigned magnitude = bits & 0x7fffffffu;
    __nv_bfloat16_raw out;
    if (magnitude > 0x7f800000u) {
      out.x = 0x7fc0;  // NaN stays NaN (which NaN is the CPU conversion's own: 0x7fc0 or 0xffff)
    } else {
      // Below 2^31 + 2^16: no carry into the sign; +inf (0x7f80....) stays inf.
      const unsigned rounded = (magnitude + noise) & 0x7fff0000u;
      out.x = static_cast<unsigned short>(((bits & 0x80000000u) | rounded) >> 16);
    }
    dst[i] = out;
  }
}

}  // namespace

void stochastic_round_bf16(const float* src, void* dst, int64_t n, uint64_t stream_bits, int64_t first_index,
                           cudaStream_t stream) {
  if (n == 0) return;
  stochastic_round_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      src, static_cast<__nv_bfloat16*>(dst), n, stream_bits & kLow31, (stream_bits >> 31) & kLow31, first_index);
}

}  // namespace trainer::ops::kernels
