// What the FP8 casts share (Fp8.cu, and SwiGlu.cu's cast of its recomputed
// output): the formats' ranges, the power-of-two scale of an amax, and the
// transposing cast of a tile of 64 rows x 128 columns a block, whose values
// a loader computes (bf16 read as is, or SwiGLU's output of [gate | up]).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace trainer::ops::kernels {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kE5m2Max = 57344.0f;

// Eight bf16 values a thread when the tensor is 16-byte aligned and a multiple of 8 long.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};
struct alignas(8) Fp8x8 {
  __nv_fp8x2_storage_t v[4];
};

__device__ inline void unpack(const Bf16x8& chunk, float v[8]) {
  for (int p = 0; p < 4; ++p) {
    const float2 f = __bfloat1622float2(chunk.v[p]);
    v[2 * p] = f.x;
    v[2 * p + 1] = f.y;
  }
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

// The transposing casts' scale: that of *amax_bits when given (block
// (0, 0)'s first thread then writes its inverse to *inverse_scale), else
// 1 / *inverse_scale.
__device__ inline float transposed_cast_scale(const unsigned* amax_bits, bool e5m2, float* inverse_scale) {
  if (amax_bits == nullptr) return 1.0f / *inverse_scale;
  const float scale = scale_of(*amax_bits, e5m2 ? kE5m2Max : kE4m3Max);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *inverse_scale = 1.0f / scale;
  return scale;
}

// Bytes q of a, b, c, d (the rows of a 4 x 4 byte block) as one word: its transpose's row q.
__device__ inline void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t out[4]) {
  const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1, a2 b2 a3 b3
  const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
  out[0] = __byte_perm(ab_lo, cd_lo, 0x5410);  // a0 b0 c0 d0
  out[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
  out[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
  out[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// The transposing cast of one tile of 64 rows x 128 columns of a [rows,
// cols] tensor, rows and cols multiples of 8, by a block of kTileThreads:
// out_t ([cols, rows], 8-byte aligned) gets the tile transposed, and
// out_rows ([rows, cols], when not null) as laid out. The loader gives the
// values: Raw fetch(r, c) reads eight consecutive values' inputs at row r,
// columns c .. c + 7, and values(raw, r, c, v) makes them floats (once for
// each chunk in the tensor: a loader may also write what it derives from
// the same inputs there, or gather an amax). Each thread
// first fetches four such chunks (all four in flight), casts them and keeps
// the FP8 bytes in shared memory, rows 132 bytes (33 words) apart; then it
// reads a block of 8 rows x 4 columns as eight words, transposes it in
// registers and writes four 8-byte pieces of the transposed rows. A warp
// covers 4 row groups x 8 column groups, so its eight words of a read fall
// in 32 different banks (row group g, column group c: bank 8 g + c + m).
// Phases > 1 fetches and casts the four chunks in that many rounds: fewer
// registers where a loader's chunks are large, so more blocks fit an SM
// (SwiGLU's fused backward, three inputs a chunk: 80 -> 63 registers,
// 294.9 -> 283.1 us at 8192 x 11008 by bench/kernel_probe.cu on an H200;
// 261.6 us with its amax switch at compile time).
constexpr int kTileThreads = 256;
constexpr int kTileRows = 64;
constexpr int kTileCols = 128;
constexpr int kTileStride = kTileCols + 4;  // bytes
constexpr int kChunksPerRow = kTileCols / 8;
constexpr int kLoadsPerThread = kTileRows * kChunksPerRow / kTileThreads;

inline dim3 transposed_tile_grid(int64_t rows, int64_t cols) {
  return dim3(unsigned((cols + kTileCols - 1) / kTileCols), unsigned((rows + kTileRows - 1) / kTileRows));
}

// Whether cast_tile_transposed takes a [rows, cols] input at `input` (read
// 16 bytes at a time) written transposed to `out_t` (8 bytes at a time):
// rows and cols multiples of 8, the pointers so aligned, the grid in range.
inline bool transposed_tile_fits(int64_t rows, int64_t cols, const void* input, const void* out_t) {
  return rows % 8 == 0 && cols % 8 == 0 && reinterpret_cast<uintptr_t>(input) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out_t) % 8 == 0 && (rows + kTileRows - 1) / kTileRows <= 65535 &&
         (cols + kTileCols - 1) / kTileCols <= (int64_t(1) << 31) - 1;
}

template <int Phases = 1, typename Loader>
__device__ inline void cast_tile_transposed(Loader& loader, int64_t rows, int64_t cols, float scale,
                                            __nv_fp8_interpretation_t format, uint8_t* out_t, uint8_t* out_rows) {
  __shared__ alignas(16) uint8_t tile[kTileRows * kTileStride];
  const int64_t c0 = blockIdx.x * int64_t(kTileCols), r0 = blockIdx.y * int64_t(kTileRows);
  // Thread t's chunks: rows t / 16 + 16 l of the tile, all at columns 8 (t % 16) .. 8 (t % 16) + 7.
  constexpr int kRowStep = kTileThreads / kChunksPerRow;
  const int i0 = threadIdx.x / kChunksPerRow, j = threadIdx.x % kChunksPerRow * 8;
  const bool column_in = c0 + j < cols;
  constexpr int kPerPhase = kLoadsPerThread / Phases;
  static_assert(kPerPhase * Phases == kLoadsPerThread, "phases divide a thread's chunks");
#pragma unroll
  for (int phase = 0; phase < Phases; ++phase) {
    typename Loader::Raw chunks[kPerPhase];
#pragma unroll
    for (int l = 0; l < kPerPhase; ++l) {
      const int i = i0 + kRowStep * (phase * kPerPhase + l);
      if (column_in && r0 + i < rows) chunks[l] = loader.fetch(r0 + i, c0 + j);
    }
#pragma unroll
    for (int l = 0; l < kPerPhase; ++l) {
      const int i = i0 + kRowStep * (phase * kPerPhase + l);
      if (!column_in || r0 + i >= rows) continue;
      float v[8];
      loader.values(chunks[l], r0 + i, c0 + j, v);
      Fp8x8 q;
      for (int p = 0; p < 4; ++p) {
        q.v[p] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * p] * scale, v[2 * p + 1] * scale), __NV_SATFINITE, format);
      }
      const uint2 bytes = *reinterpret_cast<const uint2*>(&q);
      uint32_t* t = reinterpret_cast<uint32_t*>(tile + i * kTileStride + j);
      t[0] = bytes.x;
      t[1] = bytes.y;
      if (out_rows != nullptr) *reinterpret_cast<uint2*>(out_rows + (r0 + i) * cols + c0 + j) = bytes;
    }
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
}  // namespace trainer::ops::kernels
