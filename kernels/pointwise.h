// The general elementwise ops: binary ops and comparisons that broadcast (PyTorch's rule), the
// ternary `where`, unary math with its backward, and the dropout mask. float32 and float64 on CPU
// and on CUDA (kernels/cuda/pointwise.cu; the dropout mask float32 only there; the per-element math
// of both is kernels/pointwise_math.h).
// Comparisons return uint8 masks holding 0 or 1: the byte layout of torch.bool, usable as
// `where`'s condition and convertible with .to(kFloat32) for arithmetic. `where` takes a uint8
// condition (nonzero = take a). Outputs are fresh and contiguous; inputs may be strided.
#pragma once

#include <cstdint>

#include "core/random.h"
#include "core/tensor.h"

namespace tandem::kernels {

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Pow, Maximum, Minimum };
enum class CompareOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
enum class UnaryOp : uint8_t { Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Abs };

const char* op_name(BinaryOp op);
const char* op_name(CompareOp op);
const char* op_name(UnaryOp op);

// out = a op b, broadcast; a and b share a float dtype. Same-shape Add, Sub and Mul take the
// elementwise fast paths (kernels/ops.h, TANDEM_OPS_FAST_PATHS).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// out = a op b for a scalar b (PyTorch's Scalar overloads: b cast to a's dtype): Mul takes the
// scale fast path, the other ops a 0-D operand of a's dtype and device.
Tensor binary(BinaryOp op, const Tensor& a, double b);
// The gradient of `binary` with respect to a (which = 0) or b (which = 1), at the broadcast shape
// (the caller sums it back to the operand's shape): grad * d(a op b)/d(operand). y is the forward
// output (used by Div and Pow). Maximum/Minimum split the gradient evenly on ties, and Pow's
// exponent gradient is 0 where a == 0 and b >= 0, both as PyTorch 1.13.
Tensor binary_backward(BinaryOp op, int which, const Tensor& grad, const Tensor& a, const Tensor& b,
                       const Tensor& y);
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);  // uint8 mask, broadcast
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // broadcast over all three

Tensor unary(UnaryOp op, const Tensor& x);
// grad * d op(x)/dx from x and the forward output y (same shapes).
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y);

// A tensor of `shape` whose elements are 0 with probability p and 1/(1-p) otherwise, so a seed of
// gen fixes the mask. p in [0, 1). CPU: drawn in flat order from gen (one uniform() per element).
// CUDA: one next_u64() of gen seeds a counter-based generator evaluated per element, so the mask
// differs from the CPU's for the same seed (same distribution; gen advances by one draw).
Tensor dropout_mask(const Shape& shape, double p, DType dtype, Device device, Generator& gen);

}  // namespace tandem::kernels
