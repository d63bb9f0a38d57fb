// max_pool2d on CUDA with custom kernels, as PyTorch's: the windows of kernels/pool.h's
// MaxPoolAxis (dilation, ceil_mode, adaptive windows), implicit -inf padding that never wins, indices (int64) = flat position h * W + w of the maximum within its input plane,
// ties to the first maximum in scan order; a NaN wins (the last NaN of the window), as in PyTorch.
// Forward: one thread per output element. Backward: one thread per output element adds its
// gradient at its index with atomicAdd (windows overlap when stride < kernel), into a zeroed
// grad_input; indices outside the plane are skipped rather than written out of bounds.
// float32 and float64 (atomicAdd on doubles: sm_60 and later). Inputs may be strided (made
// contiguous first); outputs are contiguous; compute stream only.
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

template <typename T>
__global__ void max_pool_forward_kernel(const T* x, T* y, int64_t* indices, MaxPoolAxis ah, MaxPoolAxis aw,
                                        int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const int64_t q = i % aw.out;
    const int64_t p = (i / aw.out) % ah.out;
    const int64_t plane = i / (ah.out * aw.out);
    const int64_t W = aw.in;
    const T* xp = x + plane * ah.in * W;
    int64_t h0 = 0, hs = 1, hn = 0, w0 = 0, ws = 1, wn = 0;
    ah.window(p, h0, hs, hn);
    aw.window(q, w0, ws, wn);
    T best = -INFINITY;
    int64_t best_idx = h0 * W + w0;
    for (int64_t a = 0, h = h0; a < hn; ++a, h += hs) {
      for (int64_t b = 0, w = w0; b < wn; ++b, w += ws) {
        const T v = xp[h * W + w];
        if (v > best || isnan(v)) {
          best = v;
          best_idx = h * W + w;
        }
      }
    }
    y[i] = best;
    indices[i] = best_idx;
  }
}

template <typename T>
__global__ void max_pool_backward_kernel(const T* dy, const int64_t* indices, T* dx, int64_t PQ, int64_t HW,
                                         int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const int64_t idx = indices[i];
    if (idx >= 0 && idx < HW) atomicAdd(dx + (i / PQ) * HW + idx, dy[i]);
  }
}

}  // namespace

MaxPool2dForward max_pool2d_forward(const Tensor& x_in, const MaxPool2dArgs& a) {
  const char* op = "max_pool2d_forward";
  const int dev = check_f32_f64_cuda(op, {x_in});
  TANDEM_CHECK(x_in.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ", x_in.str());
  const MaxPoolAxis ah = max_pool_axis_h(x_in.shape(), a), aw = max_pool_axis_w(x_in.shape(), a);
  const Shape out_shape{x_in.size(0), x_in.size(1), ah.out, aw.out};
  MaxPool2dForward out;
  out.output = Tensor::empty(out_shape, x_in.dtype(), x_in.device());
  out.indices = Tensor::empty(out_shape, kInt64, x_in.device());
  const int64_t n = out.output.numel();
  if (n == 0) return out;
  const Tensor x = x_in.contiguous();
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch(on, max_pool_forward_kernel<T>, grid_for(n), 256, 0, elem_ptr<const T>(x), elem_ptr<T>(out.output),
           elem_ptr<int64_t>(out.indices), ah, aw, n);
  });
  return out;
}

Tensor max_pool2d_backward(const Tensor& grad_out_in, const Tensor& indices_in, const Shape& input_shape) {
  const char* op = "max_pool2d_backward";
  const int dev = check_f32_f64_cuda(op, {grad_out_in});
  TANDEM_CHECK(indices_in.defined() && indices_in.dtype() == kInt64 && indices_in.device() == grad_out_in.device(),
               op, ": indices must be int64 on ", grad_out_in.device().str(), ", got ", indices_in.str());
  TANDEM_CHECK(input_shape.size() == 4, op, ": input shape must be [N, C, H, W], got ", shape_str(input_shape));
  TANDEM_CHECK(grad_out_in.dim() == 4 && grad_out_in.size(0) == input_shape[0] && grad_out_in.size(1) == input_shape[1],
               op, ": grad_output ", grad_out_in.str(), " does not match input shape ", shape_str(input_shape));
  TANDEM_CHECK(indices_in.shape() == grad_out_in.shape(), op, ": indices ", indices_in.str(),
               " do not match grad_output ", grad_out_in.str());
  Tensor dx = Tensor::zeros(input_shape, grad_out_in.dtype(), grad_out_in.device());
  const int64_t n = grad_out_in.numel();
  if (n == 0) return dx;
  const Tensor dy = grad_out_in.contiguous(), indices = indices_in.contiguous();
  const int64_t PQ = grad_out_in.size(2) * grad_out_in.size(3), HW = input_shape[2] * input_shape[3];
  StreamGuard on(dev);
  dispatch_cuda_float(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch(on, max_pool_backward_kernel<T>, grid_for(n), 256, 0, elem_ptr<const T>(dy),
           elem_ptr<const int64_t>(indices), elem_ptr<T>(dx), PQ, HW, n);
  });
  return dx;
}

}  // namespace tandem::kernels::cuda
