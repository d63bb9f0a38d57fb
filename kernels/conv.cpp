// Device-neutral conv2d entry points: validate ranks, shapes, channel counts,
// stride/padding, devices and dtypes with messages naming what was expected,
// then call the kernel of the operands' backend (kernels/ops.h). No math here.
#include "kernels/conv.h"

#include "kernels/conv_pair.h"

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

namespace {

// The pair's operands against each other; returns the main conv's output shape (the projection's has
// projection_weight's channels).
Shape check_pair(const char* op, const Tensor& x, const Tensor& w3, const Tensor& w1) {
  TANDEM_CHECK(w3.defined() && w3.dim() == 4 && w3.size(2) == 3 && w3.size(3) == 3, op,
               ": expected main_weight [K, C, 3, 3], got ", w3.defined() ? w3.str() : "undefined tensor");
  TANDEM_CHECK(w1.defined() && w1.dim() == 4 && w1.size(2) == 1 && w1.size(3) == 1, op,
               ": expected projection_weight [K, C, 1, 1], got ", w1.defined() ? w1.str() : "undefined tensor");
  const Shape main = check_input_weight(op, x, w3, Conv2dArgs{2, 2, 1, 1});
  check_input_weight(op, x, w1, Conv2dArgs{2, 2, 0, 0});
  return main;
}

}  // namespace

Conv2dPair conv2d_pair_forward(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight) {
  constexpr const char* op = "conv2d_pair_forward";
  const Shape y = check_pair(op, x, main_weight, projection_weight);
  const Shape y1{y[0], projection_weight.size(0), y[2], y[3]};
  profiler::Scope prof_scope(op, conv_gemm_flops(y, main_weight, 1) + conv_gemm_flops(y1, projection_weight, 1));
  const Device device = common_device(op, {x, main_weight, projection_weight});
  common_float_dtype(op, {x, main_weight, projection_weight});
  TANDEM_CHECK(device.is_cpu(), op, ": CPU only; elsewhere use conv2d_forward twice");
  return TANDEM_KERNEL(device, conv2d_pair_forward)(x, main_weight, projection_weight);
}

Conv2dPairGrads conv2d_pair_backward(const Tensor& grad_main, const Tensor& grad_projection, const Tensor& x,
                                     const Tensor& main_weight, const Tensor& projection_weight, bool need_input,
                                     bool need_main_weight, bool need_projection_weight) {
  constexpr const char* op = "conv2d_pair_backward";
  const Shape y = check_pair(op, x, main_weight, projection_weight);
  const Shape y1{y[0], projection_weight.size(0), y[2], y[3]};
  const int passes = int(need_input) + int(need_main_weight || need_projection_weight);
  profiler::Scope prof_scope(op, conv_gemm_flops(y, main_weight, passes) + conv_gemm_flops(y1, projection_weight,
                                                                                            passes));
  TANDEM_CHECK(!grad_main.defined() || grad_main.shape() == y, op, ": expected grad_main ", shape_str(y),
               " or undefined, got ", grad_main.defined() ? grad_main.str() : "");
  TANDEM_CHECK(!grad_projection.defined() || grad_projection.shape() == y1, op, ": expected grad_projection ",
               shape_str(y1), " or undefined, got ", grad_projection.defined() ? grad_projection.str() : "");
  const Device device = common_device(op, {grad_main, grad_projection, x, main_weight, projection_weight});
  common_float_dtype(op, {grad_main, grad_projection, x, main_weight, projection_weight});
  TANDEM_CHECK(device.is_cpu(), op, ": CPU only; elsewhere use conv2d_backward twice");
  return TANDEM_KERNEL(device, conv2d_pair_backward)(grad_main, grad_projection, x, main_weight, projection_weight,
                                                     need_input, need_main_weight, need_projection_weight);
}

bool conv2d_pair_applies(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight) {
  const auto f = [](const Tensor& t) { return t.defined() && (t.dtype() == kFloat32 || t.dtype() == kFloat64); };
  if (!f(x) || !f(main_weight) || !f(projection_weight) || !x.device().is_cpu() || x.dim() != 4) return false;
  if (main_weight.dtype() != x.dtype() || projection_weight.dtype() != x.dtype()) return false;
  if (!main_weight.device().is_cpu() || !projection_weight.device().is_cpu()) return false;
  const auto& w3 = main_weight;
  const auto& w1 = projection_weight;
  return w3.dim() == 4 && w3.size(1) == x.size(1) && w3.size(2) == 3 && w3.size(3) == 3 && w1.dim() == 4 &&
         w1.size(1) == x.size(1) && w1.size(2) == 1 && w1.size(3) == 1 && x.size(2) >= 1 && x.size(3) >= 1 &&
         backend_for(x.device(), "conv2d_pair").conv2d_pair_forward != nullptr;
}

}  // namespace tandem::kernels
