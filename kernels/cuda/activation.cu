// relu on CUDA: the elementwise math is kernels/functors.h's ReluForward/ReluBackward, shared with
// the CPU kernels. Backward works from the output y. Inputs may be strided (made contiguous
// first); outputs are contiguous; work is queued on the compute stream.
#include "kernels/ops.h"
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/functors.h"

namespace tandem::kernels::cuda {
namespace {

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { y[i] = ReluForward{}(x[i]); }
}

__global__ void relu_backward_kernel(const float* g, const float* y, float* dx, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { dx[i] = ReluBackward{}(g[i], y[i]); }
}

}  // namespace

// [op-cuda-kernel]
Tensor relu_forward(const Tensor& x_in) {
  const int dev = check_f32_cuda("relu_forward", {x_in});
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), kFloat32, x.device());
  const int64_t n = x.numel();
  if (n == 0) return y;
  StreamGuard on(dev);
  launch(on, relu_forward_kernel, grid_for(n), 256, 0, f32_ptr(x), f32_ptr(y), n);
  return y;
}
// [op-cuda-kernel]

Tensor relu_backward(const Tensor& grad_out_in, const Tensor& y_in) {
  const int dev = check_f32_cuda("relu_backward", {grad_out_in, y_in});
  TANDEM_CHECK(grad_out_in.shape() == y_in.shape(), "relu_backward: grad_output ", grad_out_in.str(),
               " does not match output ", y_in.str());
  const Tensor g = grad_out_in.contiguous(), y = y_in.contiguous();
  Tensor dx = Tensor::empty(y.shape(), kFloat32, y.device());
  const int64_t n = y.numel();
  if (n == 0) return dx;
  StreamGuard on(dev);
  launch(on, relu_backward_kernel, grid_for(n), 256, 0, f32_ptr(g), f32_ptr(y), f32_ptr(dx), n);
  return dx;
}

}  // namespace tandem::kernels::cuda
