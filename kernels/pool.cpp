// Device-neutral max_pool2d entry points: validate the input rank, kernel,
// stride and padding (padding at most half the kernel, as PyTorch requires),
// the output size, index dtype, devices and dtypes, then route to cpu:: or
// cuda::. No math here.
#include "kernels/pool.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"

namespace tandem::kernels {

MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& a) {
  constexpr const char* op = "max_pool2d_forward";
  profiler::Scope prof_scope(op);
  TANDEM_CHECK(x.defined() && x.dim() == 4, op, ": expected input [N, C, H, W], got ",
               x.defined() ? x.str() : "undefined tensor");
  TANDEM_CHECK(a.kernel_h >= 1 && a.kernel_w >= 1, op, ": kernel size must be >= 1, got (", a.kernel_h, ", ",
               a.kernel_w, ")");
  TANDEM_CHECK(a.stride_h >= 1 && a.stride_w >= 1, op, ": stride must be >= 1, got (", a.stride_h, ", ",
               a.stride_w, ")");
  TANDEM_CHECK(a.pad_h >= 0 && a.pad_w >= 0 && a.pad_h <= a.kernel_h / 2 && a.pad_w <= a.kernel_w / 2, op,
               ": padding must be between 0 and half the kernel size, got padding (", a.pad_h, ", ", a.pad_w,
               ") for kernel (", a.kernel_h, ", ", a.kernel_w, ")");
  const int64_t hp = x.size(2) + 2 * a.pad_h, wp = x.size(3) + 2 * a.pad_w;
  TANDEM_CHECK(hp >= a.kernel_h && wp >= a.kernel_w, op, ": padded input ", hp, "x", wp,
               " is smaller than the kernel ", a.kernel_h, "x", a.kernel_w);
  const Device device = common_device(op, {x});
  common_float_dtype(op, {x});
  return TANDEM_DISPATCH(device, max_pool2d_forward, x, a);
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
  return TANDEM_DISPATCH(device, max_pool2d_backward, grad_out, indices, input_shape);
}

}  // namespace tandem::kernels
