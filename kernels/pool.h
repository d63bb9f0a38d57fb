// max_pool2d over x [N, C, H, W]; output [N, C, P, Q] with
// P = (H + 2*pad_h - kernel_h) / stride_h + 1 (floor mode, as PyTorch's
// default). indices (int64, same shape as output) hold the flat position
// h*W + w of each maximum within its input plane, as PyTorch's do; ties go to
// the first maximum in scan order; padding never wins.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

struct MaxPool2dArgs {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
};

struct MaxPool2dForward {
  Tensor output, indices;
};

MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& args);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape);

namespace cpu {
MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& args);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape);
}  // namespace cpu

namespace cuda {
MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& args);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape);
}  // namespace cuda

}  // namespace tandem::kernels
