// FP8 linear layers' quantization (Linear.cpp): a bf16 tensor to E4M3 or
// E5M2 with one scale for the whole tensor, computed on the device from its
// largest magnitude (no host sync). Two passes over the bf16 values: the
// largest |x|, then the scaled cast, saturating at the format's largest
// finite value. The scale is a power of two, so scaling itself rounds
// nothing: only the cast to 3 (E4M3) or 2 (E5M2) mantissa bits does. The
// scaled GEMM's column-major operands come from a transposing cast (with a
// scale computed before, or from an amax pass, writing both layouts at once).
#include <algorithm>
#include <cstdint>

#include <cuda_fp8.h>

#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kAmaxBlocks = 2048;  // 132 SMs x 8 blocks of 256 threads, twice over
constexpr float kE4m3Max = 448.0f;
constexpr float kE5m2Max = 57344.0f;

// Eight bf16 values a thread when the tensor is 16-byte aligned and a multiple of 8 long.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};
struct alignas(8) Fp8x8 {
  __nv_fp8x2_storage_t v[4];
};

__global__ void amax_kernel(const __nv_bfloat16* x, int64_t n, bool vector, unsigned* amax_bits) {
  float mine = 0.0f;
  bool nan = false;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (vector) {
    const Bf16x8* x8 = reinterpret_cast<const Bf16x8*>(x);
    for (int64_t i = first; i < n / 8; i += stride) {
      const Bf16x8 chunk = x8[i];
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(chunk.v[j]);
        track(f.x, mine, nan);
        track(f.y, mine, nan);
      }
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      track(__bfloat162float(x[i]), mine, nan);
    }
  }
  block_amax(mine, nan, amax_bits);
}

// The power of two that brings amax to at most the format's largest value;
// 1 for an all-zero tensor, NaN when amax is not finite (the product is then
// NaN, and the run's non-finite check stops it instead of training on zeros).
__device__ inline float scale_of(unsigned amax_bits, float format_max) {
  const float amax = __uint_as_float(amax_bits);
  if (!isfinite(amax)) return __uint_as_float(0x7fc00000u);
  if (amax == 0.0f) return 1.0f;
  int exponent = 0;
  frexpf(format_max / amax, &exponent);  // ratio = m 2^exponent, m in [0.5, 1)
  return ldexpf(1.0f, exponent - 1);
}

__global__ void quantize_kernel(const __nv_bfloat16* x, int64_t n, bool vector, bool e5m2, const unsigned* amax_bits,
                                void* out, float* inverse_scale) {
  const float scale = scale_of(*amax_bits, e5m2 ? kE5m2Max : kE4m3Max);
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = 1.0f / scale;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (vector) {
    const Bf16x8* x8 = reinterpret_cast<const Bf16x8*>(x);
    Fp8x8* out8 = static_cast<Fp8x8*>(out);
    for (int64_t i = first; i < n / 8; i += stride) {
      const Bf16x8 chunk = x8[i];
      Fp8x8 q;
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(chunk.v[j]);
        q.v[j] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * scale, f.y * scale), __NV_SATFINITE, format);
      }
      out8[i] = q;
    }
  } else {
    __nv_fp8_storage_t* out1 = static_cast<__nv_fp8_storage_t*>(out);
    for (int64_t i = first; i < n; i += stride) {
      out1[i] = __nv_cvt_float_to_fp8(__bfloat162float(x[i]) * scale, __NV_SATFINITE, format);
    }
  }
}

// The transposing casts' scale: that of *amax_bits when given (block
// (0, 0)'s first thread then writes its inverse to *inverse_scale), else
// 1 / *inverse_scale.
__device__ inline float transposed_cast_scale(const unsigned* amax_bits, bool e5m2, float* inverse_scale) {
  if (amax_bits == nullptr) return 1.0f / *inverse_scale;
  const float scale = scale_of(*amax_bits, e5m2 ? kE5m2Max : kE4m3Max);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *inverse_scale = 1.0f / scale;
  return scale;
}

// E4M3 (or E5M2) of x * s for a [rows, cols] x, written transposed
// ([cols, rows]) into out_t and, when out_rows is not null, also as laid out
// into out_rows: one read of x for both. s is the scale of *amax_bits when
// given (the largest magnitude amax_kernel found; block (0, 0) then writes
// 1 / s to *inverse_scale), else 1 / *inverse_scale (a scale computed
// before: the same values, laid out for the scaled GEMM's other operand). A
// 32 x 32 tile at a time through shared memory, reads and writes along rows.
__global__ void quantize_transposed_kernel(const __nv_bfloat16* x, int64_t rows, int64_t cols, bool e5m2,
                                           const unsigned* amax_bits, float* inverse_scale, __nv_fp8_storage_t* out_t,
                                           __nv_fp8_storage_t* out_rows) {
  __shared__ float tile[32][33];
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const float scale = transposed_cast_scale(amax_bits, e5m2, inverse_scale);
  const int64_t c0 = blockIdx.x * int64_t(32), r0 = blockIdx.y * int64_t(32);
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = __bfloat162float(x[r * cols + c]) * scale;
      tile[i][threadIdx.x] = v;
      if (out_rows != nullptr) out_rows[r * cols + c] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format);
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out_t[c * rows + r] = __nv_cvt_float_to_fp8(tile[threadIdx.x][i], __NV_SATFINITE, format);
  }
}

// quantize_transposed_kernel for dimensions that are multiples of 8 with
// x 16-byte and the outputs 8-byte aligned: a tile of 64 rows x 128 columns
// a block of 256 threads. Each thread first loads four 16-byte chunks of
// eight bf16 values (all four in flight), casts them and keeps the FP8
// bytes in shared memory, rows 132 bytes (33 words) apart; then it reads a
// block of 8 rows x 4 columns as eight words, transposes it in registers
// and writes four 8-byte pieces of the transposed rows. A warp covers 4 row
// groups x 8 column groups, so its eight words of a read fall in 32
// different banks (row group g, column group c: bank 8 g + c + m).
constexpr int kTileRows = 64;
constexpr int kTileCols = 128;
constexpr int kTileStride = kTileCols + 4;  // bytes
constexpr int kChunksPerRow = kTileCols / 8;
constexpr int kLoadsPerThread = kTileRows * kChunksPerRow / 256;

// Bytes q of a, b, c, d (the rows of a 4 x 4 byte block) as one word: its transpose's row q.
__device__ inline void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t out[4]) {
  const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1, a2 b2 a3 b3
  const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
  out[0] = __byte_perm(ab_lo, cd_lo, 0x5410);  // a0 b0 c0 d0
  out[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
  out[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
  out[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

__global__ void __launch_bounds__(256)
    quantize_transposed_vector_kernel(const __nv_bfloat16* x, int64_t rows, int64_t cols, bool e5m2,
                                      const unsigned* amax_bits, float* inverse_scale, uint8_t* out_t,
                                      uint8_t* out_rows) {
  __shared__ alignas(16) uint8_t tile[kTileRows * kTileStride];
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const float scale = transposed_cast_scale(amax_bits, e5m2, inverse_scale);
  const int64_t c0 = blockIdx.x * int64_t(kTileCols), r0 = blockIdx.y * int64_t(kTileRows);
  // Thread t's chunks: rows t / 16 + 16 l of the tile, all at columns 8 (t % 16) .. 8 (t % 16) + 7.
  constexpr int kRowStep = 256 / kChunksPerRow;
  const int i0 = threadIdx.x / kChunksPerRow, j = threadIdx.x % kChunksPerRow * 8;
  const bool column_in = c0 + j < cols;
  const int64_t first = (r0 + i0) * cols + c0 + j, step = kRowStep * cols;
  Bf16x8 chunks[kLoadsPerThread];
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    if (column_in && r0 + i0 + kRowStep * l < rows) chunks[l] = *reinterpret_cast<const Bf16x8*>(x + first + l * step);
  }
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const int i = i0 + kRowStep * l;
    if (!column_in || r0 + i >= rows) continue;
    Fp8x8 q;
    for (int p = 0; p < 4; ++p) {
      const float2 f = __bfloat1622float2(chunks[l].v[p]);
      q.v[p] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * scale, f.y * scale), __NV_SATFINITE, format);
    }
    const uint2 bytes = *reinterpret_cast<const uint2*>(&q);
    uint32_t* t = reinterpret_cast<uint32_t*>(tile + i * kTileStride + j);
    t[0] = bytes.x;
    t[1] = bytes.y;
    if (out_rows != nullptr) *reinterpret_cast<uint2*>(out_rows + first + l * step) = bytes;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp % 2 * 4 + lane % 4;    // rows 8 group .. 8 group + 7 of the tile
  const int column4 = warp / 2 * 8 + lane / 4;  // columns 4 column4 .. 4 column4 + 3
  const int64_t r = r0 + 8 * group, c = c0 + 4 * column4;
  if (r >= rows || c >= cols) return;  // rows and cols are multiples of 8: a group is in whole or not at all
  uint32_t words[8];
  for (int m = 0; m < 8; ++m) {
    words[m] = *reinterpret_cast<const uint32_t*>(tile + (8 * group + m) * kTileStride + 4 * column4);
  }
  uint32_t lo[4], hi[4];
  transpose4x4(words[0], words[1], words[2], words[3], lo);
  transpose4x4(words[4], words[5], words[6], words[7], hi);
  for (int q = 0; q < 4; ++q) *reinterpret_cast<uint2*>(out_t + (c + q) * rows + r) = make_uint2(lo[q], hi[q]);
}

}  // namespace

bool fp8_quantize_transposed(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* amax,
                             float* inverse_scale, void* out_t, void* out_rows, cudaStream_t stream) {
  const int64_t tiles_y = (rows + 31) / 32, tiles_x = (cols + 31) / 32;
  if (tiles_y > 65535 || tiles_x > (int64_t(1) << 31) - 1) return false;
  if (rows == 0 || cols == 0) return true;
  const bool vector = rows % 8 == 0 && cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out_t) % 8 == 0 &&
                      (out_rows == nullptr || reinterpret_cast<uintptr_t>(out_rows) % 8 == 0);
  if (vector) {
    quantize_transposed_vector_kernel<<<dim3(unsigned((cols + kTileCols - 1) / kTileCols),
                                             unsigned((rows + kTileRows - 1) / kTileRows)),
                                        256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), rows, cols, e5m2, reinterpret_cast<const unsigned*>(amax), inverse_scale,
        static_cast<uint8_t*>(out_t), static_cast<uint8_t*>(out_rows));
    return true;
  }
  quantize_transposed_kernel<<<dim3(unsigned(tiles_x), unsigned(tiles_y)), dim3(32, 8), 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), rows, cols, e5m2, reinterpret_cast<const unsigned*>(amax), inverse_scale,
      static_cast<__nv_fp8_storage_t*>(out_t), static_cast<__nv_fp8_storage_t*>(out_rows));
  return true;
}

void fp8_amax(const void* x, int64_t n, float* amax, cudaStream_t stream) {
  const bool vector = n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  unsigned* amax_bits = reinterpret_cast<unsigned*>(amax);
  cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream);
  if (n > 0) {
    // A grid-stride pass over at most kAmaxBlocks blocks: each ends in an
    // update of one shared maximum, which many small blocks would queue on.
    const unsigned blocks = std::min(blocks_for(vector ? n / 8 : n, kThreads), kAmaxBlocks);
    amax_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, vector, amax_bits);
  }
}

void fp8_quantize(const void* x, int64_t n, bool e5m2, void* out, float* amax, bool amax_known, float* inverse_scale,
                  cudaStream_t stream) {
  const auto* in = static_cast<const __nv_bfloat16*>(x);
  const bool vector =
      n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  if (!amax_known) fp8_amax(x, n, amax, stream);
  quantize_kernel<<<blocks_for(vector ? n / 8 : n, kThreads), kThreads, 0, stream>>>(
      in, n, vector, e5m2, reinterpret_cast<const unsigned*>(amax), out, inverse_scale);
}

}  // namespace trainer::ops::kernels
