// RMSNorm's kernels for bf16 rows (RmsNorm.cpp): the forward (with the
// per-row reciprocal RMS kept for backward, and its output's amax for an
// FP8 cast), the backward (the input gradient, and the weight gradient as a
// deterministic two-stage column sum, added in fp32 into a bound buffer),
// and the norm's output cast to transposed E4M3 straight from the input.
// Rows up to 8 x 512 wide (the backward's block has a thread per 8-column
// chunk; the forward's warp holds up to 16 chunks a lane).
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

// The norm's value as the forward stores it: x r g in fp32, rounded to bf16
// once. The FP8 cast computes it again with this same function.
__device__ inline __nv_bfloat16 rms_norm_value(float x, float r, float g) { return __float2bfloat16(x * r * g); }

// A warp a row, kRowsPerBlock rows a block: lane l holds chunks l, l + 32,
// ... (C of them) of its row; the sum of squares is the lane's own, then
// the warp's butterfly (every lane gets the same bits).
constexpr int kRowsPerBlock = 4;

template <int C>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    rms_norm_forward_kernel(const __nv_bfloat16* x, const __nv_bfloat16* gamma, int64_t rows, int64_t width, float eps,
                            __nv_bfloat16* y, float* rstd, unsigned* amax_bits) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, vectors = static_cast<int>(width / 8);
  float largest = 0.0f;
  bool nan = false;
  if (row < rows) {
    const Bf16x8* in = reinterpret_cast<const Bf16x8*>(x + row * width);
    Bf16x8 chunk[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (lane + 32 * c < vectors) chunk[c] = in[lane + 32 * c];
    }
    float squares = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (lane + 32 * c >= vectors) continue;
      float v[8];
      unpack(chunk[c], v);
      for (int k = 0; k < 8; ++k) squares += v[k] * v[k];
    }
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    const float r = rsqrtf(squares / float(width) + eps);
    if (rstd != nullptr && lane == 0) rstd[row] = r;
    Bf16x8* out = reinterpret_cast<Bf16x8*>(y + row * width);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int i = lane + 32 * c;
      if (i >= vectors) continue;
      float v[8], g[8];
      unpack(chunk[c], v);
      unpack(reinterpret_cast<const Bf16x8*>(gamma)[i], g);
      Bf16x8 o;
      for (int p = 0; p < 4; ++p) {
        o.v[p] =
            __halves2bfloat162(rms_norm_value(v[2 * p], r, g[2 * p]), rms_norm_value(v[2 * p + 1], r, g[2 * p + 1]));
        const float2 stored = __bfloat1622float2(o.v[p]);
        track(stored.x, largest, nan);
        track(stored.y, largest, nan);
      }
      out[i] = o;
    }
  }
  if (amax_bits != nullptr) block_amax(largest, nan, amax_bits);
}

// The sums over the block of each thread's v[0 .. R-1] in a fixed order
// (the same bits every run: lane 0's butterfly sum of each warp, then the
// warps in order); every thread gets them. Whole warps, at most kMaxThreads.
template <int R>
__device__ inline void block_sums(float (&v)[R]) {
  __shared__ float partial[R][kMaxThreads / 32];
  for (int j = 0; j < R; ++j) {
    for (int offset = 16; offset > 0; offset /= 2) v[j] += __shfl_xor_sync(0xffffffffu, v[j], offset);
    if (threadIdx.x % 32 == 0) partial[j][threadIdx.x / 32] = v[j];
  }
  __syncthreads();
  for (int j = 0; j < R; ++j) {
    float total = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partial[j][w];
    v[j] = total;
  }
  __syncthreads();  // `partial` is written again by the next call
}

// Rows [blockIdx.x rows_per_block, + rows_per_block) of the backward, R at
// a time (their loads in flight together, one reduction for all R):
// dx = r (dy g - x^ mean(dy g x^)) with x^ = x r, and this block's partial
// weight gradient sum(dy x^) over its rows, in row order, into
// partial[blockIdx.x]. One thread per 8-column chunk.
template <int R>
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
  for (int64_t row = first; row < end; row += R) {
    Bf16x8 xc[R], dc[R];
    float r[R], dot[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      xc[j] = Bf16x8{};
      dc[j] = Bf16x8{};
      if (mine && row + j < end) {
        xc[j] = x8[(row + j) * vectors + i];
        dc[j] = dy8[(row + j) * vectors + i];
      }
      r[j] = row + j < end ? rstd[row + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float xs[8], ds[8];
      unpack(xc[j], xs);
      unpack(dc[j], ds);
      dot[j] = 0.0f;
      for (int k = 0; k < 8; ++k) dot[j] += (ds[k] * g[k]) * (xs[k] * r[j]);
    }
    block_sums<R>(dot);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (!mine || row + j >= end) continue;
      const float mean = dot[j] / float(width);
      float xs[8], ds[8];
      unpack(xc[j], xs);
      unpack(dc[j], ds);
      Bf16x8 out;
      for (int p = 0; p < 4; ++p) {
        const float xh0 = xs[2 * p] * r[j], xh1 = xs[2 * p + 1] * r[j];
        out.v[p] = __floats2bfloat162_rn(r[j] * (ds[2 * p] * g[2 * p] - xh0 * mean),
                                         r[j] * (ds[2 * p + 1] * g[2 * p + 1] - xh1 * mean));
        dg[2 * p] += ds[2 * p] * xh0;
        dg[2 * p + 1] += ds[2 * p + 1] * xh1;
      }
      reinterpret_cast<Bf16x8*>(dx)[(row + j) * vectors + i] = out;
    }
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
  __device__ void values(const Raw& raw, int64_t, int64_t, float v[8]) const {
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
  NormChunks loader{x, gamma, rstd, width};
  cast_tile_transposed(loader, rows, width, scale, __NV_E4M3, out_t, nullptr);
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
  const int64_t chunks = (width / 8 + 31) / 32;  // a lane's
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(gamma), rows, width, eps,
        static_cast<__nv_bfloat16*>(y), rstd, amax_bits);
  };
  if (chunks <= 1) {
    launch(rms_norm_forward_kernel<1>);
  } else if (chunks <= 2) {
    launch(rms_norm_forward_kernel<2>);
  } else if (chunks <= 4) {
    launch(rms_norm_forward_kernel<4>);
  } else if (chunks <= 8) {
    launch(rms_norm_forward_kernel<8>);
  } else {
    launch(rms_norm_forward_kernel<16>);
  }
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
  // Four rows at a time where a row is at most 1024 wide (few threads a
  // block), else two: the faster of the two at 896 and 2048 on an H200.
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(blocks), threads_for(width), 0, stream>>>(
        static_cast<const __nv_bfloat16*>(dy), static_cast<const __nv_bfloat16*>(x),
        static_cast<const __nv_bfloat16*>(gamma), rstd, rows, width, per_block, static_cast<__nv_bfloat16*>(dx),
        scratch);
  };
  if (width <= 1024) {
    launch(rms_norm_backward_kernel<4>);
  } else {
    launch(rms_norm_backward_kernel<2>);
  }
  rms_norm_weight_gradient_kernel<<<static_cast<unsigned>((width + 31) / 32), dim3(32, 8), 0, stream>>>(
      scratch, blocks, width, into, static_cast<__nv_bfloat16*>(d_gamma));
  return true;
}

bool rms_norm_fp8_transposed(const void* x, const void* gamma, const float* rstd, int64_t rows, int64_t width,
                             const float* inverse_scale, void* out_t, cudaStream_t stream) {
  if (!transposed_tile_fits(rows, width, x, out_t) || !aligned(gamma, 16)) return false;
  if (rows == 0 || width == 0) return true;
  rms_norm_fp8_transposed_kernel<<<transposed_tile_grid(rows, width), kTileThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(gamma), rstd, rows, width, inverse_scale,
      static_cast<uint8_t*>(out_t));
  return true;
}

}  // namespace trainer::ops::kernels
