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

#include "Fp8Tile.cuh"
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kAmaxBlocks = 2048;  // 132 SMs x 8 blocks of 256 threads, twice over

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

// out[i] = E4M3 (or E5M2) of x[i] * scale, saturating, for i = first,
// first + stride, ... below n; eight at a time with `vector` (x 16-byte and
// out 8-byte aligned, n a multiple of 8).
__device__ inline void cast_scaled(const __nv_bfloat16* x, int64_t n, bool vector, float scale,
                                   __nv_fp8_interpretation_t format, void* out, int64_t first, int64_t stride) {
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

__global__ void quantize_kernel(const __nv_bfloat16* x, int64_t n, bool vector, bool e5m2, const unsigned* amax_bits,
                                void* out, float* inverse_scale) {
  const float scale = scale_of(*amax_bits, e5m2 ? kE5m2Max : kE4m3Max);
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = 1.0f / scale;
  cast_scaled(x, n, vector, scale, format, out, blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
              int64_t(gridDim.x) * blockDim.x);
}

// E4M3 (or E5M2) of each row of a [rows, cols] x times that row's own
// scale s_r (scale_of its largest magnitude), saturating, laid out as x;
// inverse_scales[r] = 1 / s_r. One block a row: a pass for the row's amax,
// then the cast, which reads the row again (from cache).
template <bool Vector>
__global__ void quantize_rows_kernel(const __nv_bfloat16* x, int64_t cols, bool e5m2, void* out,
                                     float* inverse_scales) {
  __shared__ unsigned row_amax_bits;
  if (threadIdx.x == 0) row_amax_bits = 0;
  __syncthreads();
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* in = x + row * cols;
  float mine = 0.0f;
  bool nan = false;
  if (Vector) {
    const Bf16x8* in8 = reinterpret_cast<const Bf16x8*>(in);
    for (int64_t i = threadIdx.x; i < cols / 8; i += blockDim.x) {
      float v[8];
      unpack(in8[i], v);
      for (int j = 0; j < 8; ++j) track(v[j], mine, nan);
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) track(__bfloat162float(in[i]), mine, nan);
  }
  block_amax(mine, nan, &row_amax_bits);
  __syncthreads();
  const float scale = scale_of(row_amax_bits, e5m2 ? kE5m2Max : kE4m3Max);
  if (threadIdx.x == 0) inverse_scales[row] = 1.0f / scale;
  cast_scaled(in, cols, Vector, scale, e5m2 ? __NV_E5M2 : __NV_E4M3, static_cast<uint8_t*>(out) + row * cols,
              threadIdx.x, blockDim.x);
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
// x 16-byte and the outputs 8-byte aligned (Fp8Tile.cuh).
struct Bf16Chunks {
  const __nv_bfloat16* x;
  int64_t cols;
  using Raw = Bf16x8;
  __device__ Raw fetch(int64_t r, int64_t c) const { return *reinterpret_cast<const Bf16x8*>(x + r * cols + c); }
  __device__ void values(const Raw& raw, int64_t, int64_t, float v[8]) const { unpack(raw, v); }
};

__global__ void __launch_bounds__(kTileThreads)
    quantize_transposed_vector_kernel(const __nv_bfloat16* x, int64_t rows, int64_t cols, bool e5m2,
                                      const unsigned* amax_bits, float* inverse_scale, uint8_t* out_t,
                                      uint8_t* out_rows) {
  const float scale = transposed_cast_scale(amax_bits, e5m2, inverse_scale);
  Bf16Chunks loader{x, cols};
  cast_tile_transposed(loader, rows, cols, scale, e5m2 ? __NV_E5M2 : __NV_E4M3, out_t, out_rows);
}

}  // namespace

bool transposed_cast_fits(int64_t rows, int64_t cols, const void* input, const void* out_t) {
  return transposed_tile_fits(rows, cols, input, out_t);
}

bool fp8_quantize_transposed(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* amax,
                             float* inverse_scale, void* out_t, void* out_rows, cudaStream_t stream) {
  const int64_t tiles_y = (rows + 31) / 32, tiles_x = (cols + 31) / 32;
  if (tiles_y > 65535 || tiles_x > (int64_t(1) << 31) - 1) return false;
  if (rows == 0 || cols == 0) return true;
  const bool vector = transposed_tile_fits(rows, cols, x, out_t) && (out_rows == nullptr || aligned(out_rows, 8));
  if (vector) {
    quantize_transposed_vector_kernel<<<transposed_tile_grid(rows, cols), kTileThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), rows, cols, e5m2, reinterpret_cast<const unsigned*>(amax), inverse_scale,
        static_cast<uint8_t*>(out_t), static_cast<uint8_t*>(out_rows));
    return true;
  }
  quantize_transposed_kernel<<<dim3(unsigned(tiles_x), unsigned(tiles_y)), dim3(32, 8), 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), rows, cols, e5m2, reinterpret_cast<const unsigned*>(amax), inverse_scale,
      static_cast<__nv_fp8_storage_t*>(out_t), static_cast<__nv_fp8_storage_t*>(out_rows));
  return true;
}

bool fp8_quantize_rows(const void* x, int64_t rows, int64_t cols, bool e5m2, void* out, float* inverse_scales,
                       cudaStream_t stream) {
  if (rows > (int64_t(1) << 31) - 1) return false;
  if (rows == 0) return true;
  const bool vector = cols % 8 == 0 && aligned(x, 16) && aligned(out, 8);
  // A warp at least, up to 256 threads: as many as the row has items.
  const int64_t items = vector ? cols / 8 : cols;
  const unsigned threads =
      static_cast<unsigned>(std::min<int64_t>(kThreads, std::max<int64_t>(32, (items + 31) / 32 * 32)));
  const auto* in = static_cast<const __nv_bfloat16*>(x);
  if (vector) {
    quantize_rows_kernel<true><<<unsigned(rows), threads, 0, stream>>>(in, cols, e5m2, out, inverse_scales);
  } else {
    quantize_rows_kernel<false><<<unsigned(rows), threads, 0, stream>>>(in, cols, e5m2, out, inverse_scales);
  }
  return true;
}

void fp8_amax(const void* x, int64_t n, float* amax, cudaStream_t stream) {
  const bool vector = n % 8 == 0 && aligned(x, 16);
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
  const bool vector = n % 8 == 0 && aligned(x, 16) && aligned(out, 8);
  if (!amax_known) fp8_amax(x, n, amax, stream);
  quantize_kernel<<<blocks_for(vector ? n / 8 : n, kThreads), kThreads, 0, stream>>>(
      in, n, vector, e5m2, reinterpret_cast<const unsigned*>(amax), out, inverse_scale);
}

}  // namespace trainer::ops::kernels
