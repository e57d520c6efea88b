// CUDA kernels of swiglu (SwiGlu.cpp has the CPU path and the autograd
// function). Forward reads [gate | up] once and writes silu(gate) * up;
// backward reads the saved input and the output gradient once and writes
// both input gradients: 3 + 3 element passes instead of the composite's
// silu, mul, and their backward (about 10 passes and two saved temporaries).
//
//   y = g s(g) u,  s = sigmoid
//   dy/dg = u s(g) (1 + g (1 - s(g))),  dy/du = g s(g)
#include <algorithm>

#include "Fp8Tile.cuh"
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

template <typename A>
__device__ inline A sigmoid(A x) {
  return A(1) / (A(1) + exp(-x));
}

// The forward's value, in the arithmetic type; every kernel that writes it
// computes it here, so that the values agree to the bit.
template <typename A>
__device__ inline A swiglu_value(A g, A u) {
  return g * sigmoid(g) * u;
}

// The forward's bf16 value as stored, read back as a float: what the
// transposing casts read where swiglu_forward_kernel's output would be.
__device__ inline float stored_swiglu_value(float g, float u) {
  return __bfloat162float(__float2bfloat16(swiglu_value(g, u)));
}

// The backward's values, stored: every kernel that writes them computes
// them here, so that they agree to the bit.
template <typename A, typename T>
__device__ inline void swiglu_gradients(A g, A u, A d, T* d_gate, T* d_up) {
  const A s = sigmoid(g);
  store(d_gate, d * u * s * (A(1) + g * (A(1) - s)));
  store(d_up, d * g * s);
}

// N consecutive elements moved as one 16-byte access (N = 1: the scalar
// path for widths or addresses that do not allow it).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Blocks tile a row's packs along x and walk the rows along y, so a thread
// finds its row and column without dividing (a 64-bit division per element
// cost more than the arithmetic).
template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* gate_up, T* out, int64_t rows, int64_t width, unsigned* amax_bits) {
  using A = typename Acc<T>::type;
  using P = Pack<T, N>;
  const int64_t packs = width / N;
  float mine = 0.0f;
  bool nan = false;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const P* gate = reinterpret_cast<const P*>(gate_up + row * 2 * width);
    const P* up = reinterpret_cast<const P*>(gate_up + row * 2 * width + width);
    P* y = reinterpret_cast<P*>(out + row * width);
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
      const P g = gate[i], u = up[i];
      P r;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const A gj = load(&g.v[j]);
        store(&r.v[j], swiglu_value(gj, load(&u.v[j])));
        // The value as stored (rounded), as fp8_amax will read it.
        if (amax_bits != nullptr) track(load(&r.v[j]), mine, nan);
      }
      y[i] = r;
    }
  }
  if (amax_bits != nullptr) block_amax(mine, nan, amax_bits);
}

// Value: also writes the forward's output into `out` (as
// swiglu_forward_kernel stores it), for a backward that needs it next (the
// down projection's weight gradient) instead of a second read of gate_up.
template <typename T, int N, bool Value>
__global__ void swiglu_backward_kernel(const T* gate_up, const T* d_out, T* d_gate_up, T* out, int64_t rows,
                                       int64_t width, unsigned* amax_bits) {
  using A = typename Acc<T>::type;
  using P = Pack<T, N>;
  const int64_t packs = width / N;
  float mine = 0.0f;
  bool nan = false;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const P* gate = reinterpret_cast<const P*>(gate_up + row * 2 * width);
    const P* up = reinterpret_cast<const P*>(gate_up + row * 2 * width + width);
    const P* dy = reinterpret_cast<const P*>(d_out + row * width);
    P* d_gate = reinterpret_cast<P*>(d_gate_up + row * 2 * width);
    P* d_up = reinterpret_cast<P*>(d_gate_up + row * 2 * width + width);
    P* y = Value ? reinterpret_cast<P*>(out + row * width) : nullptr;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
      const P g = gate[i], u = up[i], d = dy[i];
      P dg, du, r;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        swiglu_gradients(load(&g.v[j]), load(&u.v[j]), load(&d.v[j]), &dg.v[j], &du.v[j]);
        if (Value) store(&r.v[j], swiglu_value(load(&g.v[j]), load(&u.v[j])));
        if (amax_bits != nullptr) {
          track(load(&dg.v[j]), mine, nan);
          track(load(&du.v[j]), mine, nan);
        }
      }
      d_gate[i] = dg;
      d_up[i] = du;
      if (Value) y[i] = r;
    }
  }
  if (amax_bits != nullptr) block_amax(mine, nan, amax_bits);
}

// SwiGLU's bf16 output for the FP8 transposing cast (Fp8Tile.cuh): eight
// values from a gate and an up chunk, each rounded to bf16 as
// swiglu_forward_kernel stores it.
struct SwiGluChunks {
  const __nv_bfloat16* gate_up;
  int64_t width;
  struct Raw {
    Bf16x8 gate, up;
  };
  __device__ Raw fetch(int64_t r, int64_t c) const {
    const __nv_bfloat16* row = gate_up + r * 2 * width;
    return Raw{*reinterpret_cast<const Bf16x8*>(row + c), *reinterpret_cast<const Bf16x8*>(row + width + c)};
  }
  __device__ void values(const Raw& raw, int64_t, int64_t, float v[8]) const {
    float g[8], u[8];
    unpack(raw.gate, g);
    unpack(raw.up, u);
    for (int k = 0; k < 8; ++k) v[k] = stored_swiglu_value(g[k], u[k]);
  }
};

__global__ void __launch_bounds__(kTileThreads)
    swiglu_fp8_transposed_kernel(const __nv_bfloat16* gate_up, int64_t rows, int64_t width, const float* inverse_scale,
                                 uint8_t* out_t) {
  const float scale = 1.0f / *inverse_scale;
  SwiGluChunks loader{gate_up, width};
  cast_tile_transposed(loader, rows, width, scale, __NV_E4M3, out_t, nullptr);
}

// swiglu_backward_kernel and swiglu_fp8_transposed_kernel in one pass
// (Fp8Tile.cuh): from a gate, an up and an output-gradient chunk, the
// gradient chunks go to d_gate_up (their amax gathered as
// swiglu_backward_kernel gathers it, with Amax) and the forward's values to
// the cast.
template <bool Amax>
struct SwiGluGradientChunks {
  const __nv_bfloat16* gate_up;
  const __nv_bfloat16* d_out;
  __nv_bfloat16* d_gate_up;
  int64_t width;
  float mine = 0.0f;
  bool nan = false;
  struct Raw {
    Bf16x8 gate, up, d;
  };
  __device__ Raw fetch(int64_t r, int64_t c) const {
    const __nv_bfloat16* row = gate_up + r * 2 * width;
    return Raw{*reinterpret_cast<const Bf16x8*>(row + c), *reinterpret_cast<const Bf16x8*>(row + width + c),
               *reinterpret_cast<const Bf16x8*>(d_out + r * width + c)};
  }
  __device__ void values(const Raw& raw, int64_t r, int64_t c, float v[8]) {
    float g[8], u[8], d[8];
    unpack(raw.gate, g);
    unpack(raw.up, u);
    unpack(raw.d, d);
    alignas(16) __nv_bfloat16 dg[8], du[8];
    for (int k = 0; k < 8; ++k) {
      v[k] = stored_swiglu_value(g[k], u[k]);
      swiglu_gradients(g[k], u[k], d[k], &dg[k], &du[k]);
      if (Amax) {
        track(load(&dg[k]), mine, nan);
        track(load(&du[k]), mine, nan);
      }
    }
    __nv_bfloat16* row = d_gate_up + r * 2 * width;
    *reinterpret_cast<Bf16x8*>(row + c) = *reinterpret_cast<const Bf16x8*>(dg);
    *reinterpret_cast<Bf16x8*>(row + width + c) = *reinterpret_cast<const Bf16x8*>(du);
  }
};

template <bool Amax>
__global__ void __launch_bounds__(kTileThreads)
    swiglu_backward_fp8_transposed_kernel(const __nv_bfloat16* gate_up, const __nv_bfloat16* d_out,
                                          __nv_bfloat16* d_gate_up, int64_t rows, int64_t width,
                                          const float* inverse_scale, uint8_t* out_t, unsigned* amax_bits) {
  const float scale = 1.0f / *inverse_scale;
  SwiGluGradientChunks<Amax> loader{gate_up, d_out, d_gate_up, width};
  cast_tile_transposed<4>(loader, rows, width, scale, __NV_E4M3, out_t, nullptr);
  if (Amax) block_amax(loader.mine, loader.nan, amax_bits);
}

constexpr unsigned kThreads = 128;

// x: enough blocks of kThreads for a row's packs; y: one block row per row
// up to the grid's limit (the kernels walk the rest). With an amax, about
// kAmaxBlocks blocks in all: each block ends in a reduction and a read of
// the shared maximum, which a block of one row's work would not amortise.
constexpr int64_t kAmaxBlocks = 8192;
dim3 grid_for(int64_t rows, int64_t packs, bool amax) {
  const int64_t x = (packs + kThreads - 1) / kThreads;
  int64_t y = rows < 65535 ? rows : 65535;
  if (amax && x > 0) y = std::min(y, (kAmaxBlocks + x - 1) / x);
  return dim3(static_cast<unsigned>(x > 0 ? x : 1), static_cast<unsigned>(y > 0 ? y : 1));
}

}  // namespace

void swiglu_forward(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t width, float* amax,
                    cudaStream_t stream) {
  unsigned* amax_bits = reinterpret_cast<unsigned*>(amax);
  if (amax_bits != nullptr) cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream);
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int N = 16 / sizeof(T);
    const auto* in = static_cast<const T*>(gate_up);
    auto* y = static_cast<T*>(out);
    if (width % N == 0 && aligned(in, 16) && aligned(y, 16)) {
      swiglu_forward_kernel<T, N>
          <<<grid_for(rows, width / N, amax_bits != nullptr), kThreads, 0, stream>>>(in, y, rows, width, amax_bits);
    } else {
      swiglu_forward_kernel<T, 1>
          <<<grid_for(rows, width, amax_bits != nullptr), kThreads, 0, stream>>>(in, y, rows, width, amax_bits);
    }
  });
}

void swiglu_backward(Dtype dtype, const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows, int64_t width,
                     float* amax, cudaStream_t stream, void* out) {
  unsigned* amax_bits = reinterpret_cast<unsigned*>(amax);
  if (amax_bits != nullptr) cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream);
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int N = 16 / sizeof(T);
    const auto* in = static_cast<const T*>(gate_up);
    const auto* dy = static_cast<const T*>(d_out);
    auto* d_in = static_cast<T*>(d_gate_up);
    auto* y = static_cast<T*>(out);
    const bool vector =
        width % N == 0 && aligned(in, 16) && aligned(dy, 16) && aligned(d_in, 16) && (y == nullptr || aligned(y, 16));
    const dim3 grid = grid_for(rows, vector ? width / N : width, amax_bits != nullptr);
    if (vector) {
      const auto kernel = y != nullptr ? swiglu_backward_kernel<T, N, true> : swiglu_backward_kernel<T, N, false>;
      kernel<<<grid, kThreads, 0, stream>>>(in, dy, d_in, y, rows, width, amax_bits);
    } else {
      const auto kernel = y != nullptr ? swiglu_backward_kernel<T, 1, true> : swiglu_backward_kernel<T, 1, false>;
      kernel<<<grid, kThreads, 0, stream>>>(in, dy, d_in, y, rows, width, amax_bits);
    }
  });
}

bool swiglu_fp8_transposed(const void* gate_up, int64_t rows, int64_t width, const float* inverse_scale, void* out_t,
                           cudaStream_t stream) {
  if (!transposed_tile_fits(rows, width, gate_up, out_t)) return false;
  if (rows == 0 || width == 0) return true;
  swiglu_fp8_transposed_kernel<<<transposed_tile_grid(rows, width), kTileThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(gate_up), rows, width, inverse_scale, static_cast<uint8_t*>(out_t));
  return true;
}

bool swiglu_backward_fp8_transposed(const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows,
                                    int64_t width, const float* inverse_scale, void* out_t, float* amax,
                                    cudaStream_t stream) {
  if (!transposed_tile_fits(rows, width, gate_up, out_t) || !aligned(d_out, 16) || !aligned(d_gate_up, 16))
    return false;
  unsigned* amax_bits = reinterpret_cast<unsigned*>(amax);
  if (amax_bits != nullptr) cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream);
  if (rows == 0 || width == 0) return true;
  const auto kernel =
      amax_bits != nullptr ? swiglu_backward_fp8_transposed_kernel<true> : swiglu_backward_fp8_transposed_kernel<false>;
  kernel<<<transposed_tile_grid(rows, width), kTileThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(gate_up), static_cast<const __nv_bfloat16*>(d_out),
      static_cast<__nv_bfloat16*>(d_gate_up), rows, width, inverse_scale, static_cast<uint8_t*>(out_t), amax_bits);
  return true;
}

}  // namespace trainer::ops::kernels
