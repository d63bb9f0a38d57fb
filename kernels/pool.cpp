// Device-neutral max_pool2d entry points: validate the input rank, kernel,
// stride and padding (padding at most half the kernel, as PyTorch requires),
// the output size, index dtype, devices and dtypes, then route to cpu:: or
// cuda::. No math here.
#include "kernels/pool.h"

#include "core/profiler.h"
#include "kernels/avg_pool.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

MaxPoolAxis axis(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d, bool ceil_mode, int64_t adaptive) {
  const int64_t out = adaptive > 0 ? adaptive : avg_pool_out_size(in, d * (k - 1) + 1, s, pad, ceil_mode);
  return MaxPoolAxis{in, out, k, s, pad, d, adaptive > 0};
}

}  // namespace

MaxPoolAxis max_pool_axis_h(const Shape& x, const MaxPool2dArgs& a) {
  return axis(x[2], a.kernel_h, a.stride_h, a.pad_h, a.dilation_h, a.ceil_mode, a.adaptive_h);
}

MaxPoolAxis max_pool_axis_w(const Shape& x, const MaxPool2dArgs& a) {
  return axis(x[3], a.kernel_w, a.stride_w, a.pad_w, a.dilation_w, a.ceil_mode, a.adaptive_w);
}

MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& a) {
  constexpr const char* op = "max_pool2d_forward";
  profiler::Scope prof_scope(op);
  TANDEM_CHECK(x.defined() && x.dim() == 4, op, ": expected input [N, C, H, W], got ",
               x.defined() ? x.str() : "undefined tensor");
  const Device device = common_device(op, {x});
  common_float_dtype(op, {x});
  if (a.adaptive_h > 0 || a.adaptive_w > 0) {
    TANDEM_CHECK(a.adaptive_h > 0 && a.adaptive_w > 0, op, ": adaptive output size must be >= 1 in both dimensions, got (",
                 a.adaptive_h, ", ", a.adaptive_w, ")");
    TANDEM_CHECK(x.size(2) > 0 && x.size(3) > 0, op, ": adaptive pooling needs a non-empty plane, got ", x.str());
    return TANDEM_KERNEL(device, max_pool2d_forward)(x, a);
  }
  TANDEM_CHECK(a.dilation_h >= 1 && a.dilation_w >= 1, op, ": dilation must be >= 1, got (", a.dilation_h, ", ",
               a.dilation_w, ")");
  TANDEM_CHECK(a.kernel_h >= 1 && a.kernel_w >= 1, op, ": kernel size must be >= 1, got (", a.kernel_h, ", ",
               a.kernel_w, ")");
  TANDEM_CHECK(a.stride_h >= 1 && a.stride_w >= 1, op, ": stride must be >= 1, got (", a.stride_h, ", ",
               a.stride_w, ")");
  TANDEM_CHECK(a.pad_h >= 0 && a.pad_w >= 0 && a.pad_h <= a.kernel_h / 2 && a.pad_w <= a.kernel_w / 2, op,
               ": padding must be between 0 and half the kernel size, got padding (", a.pad_h, ", ", a.pad_w,
               ") for kernel (", a.kernel_h, ", ", a.kernel_w, ")");
  const int64_t hp = x.size(2) + 2 * a.pad_h, wp = x.size(3) + 2 * a.pad_w;
  const int64_t kh = a.dilation_h * (a.kernel_h - 1) + 1, kw = a.dilation_w * (a.kernel_w - 1) + 1;
  TANDEM_CHECK(hp >= kh && wp >= kw, op, ": padded input ", hp, "x", wp, " is smaller than the (dilated) kernel ",
               kh, "x", kw);
  return TANDEM_KERNEL(device, max_pool2d_forward)(x, a);
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape) {
  constexpr const char* op = "max_pool2d_backward";
  profiler::Scope prof_scope(op);
  TANDEM_CHECK(grad_out.defined() && indices.defined(), op, ": grad_out and indices must be defined");
  TANDEM_CHECK(input_shape.size() == 4, op, ": expected a 4-D input shape, got ", shape_str(input_shape));
  TANDEM_CHECK(
      grad_out.dim() == 4 && grad_out.size(0) == input_shape[0] && grad_out.size(1) == input_shape[1], op,
      ": grad_out ", grad_out.str(), " does not match input shape ", shape_str(input_shape));
  TANDEM_CHECK(indices.shape() == grad_out.shape(), op, ": indices ", indices.str(),
               " do not match grad_out ", grad_out.str());
  TANDEM_CHECK(indices.dtype() == kInt64, op, ": expected int64 indices, got ", indices.str());
  const Device device = common_device(op, {grad_out, indices});
  common_float_dtype(op, {grad_out});
  return TANDEM_KERNEL(device, max_pool2d_backward)(grad_out, indices, input_shape);
}

}  // namespace tandem::kernels
