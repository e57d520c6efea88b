// Reproducible mode's accumulation on CUDA (ExactGradients::add): one pass
// that rounds each gradient element onto the fixed-point grid, adds it into
// the int64 accumulator and keeps the largest magnitude. LibTorch's
// sequence for the same (widen to fp64, scale, round, clamp, convert, add,
// abs, max) reads and writes 8-byte copies of the gradient about ten times:
// here the gradient is read once and the accumulator read and written once.
// The accumulator is int64 sums, or each sum as two 32-bit limbs in two
// arrays (ExactGradients' limbs: the low one in the strategy's gradient).
#include <algorithm>

#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;

// Where element i's int64 sum lives: whole, or as limbs, sum = high 2^32 + low.
// add4: elements i..i+3 at once (16-byte accesses; `vectorizable` said so).
struct WholeSums {
  long long* sums;
  __device__ void add(int64_t i, long long q) const { sums[i] += q; }
  __device__ void add4(int64_t i, const long long q[4]) const {
    longlong2* at = reinterpret_cast<longlong2*>(sums + i);
    longlong2 a = at[0], b = at[1];
    a.x += q[0], a.y += q[1], b.x += q[2], b.y += q[3];
    at[0] = a, at[1] = b;
  }
  bool vectorizable() const { return aligned(sums, 16); }
};
struct LimbSums {
  unsigned* low;
  int* high;
  __device__ static void limb_add(unsigned& lo, int& hi, long long q) {
    const long long sum = static_cast<long long>(hi) * 4294967296LL + static_cast<long long>(lo) + q;
    const unsigned bits = static_cast<unsigned>(sum);  // sum mod 2^32: well defined
    lo = bits;
    hi = static_cast<int>((sum - static_cast<long long>(bits)) / 4294967296LL);  // exact
  }
  __device__ void add(int64_t i, long long q) const { limb_add(low[i], high[i], q); }
  __device__ void add4(int64_t i, const long long q[4]) const {
    uint4 lo = *reinterpret_cast<const uint4*>(low + i);
    int4 hi = *reinterpret_cast<const int4*>(high + i);
    limb_add(lo.x, hi.x, q[0]);
    limb_add(lo.y, hi.y, q[1]);
    limb_add(lo.z, hi.z, q[2]);
    limb_add(lo.w, hi.w, q[3]);
    *reinterpret_cast<uint4*>(low + i) = lo;
    *reinterpret_cast<int4*>(high + i) = hi;
  }
  bool vectorizable() const { return aligned(low, 16) && aligned(high, 16); }
};

// Four consecutive elements widened to fp64 (exact), from one 8-, 16- or
// two 16-byte loads.
__device__ inline void load4(const __nv_bfloat16* p, double x[4]) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);  // a bf16 is the top half of its fp32
  x[0] = __uint_as_float(v.x << 16), x[1] = __uint_as_float(v.x & 0xffff0000u);
  x[2] = __uint_as_float(v.y << 16), x[3] = __uint_as_float(v.y & 0xffff0000u);
}
__device__ inline void load4(const float* p, double x[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
__device__ inline void load4(const double* p, double x[4]) {
  const double2 a = reinterpret_cast<const double2*>(p)[0], b = reinterpret_cast<const double2*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}

// One element's rounding onto the grid; its magnitude into `biggest`.
__device__ inline long long grid_value(double x, double scale, double limit, double& biggest) {
  const double size = fabs(x);
  if (size != size || size > biggest) biggest = size;  // NaN, once seen, stays: no comparison replaces it
  // rint rounds half to even, as LibTorch's round() on the CPU path; the
  // clamp keeps an out-of-range value (the pass is then refused) finite.
  return static_cast<long long>(fmin(fmax(rint(x * scale), -limit), limit));
}

// `vector`: elements [0, n - n % 4) four at a time, then the rest one at a
// time; the same arithmetic per element either way, so the same sums.
template <typename T, typename Sums>
__global__ void fixed_point_add_kernel(const T* gradient, Sums sums, int64_t n, bool vector, const double* scale_at,
                                       double limit, unsigned long long* largest) {
  // Read from device memory, so that a CUDA graph's replay adds with the
  // scale of its pass; 0: the pass only measures.
  const double scale = *scale_at;
  const bool add = scale != 0.0;
  double biggest = 0.0;
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t quads = vector ? n / 4 : 0;
  for (int64_t k = thread; k < quads; k += threads) {
    double x[4];
    load4(gradient + 4 * k, x);
    long long q[4];
    for (int j = 0; j < 4; ++j) q[j] = grid_value(x[j], scale, limit, biggest);
    if (add) sums.add4(4 * k, q);
  }
  for (int64_t i = 4 * quads + thread; i < n; i += threads) {
    const long long q = grid_value(static_cast<double>(load(gradient + i)), scale, limit, biggest);
    if (add) sums.add(i, q);
  }
  __shared__ double block[kThreads];
  block[threadIdx.x] = biggest;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const double other = block[threadIdx.x + half];
      if (other != other || other > block[threadIdx.x]) block[threadIdx.x] = other;
    }
    __syncthreads();
  }
  // Non-negative doubles (and +NaN above +inf) order as their bit patterns do.
  if (threadIdx.x == 0) atomicMax(largest, static_cast<unsigned long long>(__double_as_longlong(block[0])));
}

// Blocks of a fixed-point launch: each thread walks many elements, so that
// the per-block reduction of the largest magnitude stays rare (two waves of
// eight 256-thread blocks on a 132-SM GPU).
constexpr unsigned kMaxFixedPointBlocks = 2048;

template <typename Sums>
void launch_fixed_point_add(Dtype dtype, const void* gradient, Sums sums, int64_t n, const double* scale, double limit,
                            double* largest, cudaStream_t stream) {
  dispatch(dtype, [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    const bool vector = aligned(gradient, 4 * sizeof(T)) && sums.vectorizable();
    const unsigned blocks = std::min(blocks_for(vector ? (n + 3) / 4 : n, kThreads), kMaxFixedPointBlocks);
    fixed_point_add_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(gradient), sums, n, vector, scale,
                                                               limit, reinterpret_cast<unsigned long long*>(largest));
  });
}

// One group's limb sums to fp32 in place, every parameter of the group in
// one launch: element i belongs to the parameter whose segment [starts[k],
// starts[k + 1]) holds it, found by bisection over the (few hundred)
// starts. The conversions are the CPU path's: int64 -> fp64 rounded to
// nearest, times the power of two (exact), -> fp32 rounded to nearest.
__global__ void fixed_point_limbs_to_float_kernel(unsigned* low, const int* high, int64_t n, const int64_t* starts,
                                                  int segments, const double* scales) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int lo = 0, hi = segments - 1;  // the last k with starts[k] <= i
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (starts[mid] <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const double scale = scales[lo];
    float value = 0.0f;  // an unknown scale (0): the parameter received nothing, +0
    if (scale != 0.0) {
      const long long sum = static_cast<long long>(high[i]) * 4294967296LL + static_cast<long long>(low[i]);
      value = __double2float_rn(__dmul_rn(__ll2double_rn(sum), scale));
    }
    low[i] = __float_as_uint(value);
  }
}

}  // namespace

void fixed_point_add(Dtype dtype, const void* gradient, int64_t* sums, int64_t n, const double* scale, double limit,
                     double* largest, cudaStream_t stream) {
  launch_fixed_point_add(dtype, gradient, WholeSums{reinterpret_cast<long long*>(sums)}, n, scale, limit, largest,
                         stream);
}

void fixed_point_add_limbs(Dtype dtype, const void* gradient, int32_t* low, int32_t* high, int64_t n,
                           const double* scale, double limit, double* largest, cudaStream_t stream) {
  launch_fixed_point_add(dtype, gradient, LimbSums{reinterpret_cast<unsigned*>(low), high}, n, scale, limit, largest,
                         stream);
}

void fixed_point_limbs_to_float(int32_t* low, const int32_t* high, int64_t n, const int64_t* starts, int segments,
                                const double* scales, cudaStream_t stream) {
  if (n == 0) return;
  fixed_point_limbs_to_float_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<unsigned*>(low), high, n, starts, segments, scales);
}

}  // namespace trainer::ops::kernels
