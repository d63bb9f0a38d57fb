// Average pooling over x [N, C, H, W] (or [C, H, W]: the callers add the batch dimension), float32
// and float64 on CPU, float32 on CUDA (kernels/cuda/avg_pool.cu).
//   avg_pool2d: windows of kernel_h x kernel_w every stride, zero padding pad; output size
//     floor((H + 2 pad - k) / s) + 1, or ceil(...) in ceil_mode where the last window must start
//     inside the input or its left padding (PyTorch's rule). The divisor is the window's size
//     clipped to the padded input when count_include_pad, else to the input alone, unless
//     divisor_override is > 0 (then it is the divisor of every window, as PyTorch's).
//   adaptive_avg_pool2d: output [out_h, out_w]; window i spans [floor(i H / out_h), ceil((i+1) H /
//     out_h)), as PyTorch.
// Backward spreads each output gradient evenly (grad / divisor) over its window.
#pragma once

#include <cstdint>
#include "kernels/functors.h"  // TANDEM_HD

#include "core/tensor.h"

namespace tandem::kernels {

struct AvgPool2dArgs {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
  bool ceil_mode = false, count_include_pad = true;
  int64_t divisor_override = 0;  // > 0: the divisor of every window
};

// The op table's entry points (kernels/ops.h): the windows as made by the functions below.
struct PoolGeometry;
Tensor avg_pool_forward(const Tensor& x, const PoolGeometry& geometry);
Tensor avg_pool_backward(const Tensor& grad_out, const Shape& input_shape, const PoolGeometry& geometry);

Tensor avg_pool2d_forward(const Tensor& x, const AvgPool2dArgs& args);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const AvgPool2dArgs& args);
Tensor adaptive_avg_pool2d_forward(const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape);

// The output length of avg_pool2d along one dimension.
int64_t avg_pool_out_size(int64_t in, int64_t k, int64_t s, int64_t pad, bool ceil_mode);

// The windows of one pooling as plain values (the CUDA kernels take it by value): output (p, q)
// averages rows [h0, h1) and columns [w0, w1) of the input, clipped to it, divided by div.
struct PoolGeometry {
  int64_t H = 0, W = 0, out_h = 0, out_w = 0;
  bool adaptive = false;
  AvgPool2dArgs args;

  TANDEM_HD void window(int64_t p, int64_t q, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1,
                        double& div) const {
    if (adaptive) {
      h0 = p * H / out_h;
      h1 = ((p + 1) * H + out_h - 1) / out_h;
      w0 = q * W / out_w;
      w1 = ((q + 1) * W + out_w - 1) / out_w;
      div = static_cast<double>((h1 - h0) * (w1 - w0));
      return;
    }
    const AvgPool2dArgs& a = args;
    h0 = p * a.stride_h - a.pad_h;
    w0 = q * a.stride_w - a.pad_w;
    h1 = h0 + a.kernel_h < H + a.pad_h ? h0 + a.kernel_h : H + a.pad_h;
    w1 = w0 + a.kernel_w < W + a.pad_w ? w0 + a.kernel_w : W + a.pad_w;
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = h0 > 0 ? h0 : 0;
    w0 = w0 > 0 ? w0 : 0;
    h1 = h1 < H ? h1 : H;
    w1 = w1 < W ? w1 : W;
    div = static_cast<double>(a.divisor_override > 0 ? a.divisor_override
                                                     : a.count_include_pad ? padded : (h1 - h0) * (w1 - w0));
  }

  // Output rows [p0, p1] and columns [q0, q1] whose windows may cover input (h, w): a superset of
  // those that do (the backward of the CUDA kernel checks each with window()).
  TANDEM_HD void covering(int64_t h, int64_t w, int64_t& p0, int64_t& p1, int64_t& q0, int64_t& q1) const {
    candidates(h, H, out_h, args.kernel_h, args.stride_h, args.pad_h, p0, p1);
    candidates(w, W, out_w, args.kernel_w, args.stride_w, args.pad_w, q0, q1);
  }

 private:
  TANDEM_HD void candidates(int64_t i, int64_t in, int64_t out, int64_t k, int64_t s, int64_t pad, int64_t& lo,
                            int64_t& hi) const {
    if (adaptive) {
      lo = i * out / in - 1;
      hi = ((i + 1) * out + in - 1) / in;
    } else {
      lo = i + pad - k < 0 ? 0 : (i + pad - k) / s;
      hi = (i + pad) / s;
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < out - 1 ? hi : out - 1;
  }
};

}  // namespace tandem::kernels
