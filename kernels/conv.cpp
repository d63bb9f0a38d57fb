// Device-neutral conv2d entry points: validate ranks, shapes, channel counts,
// stride/padding, devices and dtypes with messages naming what was expected,
// then call the kernel of the operands' backend (kernels/ops.h). No math here.
#include "kernels/conv.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

void check_args(const char* op, const Conv2dArgs& a) {
  TANDEM_CHECK(a.stride_h >= 1 && a.stride_w >= 1, op, ": stride must be >= 1, got (", a.stride_h, ", ",
               a.stride_w, ")");
  TANDEM_CHECK(a.pad_h >= 0 && a.pad_w >= 0, op, ": padding must be >= 0, got (", a.pad_h, ", ", a.pad_w,
               ")");
  TANDEM_CHECK(a.dilation_h >= 1 && a.dilation_w >= 1 && a.groups >= 1, op,
               ": dilation and groups must be >= 1, got dilation (", a.dilation_h, ", ", a.dilation_w, "), groups ",
               a.groups);
}

// Dilation and groups reach only the CUDA kernels (cuDNN); the CPU kernels take plain convolutions.
void check_device_args(const char* op, Device device, const Conv2dArgs& a) {
  TANDEM_CHECK(device.is_cuda() || (a.dilation_h == 1 && a.dilation_w == 1 && a.groups == 1), op,
               ": the CPU kernel takes dilation 1 and groups 1, got dilation (", a.dilation_h, ", ", a.dilation_w,
               "), groups ", a.groups, " (nn::functional::conv2d composes them on the CPU)");
}

// Checks x and weight against each other; returns the output shape.
Shape check_input_weight(const char* op, const Tensor& x, const Tensor& weight, const Conv2dArgs& a) {
  TANDEM_CHECK(x.defined() && weight.defined(), op, ": input and weight must be defined");
  TANDEM_CHECK(x.dim() == 4, op, ": expected input [N, C, H, W], got ", x.str());
  TANDEM_CHECK(weight.dim() == 4, op, ": expected weight [K, C / groups, R, S], got ", weight.str());
  check_args(op, a);
  TANDEM_CHECK(x.size(1) == weight.size(1) * a.groups && weight.size(0) % a.groups == 0, op, ": input has ",
               x.size(1), " channels but weight ", shape_str(weight.shape()), " with groups ", a.groups, " expects ",
               weight.size(1) * a.groups, " (and output channels divisible by groups)");
  const int64_t hp = x.size(2) + 2 * a.pad_h, wp = x.size(3) + 2 * a.pad_w;
  const int64_t er = a.dilation_h * (weight.size(2) - 1) + 1, es = a.dilation_w * (weight.size(3) - 1) + 1;
  TANDEM_CHECK(hp >= er && wp >= es, op, ": padded input ", hp, "x", wp, " is smaller than the kernel ", er, "x",
               es, " (dilation included)");
  return {x.size(0), weight.size(0), (hp - er) / a.stride_h + 1, (wp - es) / a.stride_w + 1};
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  constexpr const char* op = "conv2d_forward";
  const Shape out_shape = check_input_weight(op, x, weight, args);
  profiler::Scope prof_scope(op, conv_gemm_flops(out_shape, weight, 1));
  if (bias.defined()) {
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": expected bias [", weight.size(0),
                 "], got ", bias.str());
  }
  const Device device = common_device(op, {x, weight, bias});
  common_float_dtype(op, {x, weight, bias});
  check_device_args(op, device, args);
  return TANDEM_KERNEL(device, conv2d_forward)(x, weight, bias, args);
}

Conv2dGrads conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                            const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias) {
  constexpr const char* op = "conv2d_backward";
  const Shape out_shape = check_input_weight(op, x, weight, args);
  profiler::Scope prof_scope(op, conv_gemm_flops(out_shape, weight, int(need_input) + int(need_weight)));
  TANDEM_CHECK(grad_out.defined() && grad_out.shape() == out_shape, op, ": expected grad_out ",
               shape_str(out_shape), ", got ", grad_out.defined() ? grad_out.str() : "undefined tensor");
  const Device device = common_device(op, {grad_out, x, weight});
  common_float_dtype(op, {grad_out, x, weight});
  check_device_args(op, device, args);
  return TANDEM_KERNEL(device, conv2d_backward)(grad_out, x, weight, args, need_input, need_weight,
                         need_bias);
}

}  // namespace tandem::kernels
