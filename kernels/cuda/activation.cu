// relu on CUDA (float32 and float64): the elementwise math is kernels/functors.h's ReluForward/ReluBackward, shared with
// the CPU kernels. Backward works from the output y. Inputs may be strided (made contiguous
// first); outputs are contiguous; work is queued on the compute stream.
#include "kernels/ops.h"
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/functors.h"

namespace tandem::kernels::cuda {
namespace {

template <typename T>
__global__ void relu_forward_kernel(const T* x, T* y, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { y[i] = ReluForward{}(x[i]); }
}

template <typename T>
__global__ void relu_backward_kernel(const T* g, const T* y, T* dx, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { dx[i] = ReluBackward{}(g[i], y[i]); }
}

}  // namespace

// [op-cuda-kernel]
Tensor relu_forward(const Tensor& x_in) {
  const int dev = check_f32_f64_cuda("relu_forward", {x_in});
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n == 0) return y;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, relu_forward_kernel<T>, grid_for(n), 256, 0, elem_ptr<T>(x), elem_ptr<T>(y), n);
  });
  return y;
}
// [op-cuda-kernel]

Tensor relu_backward(const Tensor& grad_out_in, const Tensor& y_in) {
  const int dev = check_f32_f64_cuda("relu_backward", {grad_out_in, y_in});
  TANDEM_CHECK(grad_out_in.shape() == y_in.shape(), "relu_backward: grad_output ", grad_out_in.str(),
               " does not match output ", y_in.str());
  const Tensor g = grad_out_in.contiguous(), y = y_in.contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  const int64_t n = y.numel();
  if (n == 0) return dx;
  StreamGuard on(dev);
  dispatch_cuda_float(y.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, relu_backward_kernel<T>, grid_for(n), 256, 0, elem_ptr<T>(g), elem_ptr<T>(y), elem_ptr<T>(dx), n);
  });
  return dx;
}

}  // namespace tandem::kernels::cuda
