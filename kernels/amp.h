// Mixed-precision kernels: fast dtype casts, low-precision (f16/bf16) conv2d and linear, and the
// GradScaler's fused unscale + non-finite check.
// Owns: the entry points autocast (nn/functional.cpp) and GradScaler (optim/grad_scaler.cpp) call.
// Assumes: low-precision operands all share one dtype (kFloat16 or kBFloat16) and one device.
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

void unscale_and_check_(const Tensor& grad, const Tensor& found_inf, double inv_scale);

// Whether bf16 conv2d/linear pay on this CPU: true where they run natively (oneDNN on AMX tiles or
// AVX512_BF16, chosen at run time from CPUID), false where they would be emulated through f32
// (slower than f32 itself). What `--amp` with no value should consult for a CPU device.
bool cpu_bf16_pays();

}  // namespace tandem::kernels
