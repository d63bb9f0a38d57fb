// max_pool2d on CUDA with custom kernels, as PyTorch's: floor mode, implicit -inf padding that
// never wins, indices (int64) = flat position h * W + w of the maximum within its input plane,
// ties to the first maximum in scan order; a NaN wins (the last NaN of the window), as in PyTorch.
// Forward: one thread per output element. Backward: one thread per output element adds its
// gradient at its index with atomicAdd (windows overlap when stride < kernel), into a zeroed
// grad_input; indices outside the plane are skipped rather than written out of bounds.
// Inputs may be strided (made contiguous first); outputs are contiguous; compute stream only.
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/pool.h"

namespace tandem::kernels::cuda {
namespace {

struct PoolGeometry {
  int64_t H, W, P, Q, kh, kw, sh, sw, ph, pw;
};

__global__ void max_pool_forward_kernel(const float* x, float* y, int64_t* indices, PoolGeometry g, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const int64_t q = i % g.Q;
    const int64_t p = (i / g.Q) % g.P;
    const int64_t plane = i / (g.P * g.Q);
    const float* xp = x + plane * g.H * g.W;
    int64_t h0 = p * g.sh - g.ph, w0 = q * g.sw - g.pw;
    const int64_t h1 = min(h0 + g.kh, g.H), w1 = min(w0 + g.kw, g.W);
    h0 = max(h0, int64_t(0));
    w0 = max(w0, int64_t(0));
    float best = -INFINITY;
    int64_t best_idx = h0 * g.W + w0;
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) {
        const float v = xp[h * g.W + w];
        if (v > best || isnan(v)) {
          best = v;
          best_idx = h * g.W + w;
        }
      }
    }
    y[i] = best;
    indices[i] = best_idx;
  }
}

__global__ void max_pool_backward_kernel(const float* dy, const int64_t* indices, float* dx, int64_t PQ, int64_t HW,
                                         int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const int64_t idx = indices[i];
    if (idx >= 0 && idx < HW) atomicAdd(dx + (i / PQ) * HW + idx, dy[i]);
  }
}

}  // namespace

MaxPool2dForward max_pool2d_forward(const Tensor& x_in, const MaxPool2dArgs& a) {
  const char* op = "max_pool2d_forward";
  const int dev = check_f32_cuda(op, {x_in});
  TANDEM_CHECK(x_in.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ", x_in.str());
  TANDEM_CHECK(a.kernel_h >= 1 && a.kernel_w >= 1 && a.stride_h >= 1 && a.stride_w >= 1, op,
               ": kernel and stride must be >= 1, got kernel (", a.kernel_h, ", ", a.kernel_w, "), stride (",
               a.stride_h, ", ", a.stride_w, ")");
  TANDEM_CHECK(a.pad_h >= 0 && a.pad_w >= 0 && 2 * a.pad_h <= a.kernel_h && 2 * a.pad_w <= a.kernel_w, op,
               ": padding must be between 0 and half the kernel, got padding (", a.pad_h, ", ", a.pad_w,
               ") for kernel (", a.kernel_h, ", ", a.kernel_w, ")");
  PoolGeometry g{};
  g.H = x_in.size(2);
  g.W = x_in.size(3);
  g.kh = a.kernel_h;
  g.kw = a.kernel_w;
  g.sh = a.stride_h;
  g.sw = a.stride_w;
  g.ph = a.pad_h;
  g.pw = a.pad_w;
  TANDEM_CHECK(g.H + 2 * g.ph >= g.kh && g.W + 2 * g.pw >= g.kw, op, ": kernel (", g.kh, ", ", g.kw,
               ") larger than the padded input of ", x_in.str());
  g.P = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
  g.Q = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
  const Shape out_shape{x_in.size(0), x_in.size(1), g.P, g.Q};
  MaxPool2dForward out;
  out.output = Tensor::empty(out_shape, kFloat32, x_in.device());
  out.indices = Tensor::empty(out_shape, kInt64, x_in.device());
  const int64_t n = out.output.numel();
  if (n == 0) return out;
  const Tensor x = x_in.contiguous();
  StreamGuard on(dev);
  launch(on, max_pool_forward_kernel, grid_for(n), 256, 0,  f32_ptr(x), f32_ptr(out.output), static_cast<int64_t*>(out.indices.raw_data()), g, n);
  return out;
}

Tensor max_pool2d_backward(const Tensor& grad_out_in, const Tensor& indices_in, const Shape& input_shape) {
  const char* op = "max_pool2d_backward";
  const int dev = check_f32_cuda(op, {grad_out_in});
  TANDEM_CHECK(indices_in.defined() && indices_in.dtype() == kInt64 && indices_in.device() == grad_out_in.device(),
               op, ": indices must be int64 on ", grad_out_in.device().str(), ", got ", indices_in.str());
  TANDEM_CHECK(input_shape.size() == 4, op, ": input shape must be [N, C, H, W], got ", shape_str(input_shape));
  TANDEM_CHECK(grad_out_in.dim() == 4 && grad_out_in.size(0) == input_shape[0] && grad_out_in.size(1) == input_shape[1],
               op, ": grad_output ", grad_out_in.str(), " does not match input shape ", shape_str(input_shape));
  TANDEM_CHECK(indices_in.shape() == grad_out_in.shape(), op, ": indices ", indices_in.str(),
               " do not match grad_output ", grad_out_in.str());
  Tensor dx = Tensor::zeros(input_shape, kFloat32, grad_out_in.device());
  const int64_t n = grad_out_in.numel();
  if (n == 0) return dx;
  const Tensor dy = grad_out_in.contiguous(), indices = indices_in.contiguous();
  const int64_t PQ = grad_out_in.size(2) * grad_out_in.size(3), HW = input_shape[2] * input_shape[3];
  StreamGuard on(dev);
  launch(on, max_pool_backward_kernel, grid_for(n), 256, 0,  f32_ptr(dy), static_cast<const int64_t*>(indices.raw_data()), f32_ptr(dx), PQ, HW, n);
  return dx;
}

}  // namespace tandem::kernels::cuda
