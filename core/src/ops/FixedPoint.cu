// Reproducible mode's accumulation on CUDA (ExactGradients::add): one pass
// that rounds each gradient element onto the fixed-point grid, adds it into
// the int64 accumulator and keeps the largest magnitude. LibTorch's
// sequence for the same (widen to fp64, scale, round, clamp, convert, add,
// abs, max) reads and writes 8-byte copies of the gradient about ten times:
// here the gradient is read once and the accumulator read and written once.
// The accumulator is int64 sums, or each sum as two 32-bit limbs in two
// arrays (ExactGradients' limbs: the low one in the strategy's gradient).
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;

// Where element i's int64 sum lives: whole, or as limbs, sum = high 2^32 + low.
struct WholeSums {
  long long* sums;
  __device__ void add(int64_t i, long long q) const { sums[i] += q; }
};
struct LimbSums {
  unsigned* low;
  int* high;
  __device__ void add(int64_t i, long long q) const {
    const long long sum = static_cast<long long>(high[i]) * 4294967296LL + static_cast<long long>(low[i]) + q;
    const unsigned bits = static_cast<unsigned>(sum);  // sum mod 2^32: well defined
    low[i] = bits;
    high[i] = static_cast<int>((sum - static_cast<long long>(bits)) / 4294967296LL);  // exact
  }
};

template <typename T, typename Sums>
__global__ void fixed_point_add_kernel(const T* gradient, Sums sums, int64_t n, const double* scale_at, double limit,
                                       unsigned long long* largest) {
  // Read from device memory, so that a CUDA graph's replay adds with the
  // scale of its pass; 0: the pass only measures.
  const double scale = *scale_at;
  const bool add = scale != 0.0;
  double biggest = 0.0;  // NaN, once seen, stays: no comparison replaces it
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = static_cast<double>(load(gradient + i));  // exact, as is the scaling by a power of two
    const double size = fabs(x);
    if (size != size || size > biggest) biggest = size;
    if (add) {
      // rint rounds half to even, as LibTorch's round() on the CPU path; the
      // clamp keeps an out-of-range value (the pass is then refused) finite.
      const double q = fmin(fmax(rint(x * scale), -limit), limit);
      sums.add(i, static_cast<long long>(q));
    }
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

template <typename Sums>
void launch_fixed_point_add(Dtype dtype, const void* gradient, Sums sums, int64_t n, const double* scale, double limit,
                            double* largest, cudaStream_t stream) {
  dispatch(dtype, [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    fixed_point_add_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gradient), sums, n, scale, limit, reinterpret_cast<unsigned long long*>(largest));
  });
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

}  // namespace trainer::ops::kernels
