// Device-neutral entry points of kernels/avg_pool.h: checks (rank, sizes, dtype, one device), the
// window geometry of each pooling, then the CPU or CUDA kernel by the operand's device.
#include "kernels/avg_pool.h"

#include <algorithm>

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

Device check_input(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.defined(), op, ": input is undefined");
  const Device device = common_device(op, {x});
  common_float_dtype(op, {x});
  TANDEM_CHECK(x.dim() == 4 && x.size(2) > 0 && x.size(3) > 0, op, ": expected a non-empty [N, C, H, W] input, got ",
               x.str());
  return device;
}

PoolGeometry avg_geometry(int64_t H, int64_t W, const AvgPool2dArgs& a) {
  PoolGeometry g;
  g.H = H;
  g.W = W;
  g.out_h = avg_pool_out_size(H, a.kernel_h, a.stride_h, a.pad_h, a.ceil_mode);
  g.out_w = avg_pool_out_size(W, a.kernel_w, a.stride_w, a.pad_w, a.ceil_mode);
  g.args = a;
  return g;
}

PoolGeometry adaptive_geometry(int64_t H, int64_t W, int64_t oh, int64_t ow) {
  PoolGeometry g;
  g.H = H;
  g.W = W;
  g.out_h = oh;
  g.out_w = ow;
  g.adaptive = true;
  return g;
}

// The gradient's device, after checking it is defined and 4-D.
Device check_grad(const char* op, const Tensor& g) {
  TANDEM_CHECK(g.defined() && g.dim() == 4, op, " backward: expected a 4-D gradient, got ",
               g.defined() ? g.str() : "undefined");
  const Device device = common_device(op, {g});
  common_float_dtype(op, {g});
  return device;
}

}  // namespace

int64_t avg_pool_out_size(int64_t in, int64_t k, int64_t s, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - k;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + pad) --out;  // the last window must start inside
  return out;
}

Tensor avg_pool_forward(const Tensor& x, const PoolGeometry& g) {
  const char* op = g.adaptive ? "adaptive_avg_pool2d" : "avg_pool2d";
  profiler::Scope prof_scope(op);
  const Device device = check_input(op, x);
  TANDEM_CHECK(x.size(2) == g.H && x.size(3) == g.W, op, ": input ", x.str(), " does not match the windows' ", g.H,
               "x", g.W, " plane");
  return TANDEM_KERNEL(device, avg_pool_forward)(x, g);
}

Tensor avg_pool_backward(const Tensor& grad, const Shape& input_shape, const PoolGeometry& g) {
  const char* op = g.adaptive ? "adaptive_avg_pool2d" : "avg_pool2d";
  profiler::Scope prof_scope(g.adaptive ? "adaptive_avg_pool2d_backward" : "avg_pool2d_backward");
  const Device device = check_grad(op, grad);
  TANDEM_CHECK(input_shape.size() == 4 && input_shape[2] == g.H && input_shape[3] == g.W && grad.size(2) == g.out_h &&
                   grad.size(3) == g.out_w,
               op, " backward: gradient ", grad.str(), " and input shape ", shape_str(input_shape),
               " do not match the windows (", g.H, "x", g.W, " -> ", g.out_h, "x", g.out_w, ")");
  return TANDEM_KERNEL(device, avg_pool_backward)(grad, input_shape, g);
}

Tensor avg_pool2d_forward(const Tensor& x, const AvgPool2dArgs& a) {
  check_input("avg_pool2d", x);
  TANDEM_CHECK(a.kernel_h > 0 && a.kernel_w > 0 && a.stride_h > 0 && a.stride_w > 0, "avg_pool2d: kernel ",
               a.kernel_h, "x", a.kernel_w, " and stride ", a.stride_h, "x", a.stride_w, " must be positive");
  TANDEM_CHECK(a.pad_h >= 0 && a.pad_w >= 0 && 2 * a.pad_h <= a.kernel_h && 2 * a.pad_w <= a.kernel_w,
               "avg_pool2d: padding ", a.pad_h, "x", a.pad_w, " must be non-negative and at most half the kernel ",
               a.kernel_h, "x", a.kernel_w);
  TANDEM_CHECK(x.size(2) + 2 * a.pad_h >= a.kernel_h && x.size(3) + 2 * a.pad_w >= a.kernel_w, "avg_pool2d: kernel ",
               a.kernel_h, "x", a.kernel_w, " is larger than the padded input ", x.str());
  TANDEM_CHECK(a.divisor_override >= 0, "avg_pool2d: divisor_override must be positive (0: none), got ",
               a.divisor_override);
  return avg_pool_forward(x, avg_geometry(x.size(2), x.size(3), a));
}

Tensor avg_pool2d_backward(const Tensor& g, const Shape& input_shape, const AvgPool2dArgs& a) {
  check_grad("avg_pool2d", g);
  TANDEM_CHECK(input_shape.size() == 4, "avg_pool2d backward: expected a 4-D input shape, got ", shape_str(input_shape));
  return avg_pool_backward(g, input_shape, avg_geometry(input_shape[2], input_shape[3], a));
}

Tensor adaptive_avg_pool2d_forward(const Tensor& x, int64_t oh, int64_t ow) {
  check_input("adaptive_avg_pool2d", x);
  TANDEM_CHECK(oh > 0 && ow > 0, "adaptive_avg_pool2d: output size ", oh, "x", ow, " must be positive");
  return avg_pool_forward(x, adaptive_geometry(x.size(2), x.size(3), oh, ow));
}

Tensor adaptive_avg_pool2d_backward(const Tensor& g, const Shape& input_shape) {
  check_grad("adaptive_avg_pool2d", g);
  TANDEM_CHECK(input_shape.size() == 4, "adaptive_avg_pool2d backward: expected a 4-D input shape, got ",
               shape_str(input_shape));
  return avg_pool_backward(g, input_shape, adaptive_geometry(input_shape[2], input_shape[3], g.size(2), g.size(3)));
}

}  // namespace tandem::kernels
