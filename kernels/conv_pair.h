// A ResNet block's first convolution and its shortcut projection, which read the same input, as one op:
// main = conv2d(x, main_weight, stride 2, padding 1) with a 3x3 kernel and projection = conv2d(x,
// projection_weight, stride 2, padding 0) with a 1x1 kernel, no biases. On the CPU, float32 with the
// stride-2 direct kernels (kernels/cpu/conv_strided.h, AVX-512 builds) and no oneDNN conv for the 3x3,
// both come from one pass over the input's phase planes: the projection reads the plane of the 3x3's
// centre tap (no gather of the even pixels), its input gradient is one more input of that tap's phase
// (x's gradient comes out as the sum of both convs', with no separate scatter and no addition pass),
// and its weight gradient reads the same planes. Elsewhere the kernel runs the two convs one by one (and
// adds their input gradients); callers may compose them instead where conv2d_pair_applies is false.
// Entry points: kernels/conv.cpp.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

struct Conv2dPair {
  Tensor main, projection;  // [N, K3, P, Q] and [N, K1, P, Q], P = (H - 1) / 2 + 1, Q likewise
};

struct Conv2dPairGrads {
  Tensor input, main_weight, projection_weight;  // each undefined unless asked for
};

// The table op (kernels/ops.h, CPU only): x [N, C, H, W], main_weight [K3, C, 3, 3], projection_weight
// [K1, C, 1, 1], float32 or float64.
Conv2dPair conv2d_pair_forward(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight);
// grad_main [N, K3, P, Q] and grad_projection [N, K1, P, Q]; either may be undefined (nothing flowed
// there: read as zeros).
Conv2dPairGrads conv2d_pair_backward(const Tensor& grad_main, const Tensor& grad_projection, const Tensor& x,
                                     const Tensor& main_weight, const Tensor& projection_weight, bool need_input,
                                     bool need_main_weight, bool need_projection_weight);

// Whether the op takes these operands on their backend (a CPU tensor, the shapes above, float32 or
// float64); callers compose two conv2d calls elsewhere.
bool conv2d_pair_applies(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight);

}  // namespace tandem::kernels
