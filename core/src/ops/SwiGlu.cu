// CUDA kernels of swiglu (SwiGlu.cpp has the CPU path and the autograd
// function). Forward reads [gate | up] once and writes silu(gate) * up;
// backward reads the saved input and the output gradient once and writes
// both input gradients: 3 + 3 element passes instead of the composite's
// silu, mul, and their backward (about 10 passes and two saved temporaries).
//
//   y = g s(g) u,  s = sigmoid
//   dy/dg = u s(g) (1 + g (1 - s(g))),  dy/du = g s(g)
#include "KernelSupport.cuh"

namespace trainer::ops::kernels {
namespace {

template <typename A>
__device__ inline A sigmoid(A x) {
  return A(1) / (A(1) + exp(-x));
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* gate_up, T* out, int64_t rows, int64_t width) {
  using A = typename Acc<T>::type;
  const int64_t items = rows * width;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = item / width, col = item % width;
    const T* in = gate_up + row * 2 * width;
    const A g = load(in + col), u = load(in + width + col);
    store(out + item, g * sigmoid(g) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* gate_up, const T* d_out, T* d_gate_up, int64_t rows,
                                       int64_t width) {
  using A = typename Acc<T>::type;
  const int64_t items = rows * width;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = item / width, col = item % width;
    const T* in = gate_up + row * 2 * width;
    T* d_in = d_gate_up + row * 2 * width;
    const A g = load(in + col), u = load(in + width + col), dy = load(d_out + item);
    const A s = sigmoid(g);
    store(d_in + col, dy * u * s * (A(1) + g * (A(1) - s)));
    store(d_in + width + col, dy * g * s);
  }
}

}  // namespace

void swiglu_forward(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t width, cudaStream_t stream) {
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    swiglu_forward_kernel<T><<<blocks_for(rows * width, 256), 256, 0, stream>>>(static_cast<const T*>(gate_up),
                                                                                 static_cast<T*>(out), rows, width);
  });
}

void swiglu_backward(Dtype dtype, const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows,
                     int64_t width, cudaStream_t stream) {
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    swiglu_backward_kernel<T><<<blocks_for(rows * width, 256), 256, 0, stream>>>(
        static_cast<const T*>(gate_up), static_cast<const T*>(d_out), static_cast<T*>(d_gate_up), rows, width);
  });
}

}  // namespace trainer::ops::kernels
