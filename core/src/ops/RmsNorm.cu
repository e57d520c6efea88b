// RMSNorm's kernels for bf16 rows (RmsNorm.cpp): the forward (with the
// per-row reciprocal RMS kept for backward, and its output's amax for an
// FP8 cast), the backward (the input gradient, and the weight gradient as a
// deterministic two-stage column sum, added in fp32 into a bound buffer),
// and the norm's output cast to transposed E4M3 straight from the input.
// One thread holds one 8-column chunk of a row: widths up to 8 x 512.
#include <algorithm>
#include <cstdint>

#include "Fp8Tile.cuh"
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr int kMaxThreads = 512;
constexpr int64_t kMaxWidth = 8 * kMaxThreads;
// The backward's blocks at most: each adds a row of fp32 partial weight
// gradients for the second stage to sum. A function of the row count only,
// so the sums' order (and bits) never depend on the device.
constexpr int64_t kBackwardBlocks = 512;

// A block for a row of `width`: one thread per 8-column chunk, whole warps.
unsigned threads_for(int64_t width) { return static_cast<unsigned>((width / 8 + 31) / 32 * 32); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The norm's value as the forward stores it: x r g in fp32, rounded to bf16
// once. The FP8 cast computes it again with this same function.
__device__ inline __nv_bfloat16 rms_norm_value(float x, float r, float g) { return __float2bfloat16(x * r * g); }

// The sum of every thread's `v` over the block, in a fixed order (the same
// bits every run: lane 0's shuffle sum of each warp, then the warps in
// order); every thread gets it. At most kMaxThreads threads, whole warps.
__device__ inline float block_sum(float v) {
  __shared__ float partial[kMaxThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partial[w];
  __syncthreads();  // `partial` is written again by the next call
  return total;
}

__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_forward_kernel(const __nv_bfloat16* x, const __nv_bfloat16* gamma, int64_t width, float eps,
                            __nv_bfloat16* y, float* rstd, unsigned* amax_bits) {
  const int64_t row = blockIdx.x;
  const int64_t i = threadIdx.x;  // this thread's chunk
  const bool mine = i < width / 8;
  Bf16x8 chunk;
  float v[8] = {};
  if (mine) {
    chunk = reinterpret_cast<const Bf16x8*>(x + row * width)[i];
    unpack(chunk, v);
  }
  float squares = 0.0f;
  for (int k = 0; k < 8; ++k) squares += v[k] * v[k];
  const float r = rsqrtf(block_sum(squares) / float(width) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
  float largest = 0.0f;
  bool nan = false;
  if (mine) {
    float g[8];
    unpack(reinterpret_cast<const Bf16x8*>(gamma)[i], g);
    Bf16x8 out;
    for (int p = 0; p < 4; ++p) {
      out.v[p] =
          __halves2bfloat162(rms_norm_value(v[2 * p], r, g[2 * p]), rms_norm_value(v[2 * p + 1], r, g[2 * p + 1]));
      const float2 stored = __bfloat1622float2(out.v[p]);
      track(stored.x, largest, nan);
      track(stored.y, largest, nan);
    }
    reinterpret_cast<Bf16x8*>(y + row * width)[i] = out;
  }
  if (amax_bits != nullptr) block_amax(largest, nan, amax_bits);
}

// Rows [blockIdx.x rows_per_block, + rows_per_block) of the backward:
// dx = r (dy g - x^ mean(dy g x^)) with x^ = x r, and this block's partial
// weight gradient sum(dy x^) over its rows into partial[blockIdx.x]. The
// next row's chunks are loaded while the current row is reduced.
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_backward_kernel(const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* gamma,
                             const float* rstd, int64_t rows, int64_t width, int64_t rows_per_block, __nv_bfloat16* dx,
                             float* partial) {
  const int64_t vectors = width / 8, i = threadIdx.x;
  const bool mine = i < vectors;
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t end = first + rows_per_block < rows ? first + rows_per_block : rows;
  const Bf16x8* x8 = reinterpret_cast<const Bf16x8*>(x);
  const Bf16x8* dy8 = reinterpret_cast<const Bf16x8*>(dy);
  float g[8] = {}, dg[8] = {};
  if (mine) unpack(reinterpret_cast<const Bf16x8*>(gamma)[i], g);
  Bf16x8 x_now{}, dy_now{};
  if (mine && first < end) {
    x_now = x8[first * vectors + i];
    dy_now = dy8[first * vectors + i];
  }
  for (int64_t row = first; row < end; ++row) {
    Bf16x8 x_next{}, dy_next{};
    if (mine && row + 1 < end) {
      x_next = x8[(row + 1) * vectors + i];
      dy_next = dy8[(row + 1) * vectors + i];
    }
    const float r = rstd[row];
    float xs[8] = {}, ds[8] = {}, xh[8], dh[8];
    if (mine) {
      unpack(x_now, xs);
      unpack(dy_now, ds);
    }
    float dot = 0.0f;
    for (int k = 0; k < 8; ++k) {
      xh[k] = xs[k] * r;
      dh[k] = ds[k] * g[k];
      dot += dh[k] * xh[k];
    }
    const float mean = block_sum(dot) / float(width);
    if (mine) {
      Bf16x8 out;
      for (int p = 0; p < 4; ++p) {
        out.v[p] =
            __floats2bfloat162_rn(r * (dh[2 * p] - xh[2 * p] * mean), r * (dh[2 * p + 1] - xh[2 * p + 1] * mean));
      }
      reinterpret_cast<Bf16x8*>(dx)[row * vectors + i] = out;
      for (int k = 0; k < 8; ++k) dg[k] += ds[k] * xh[k];
    }
    x_now = x_next;
    dy_now = dy_next;
  }
  if (mine) {
    float4* p = reinterpret_cast<float4*>(partial + blockIdx.x * width + 8 * i);
    p[0] = make_float4(dg[0], dg[1], dg[2], dg[3]);
    p[1] = make_float4(dg[4], dg[5], dg[6], dg[7]);
  }
}

// The second stage: column c's weight gradient is the sum of the blocks'
// partials, threadIdx.y's share (blocks y, y + 8, ...) first, then the
// eight shares in order; added into `into` (fp32) when not null, else
// written to `out` (bf16).
__global__ void rms_norm_weight_gradient_kernel(const float* partial, int64_t blocks, int64_t width, float* into,
                                                __nv_bfloat16* out) {
  __shared__ float shares[8][33];
  const int64_t c = blockIdx.x * int64_t(32) + threadIdx.x;
  float sum = 0.0f;
  if (c < width) {
    for (int64_t b = threadIdx.y; b < blocks; b += 8) sum += partial[b * width + c];
  }
  shares[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= width) return;
  float total = 0.0f;
  for (int s = 0; s < 8; ++s) total += shares[s][threadIdx.x];
  if (into != nullptr) {
    into[c] += total;
  } else {
    out[c] = __float2bfloat16(total);
  }
}

// The norm's bf16 output for the FP8 transposing cast (Fp8Tile.cuh): eight
// values from an input chunk, the row's reciprocal RMS and the weight, as
// the forward stores them.
struct NormChunks {
  const __nv_bfloat16* x;
  const __nv_bfloat16* gamma;
  const float* rstd;
  int64_t width;
  struct Raw {
    Bf16x8 x, g;
    float r;
  };
  __device__ Raw fetch(int64_t r, int64_t c) const {
    return Raw{*reinterpret_cast<const Bf16x8*>(x + r * width + c), *reinterpret_cast<const Bf16x8*>(gamma + c),
               rstd[r]};
  }
  __device__ void values(const Raw& raw, float v[8]) const {
    float xs[8], gs[8];
    unpack(raw.x, xs);
    unpack(raw.g, gs);
    for (int k = 0; k < 8; ++k) v[k] = __bfloat162float(rms_norm_value(xs[k], raw.r, gs[k]));
  }
};

__global__ void __launch_bounds__(kTileThreads)
    rms_norm_fp8_transposed_kernel(const __nv_bfloat16* x, const __nv_bfloat16* gamma, const float* rstd, int64_t rows,
                                   int64_t width, const float* inverse_scale, uint8_t* out_t) {
  const float scale = 1.0f / *inverse_scale;
  cast_tile_transposed(NormChunks{x, gamma, rstd, width}, rows, width, scale, __NV_E4M3, out_t, nullptr);
}

}  // namespace

bool rms_norm_fits(int64_t width) { return width > 0 && width % 8 == 0 && width <= kMaxWidth; }

int64_t rms_norm_backward_scratch(int64_t rows, int64_t width) {
  const int64_t per_block = (rows + kBackwardBlocks - 1) / kBackwardBlocks;
  return per_block > 0 ? (rows + per_block - 1) / per_block * width : 0;
}

bool rms_norm_forward(const void* x, const void* gamma, int64_t rows, int64_t width, float eps, void* y, float* rstd,
                      float* amax, cudaStream_t stream) {
  if (!rms_norm_fits(width) || !aligned(x, 16) || !aligned(gamma, 16) || !aligned(y, 16) ||
      rows > (int64_t(1) << 31) - 1) {
    return false;
  }
  unsigned* amax_bits = reinterpret_cast<unsigned*>(amax);
  if (amax_bits != nullptr) cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream);
  if (rows == 0) return true;
  rms_norm_forward_kernel<<<static_cast<unsigned>(rows), threads_for(width), 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(gamma), width, eps,
      static_cast<__nv_bfloat16*>(y), rstd, amax_bits);
  return true;
}

bool rms_norm_backward(const void* dy, const void* x, const void* gamma, const float* rstd, int64_t rows, int64_t width,
                       void* dx, float* scratch, float* into, void* d_gamma, cudaStream_t stream) {
  if (!rms_norm_fits(width) || !aligned(dy, 16) || !aligned(x, 16) || !aligned(gamma, 16) || !aligned(dx, 16) ||
      !aligned(scratch, 16)) {
    return false;
  }
  if (rows == 0) {
    if (into == nullptr) cudaMemsetAsync(d_gamma, 0, width * sizeof(__nv_bfloat16), stream);
    return true;
  }
  const int64_t per_block = (rows + kBackwardBlocks - 1) / kBackwardBlocks;
  const int64_t blocks = (rows + per_block - 1) / per_block;
  rms_norm_backward_kernel<<<static_cast<unsigned>(blocks), threads_for(width), 0, stream>>>(
      static_cast<const __nv_bfloat16*>(dy), static_cast<const __nv_bfloat16*>(x),
      static_cast<const __nv_bfloat16*>(gamma), rstd, rows, width, per_block, static_cast<__nv_bfloat16*>(dx), scratch);
  rms_norm_weight_gradient_kernel<<<static_cast<unsigned>((width + 31) / 32), dim3(32, 8), 0, stream>>>(
      scratch, blocks, width, into, static_cast<__nv_bfloat16*>(d_gamma));
  return true;
}

bool rms_norm_fp8_transposed(const void* x, const void* gamma, const float* rstd, int64_t rows, int64_t width,
                             const float* inverse_scale, void* out_t, cudaStream_t stream) {
  const bool fits = rows % 8 == 0 && width % 8 == 0 && aligned(x, 16) && aligned(gamma, 16) && aligned(out_t, 8) &&
                    (rows + kTileRows - 1) / kTileRows <= 65535 &&
                    (width + kTileCols - 1) / kTileCols <= (int64_t(1) << 31) - 1;
  if (!fits) return false;
  if (rows == 0 || width == 0) return true;
  rms_norm_fp8_transposed_kernel<<<transposed_tile_grid(rows, width), kTileThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(gamma), rstd, rows, width, inverse_scale,
      static_cast<uint8_t*>(out_t));
  return true;
}

}  // namespace trainer::ops::kernels
