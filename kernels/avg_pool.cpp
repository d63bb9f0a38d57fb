// Device-neutral entry points of kernels/avg_pool.h: checks (rank, sizes, dtype, CPU only), the
// window geometry of each pooling, then the shared CPU kernel.
#include "kernels/avg_pool.h"

#include <algorithm>

#include "core/profiler.h"
#include "kernels/dispatch.h"

namespace tandem::kernels {
namespace {

void check_input(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.defined(), op, ": input is undefined");
  require_cpu_kernel(op, {x});
  common_float_dtype(op, {x});
  TANDEM_CHECK(x.dim() == 4 && x.size(2) > 0 && x.size(3) > 0, op, ": expected a non-empty [N, C, H, W] input, got ",
               x.str());
}

cpu::PoolWindows avg_windows(int64_t H, int64_t W, const AvgPool2dArgs& a) {
  cpu::PoolWindows w;
  w.out_h = avg_pool_out_size(H, a.kernel_h, a.stride_h, a.pad_h, a.ceil_mode);
  w.out_w = avg_pool_out_size(W, a.kernel_w, a.stride_w, a.pad_w, a.ceil_mode);
  w.at = [=](int64_t p, int64_t q, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1, double& div) {
    h0 = p * a.stride_h - a.pad_h;
    w0 = q * a.stride_w - a.pad_w;
    h1 = std::min(h0 + a.kernel_h, H + a.pad_h);
    w1 = std::min(w0 + a.kernel_w, W + a.pad_w);
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = std::max<int64_t>(h0, 0);
    w0 = std::max<int64_t>(w0, 0);
    h1 = std::min(h1, H);
    w1 = std::min(w1, W);
    div = static_cast<double>(a.count_include_pad ? padded : (h1 - h0) * (w1 - w0));
  };
  return w;
}

cpu::PoolWindows adaptive_windows(int64_t H, int64_t W, int64_t oh, int64_t ow) {
  cpu::PoolWindows w;
  w.out_h = oh;
  w.out_w = ow;
  w.at = [=](int64_t p, int64_t q, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1, double& div) {
    h0 = p * H / oh;
    h1 = ((p + 1) * H + oh - 1) / oh;
    w0 = q * W / ow;
    w1 = ((q + 1) * W + ow - 1) / ow;
    div = static_cast<double>((h1 - h0) * (w1 - w0));
  };
  return w;
}

}  // namespace

int64_t avg_pool_out_size(int64_t in, int64_t k, int64_t s, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - k;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + pad) --out;  // the last window must start inside
  return out;
}

Tensor avg_pool2d_forward(const Tensor& x, const AvgPool2dArgs& a) {
  profiler::Scope prof_scope("avg_pool2d");
  check_input("avg_pool2d", x);
  TANDEM_CHECK(a.kernel_h > 0 && a.kernel_w > 0 && a.stride_h > 0 && a.stride_w > 0, "avg_pool2d: kernel ",
               a.kernel_h, "x", a.kernel_w, " and stride ", a.stride_h, "x", a.stride_w, " must be positive");
  TANDEM_CHECK(a.pad_h >= 0 && a.pad_w >= 0 && 2 * a.pad_h <= a.kernel_h && 2 * a.pad_w <= a.kernel_w,
               "avg_pool2d: padding ", a.pad_h, "x", a.pad_w, " must be non-negative and at most half the kernel ",
               a.kernel_h, "x", a.kernel_w);
  TANDEM_CHECK(x.size(2) + 2 * a.pad_h >= a.kernel_h && x.size(3) + 2 * a.pad_w >= a.kernel_w, "avg_pool2d: kernel ",
               a.kernel_h, "x", a.kernel_w, " is larger than the padded input ", x.str());
  return cpu::avg_pool_forward(x, avg_windows(x.size(2), x.size(3), a));
}

Tensor avg_pool2d_backward(const Tensor& g, const Shape& input_shape, const AvgPool2dArgs& a) {
  profiler::Scope prof_scope("avg_pool2d_backward");
  require_cpu_kernel("avg_pool2d", {g});
  return cpu::avg_pool_backward(g, input_shape, avg_windows(input_shape[2], input_shape[3], a));
}

Tensor adaptive_avg_pool2d_forward(const Tensor& x, int64_t oh, int64_t ow) {
  profiler::Scope prof_scope("adaptive_avg_pool2d");
  check_input("adaptive_avg_pool2d", x);
  TANDEM_CHECK(oh > 0 && ow > 0, "adaptive_avg_pool2d: output size ", oh, "x", ow, " must be positive");
  return cpu::avg_pool_forward(x, adaptive_windows(x.size(2), x.size(3), oh, ow));
}

Tensor adaptive_avg_pool2d_backward(const Tensor& g, const Shape& input_shape) {
  profiler::Scope prof_scope("adaptive_avg_pool2d_backward");
  require_cpu_kernel("adaptive_avg_pool2d", {g});
  return cpu::avg_pool_backward(g, input_shape, adaptive_windows(input_shape[2], input_shape[3], g.size(2), g.size(3)));
}

}  // namespace tandem::kernels
