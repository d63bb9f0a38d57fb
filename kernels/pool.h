// max_pool2d over x [N, C, H, W]; output [N, C, P, Q]. Output row p takes input rows
// h0 + i*dilation_h (i < kernel_h, h0 = p*stride_h - pad_h) that lie inside the input, and
// P = floor((H + 2 pad_h - dilation_h (kernel_h - 1) - 1) / stride_h) + 1, or ceil(...) in ceil_mode
// where the last window must start inside the input or its left padding (PyTorch's rule); columns
// likewise. Adaptive pooling (adaptive_h, adaptive_w > 0: the output size) takes rows
// [floor(p H / P), ceil((p+1) H / P)), as adaptive_avg_pool2d, and ignores kernel, stride, padding.
// indices (int64, same shape as output) hold the flat position h*W + w of each maximum within its
// input plane, as PyTorch's do; ties go to the first maximum in scan order, a NaN wins (the last
// NaN of the window); padding never wins.
#pragma once

#include "core/tensor.h"
#include "kernels/functors.h"  // TANDEM_HD

namespace tandem::kernels {

struct MaxPool2dArgs {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool ceil_mode = false;
  int64_t adaptive_h = 0, adaptive_w = 0;  // > 0: adaptive max pooling to this output size
};

// One axis of a max pooling: the output size and each output position's window, as plain values
// (the CUDA kernels take them by value).
struct MaxPoolAxis {
  int64_t in = 0, out = 0, kernel = 1, stride = 1, pad = 0, dilation = 1;
  bool adaptive = false;

  // Output position p's window: the input positions first + i*step for i < count, all inside the input.
  TANDEM_HD void window(int64_t p, int64_t& first, int64_t& step, int64_t& count) const {
    if (adaptive) {
      first = p * in / out;
      step = 1;
      count = ((p + 1) * in + out - 1) / out - first;
      return;
    }
    int64_t start = p * stride - pad;
    const int64_t span_end = start + dilation * (kernel - 1) + 1;
    const int64_t end = span_end < in ? span_end : in;
    while (start < 0) start += dilation;
    first = start;
    step = dilation;
    count = start < end ? (end - start + dilation - 1) / dilation : 0;
  }
};

// The two axes of x [N, C, H, W] under `args` (validated by the entry point).
MaxPoolAxis max_pool_axis_h(const Shape& input, const MaxPool2dArgs& args);
MaxPoolAxis max_pool_axis_w(const Shape& input, const MaxPool2dArgs& args);

struct MaxPool2dForward {
  Tensor output, indices;
};

MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& args);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape);

}  // namespace tandem::kernels
