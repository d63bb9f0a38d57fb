// Mixed-precision kernels: fast dtype casts, low-precision (f16/bf16) conv2d and linear, and the
// GradScaler's fused unscale + non-finite check.
// Owns: the entry points autocast (nn/functional.cpp) and GradScaler (optim/grad_scaler.cpp) call.
// Assumes: low-precision operands all share one dtype (kFloat16 or kBFloat16) and one device
//   (a conv's input may be float32, below).
// Guarantees:
//  - cast: f32 <-> f16/bf16 round to nearest even (as PyTorch); result contiguous; itself when the
//    dtype already matches.
//  - lowp_*: outputs and gradients have the operands' low-precision dtype; accumulation is f32. On
//    CUDA they run cuDNN / cuBLAS half paths (CUDNN_DATA_HALF/BFLOAT16 with float compute,
//    cublasGemmEx with CUBLAS_COMPUTE_32F). On CPU, bf16 runs on oneDNN (AMX or AVX512_BF16, chosen
//    at run time; f32 accumulation, operands read as they are, the output rounded once) where the
//    CPU has the instructions (cpu_bf16_pays()); elsewhere, and for f16, it is emulated: the
//    low-precision operands are widened to f32 exactly, the f32 kernels run, and the results are
//    rounded to the low-precision dtype ("f32 math on rounded inputs, rounded output").
//  - lowp_conv2d_*: the input x may also be float32 (weight, bias and grad_out carry the
//    low-precision dtype d): x is rounded to d as part of the op (on the CPU inside oneDNN's input
//    reorder, no separate pass), and its gradient comes back in float32 (the d gradient widened
//    exactly): the same numbers as casting x to d first, without the cast's two passes.
//  - autocast_conv2d_in_f32: where autocast's conv2d computes in float32 instead, because the
//    engine's f32 kernels beat oneDNN's bf16 there (measured by bench/kernels_bench's Conv2d cases):
//    CPU, a float32 weight, and one input channel (kernels/cpu/conv_c1.h), a 3x3 stride-1 pad-1
//    layer with fewer than 16 input or output channels (kernels/cpu/conv3x3.h), or a 1x1 stride-2
//    projection of at most 64 channels (kernels/cpu/conv_strided.h). Autocast then runs
//    the f32 conv on the unrounded operands and rounds its output to the autocast dtype:
//    autocast_f32_conv2d_forward (the rounding fused into the one-channel kernel's stores on CPUs
//    with AVX-512, else a cast), whose backward autocast_f32_conv2d_backward takes the output's
//    low-precision gradient (read directly by the one-channel weight gradient, else widened) and
//    returns f32 gradients.
//  - unscale_and_check_: grad *= inv_scale in place (f32 grads, contiguous) and found_inf (a
//    1-element f32 tensor on the grad's device) is set to 1 if any element of grad, before
//    scaling, is inf or NaN; never reset to 0 here. On CUDA nothing waits for the device.
#pragma once

#include "core/tensor.h"
#include "kernels/conv.h"
#include "kernels/linear.h"

namespace tandem::kernels {

bool is_low_precision(DType t);  // kFloat16 or kBFloat16

Tensor cast(const Tensor& x, DType to);

Tensor lowp_conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args);
Conv2dGrads lowp_conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                 const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias);
Tensor lowp_linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias);
LinearGrads lowp_linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input,
                                 bool need_weight, bool need_bias);
bool autocast_conv2d_in_f32(const Tensor& x, const Tensor& weight, const Conv2dArgs& args);
Tensor autocast_f32_conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args,
                                   DType out);
Conv2dGrads autocast_f32_conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                         const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias);

void unscale_and_check_(const Tensor& grad, const Tensor& found_inf, double inv_scale);

// Whether bf16 conv2d/linear pay on this CPU: true where they run natively (oneDNN on AMX tiles or
// AVX512_BF16, chosen at run time from CPUID), false where they would be emulated through f32
// (slower than f32 itself). What `--amp` with no value should consult for a CPU device.
bool cpu_bf16_pays();

}  // namespace tandem::kernels
