// Average pooling over x [N, C, H, W] (or [C, H, W]: the callers add the batch dimension), float32
// and float64 on CPU (a CUDA tensor throws "<op>: no CUDA kernel yet").
//   avg_pool2d: windows of kernel_h x kernel_w every stride, zero padding pad; output size
//     floor((H + 2 pad - k) / s) + 1, or ceil(...) in ceil_mode where the last window must start
//     inside the input or its left padding (PyTorch's rule). The divisor is the window's size
//     clipped to the padded input when count_include_pad, else to the input alone.
//   adaptive_avg_pool2d: output [out_h, out_w]; window i spans [floor(i H / out_h), ceil((i+1) H /
//     out_h)), as PyTorch.
// Backward spreads each output gradient evenly (grad / divisor) over its window.
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace tandem::kernels {

struct AvgPool2dArgs {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
  bool ceil_mode = false, count_include_pad = true;
};

Tensor avg_pool2d_forward(const Tensor& x, const AvgPool2dArgs& args);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const AvgPool2dArgs& args);
Tensor adaptive_avg_pool2d_forward(const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape);

// The output length of avg_pool2d along one dimension.
int64_t avg_pool_out_size(int64_t in, int64_t k, int64_t s, int64_t pad, bool ceil_mode);

namespace cpu {
// One rectangle window per output position: rows [h0, h1), cols [w0, w1) clipped to the input,
// and the divisor.
struct PoolWindows {
  int64_t out_h = 0, out_w = 0;
  std::function<void(int64_t p, int64_t q, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1, double& div)> at;
};
Tensor avg_pool_forward(const Tensor& x, const PoolWindows& windows);
Tensor avg_pool_backward(const Tensor& grad_out, const Shape& input_shape, const PoolWindows& windows);
}  // namespace cpu

}  // namespace tandem::kernels
