// CUDA kernels of kernels/avg_pool.h (float32 and float64) under tandem::kernels::cuda.
// Assumes: validated by kernels/avg_pool.cpp; x and the gradient [N, C, ., .] may be strided (made
// contiguous). The window geometry is kernels/avg_pool.h's PoolGeometry::window, the code the CPU
// kernel runs.
// How: the forward runs one thread per output element, summing its window in double. The backward
// runs one thread per input element and gathers the shares grad / divisor of the windows that
// cover it (a conservative candidate range, each candidate's window checked), adding them in
// the element type in output row-major order: the CPU's order, with no atomics.
// Guarantees: fresh contiguous outputs on the operand's device, on its compute stream.
#include <cstdint>

#include "core/cuda/launch.cuh"
#include "kernels/ops.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"

namespace tandem::kernels::cuda {
namespace {

template <typename T>
__global__ void avg_pool_kernel(const T* x, T* out, PoolGeometry g, int64_t total) {
  TANDEM_GRID_STRIDE_LOOP(t, total) {
    const int64_t q = t % g.out_w, p = (t / g.out_w) % g.out_h, plane = t / (g.out_w * g.out_h);
    int64_t h0, h1, w0, w1;
    double div;
    g.window(p, q, h0, h1, w0, w1, div);
    const T* src = x + plane * g.H * g.W;
    double s = 0;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) s += static_cast<double>(src[h * g.W + w]);
    out[t] = static_cast<T>(s / div);
  }
}

template <typename T>
__global__ void avg_pool_grad_kernel(const T* grad, T* out, PoolGeometry g, int64_t total) {
  TANDEM_GRID_STRIDE_LOOP(t, total) {
    const int64_t w = t % g.W, h = (t / g.W) % g.H, plane = t / (g.W * g.H);
    int64_t p0, p1, q0, q1;
    g.covering(h, w, p0, p1, q0, q1);
    const T* gp = grad + plane * g.out_h * g.out_w;
    T acc = 0;
    for (int64_t p = p0; p <= p1; ++p) {
      for (int64_t q = q0; q <= q1; ++q) {
        int64_t h0, h1, w0, w1;
        double div;
        g.window(p, q, h0, h1, w0, w1, div);
        if (h >= h0 && h < h1 && w >= w0 && w < w1) acc += static_cast<T>(static_cast<double>(gp[p * g.out_w + q]) / div);
      }
    }
    out[t] = acc;
  }
}

}  // namespace

Tensor avg_pool_forward(const Tensor& x_in, const PoolGeometry& g) {
  const int dev = check_f32_f64_cuda("avg_pool2d", {x_in});
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({x.size(0), x.size(1), g.out_h, g.out_w}, x.dtype(), x.device());
  const int64_t total = out.numel();
  if (total == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch(on, avg_pool_kernel<T>, grid_for(total), 256, 0, elem_ptr<const T>(x), elem_ptr<T>(out), g, total);
  });
  return out;
}

Tensor avg_pool_backward(const Tensor& g_in, const Shape& input_shape, const PoolGeometry& g) {
  const int dev = check_f32_f64_cuda("avg_pool2d", {g_in});
  TANDEM_CHECK(g_in.shape() == Shape({input_shape[0], input_shape[1], g.out_h, g.out_w}),
               "avg_pool2d backward: gradient ", g_in.str(), " does not match the output of the input ",
               shape_str(input_shape));
  const Tensor grad = g_in.contiguous();
  Tensor out = Tensor::empty(input_shape, grad.dtype(), grad.device());
  const int64_t total = out.numel();
  if (total == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(grad.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch(on, avg_pool_grad_kernel<T>, grid_for(total), 256, 0, elem_ptr<const T>(grad), elem_ptr<T>(out), g,
           total);
  });
  return out;
}

}  // namespace tandem::kernels::cuda
