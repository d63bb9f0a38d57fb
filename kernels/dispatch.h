// Internal: the checks the kernel entry points share (operands on one device, of one dtype), before
// they call the kernel of that device's backend (kernels/ops.h: TANDEM_KERNEL).
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace tandem::kernels {

// Throws "<op>: ... built without CUDA ..." (defined in kernels/dispatch.cpp).
[[noreturn]] void throw_no_cuda(const char* op);

// All defined tensors must share one device; returns it.
Device common_device(const char* op, std::initializer_list<Tensor> tensors);

// All defined tensors must share one dtype; returns it.
DType common_dtype(const char* op, std::initializer_list<Tensor> tensors);

// All defined floating tensors must share one dtype, float32 or float64 (a CUDA kernel without a
// float64 path refuses float64 itself, naming the op).
DType common_float_dtype(const char* op, std::initializer_list<Tensor> tensors);

// The device of the one operand x of `op`, which must be defined and of a float dtype.
Device float_operand_device(const char* op, const Tensor& x);

// FLOPs of a convolution with this output shape [N, K, P, Q] and weight [K, C, R, S]: 2*N*P*Q*K*C*R*S
// per GEMM (forward: 1; backward: one per gradient of input or weight asked for; bias not counted).
double conv_gemm_flops(const Shape& out, const Tensor& weight, int gemms);

}  // namespace tandem::kernels
