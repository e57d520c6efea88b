// Reproducible mode's accumulation on CUDA (ExactGradients::add): one pass
// that rounds each gradient element onto the fixed-point grid, adds it into
// the int64 accumulator and keeps the largest magnitude. LibTorch's
// sequence for the same (widen to fp64, scale, round, clamp, convert, add,
// abs, max) reads and writes 8-byte copies of the gradient about ten times:
// here the gradient is read once and the accumulator read and written once.
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void fixed_point_add_kernel(const T* gradient, long long* sums, int64_t n, double scale, double limit,
                                       bool add, unsigned long long* largest) {
  double biggest = 0.0;  // NaN, once seen, stays: no comparison replaces it
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = static_cast<double>(load(gradient + i));  // exact, as is the scaling by a power of two
    const double size = fabs(x);
    if (size != size || size > biggest) biggest = size;
    if (add) {
      // rint rounds half to even, as LibTorch's round() on the CPU path; the
      // clamp keeps an out-of-range value (the pass is then refused) finite.
      const double q = fmin(fmax(rint(x * scale), -limit), limit);
      sums[i] += static_cast<long long>(q);
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

}  // namespace

void fixed_point_add(Dtype dtype, const void* gradient, int64_t* sums, int64_t n, double scale, double limit, bool add,
                     double* largest, cudaStream_t stream) {
  dispatch(dtype, [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    fixed_point_add_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gradient), reinterpret_cast<long long*>(sums), n, scale, limit, add,
        reinterpret_cast<unsigned long long*>(largest));
  });
}

}  // namespace trainer::ops::kernels
