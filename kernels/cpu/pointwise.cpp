// CPU kernels of kernels/pointwise.h under tandem::kernels::cpu,
// registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/pointwise.cpp (shapes broadcast, float dtypes shared).
// Guarantees: fresh contiguous outputs of the broadcast shape; per-element math in the element
// type (float or double), kernels/pointwise_math.h (shared with the CUDA kernels).
#include "kernels/ops.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/view.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/strided.h"
#include "kernels/pointwise_math.h"

namespace tandem::kernels::cpu {
namespace {

using math::apply_binary;
using math::apply_binary_grad;
using math::apply_compare;
using math::apply_unary;
using math::apply_unary_grad;

// Calls fn(std::integral_constant<BinaryOp, op>): each op gets its own loop with the switch of
// apply_binary folded away.
template <typename Fn>
decltype(auto) on_binary(BinaryOp op, Fn&& fn) {
  using B = BinaryOp;
  switch (op) {
    case B::Add: return fn(std::integral_constant<B, B::Add>{});
    case B::Sub: return fn(std::integral_constant<B, B::Sub>{});
    case B::Mul: return fn(std::integral_constant<B, B::Mul>{});
    case B::Div: return fn(std::integral_constant<B, B::Div>{});
    case B::Pow: return fn(std::integral_constant<B, B::Pow>{});
    case B::Maximum: return fn(std::integral_constant<B, B::Maximum>{});
    case B::Minimum: return fn(std::integral_constant<B, B::Minimum>{});
  }
  TANDEM_FAIL("binary: unknown op");
}

template <typename Fn>
Tensor float_op(const char* op, DType dtype, Fn&& fn) {
  return detail::dispatch_float(dtype, op, std::forward<Fn>(fn));
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), op_name(op));
  return float_op(op_name(op), a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, a.dtype());
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    T* o = out.data<T>();
    on_binary(op, [&](auto opc) {
      detail::for_each_strided<2>(shape, {detail::broadcast_strides(a, shape), detail::broadcast_strides(b, shape)},
                                  [&](int64_t i, const std::array<int64_t, 2>& off) {
                                    o[i] = apply_binary<T>(decltype(opc)::value, ap[off[0]], bp[off[1]]);
                                  });
    });
    return out;
  });
}

Tensor binary_backward(BinaryOp op, int which, const Tensor& grad, const Tensor& a, const Tensor& b,
                       const Tensor& y) {
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), op_name(op));
  TANDEM_CHECK(grad.shape() == shape, op_name(op), " backward: gradient ", grad.str(), ", expected shape ",
               shape_str(shape));
  return float_op(op_name(op), a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, a.dtype());
    const T* gp = grad.data<T>();
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    const bool has_y = y.defined();
    const T* yp = has_y ? y.data<T>() : nullptr;
    T* o = out.data<T>();
    const std::array<Shape, 4> strides = {detail::broadcast_strides(grad, shape), detail::broadcast_strides(a, shape),
                                          detail::broadcast_strides(b, shape),
                                          has_y ? detail::broadcast_strides(y, shape) : Shape(shape.size(), 0)};
    on_binary(op, [&](auto opc) {
      detail::for_each_strided<4>(shape, strides, [&](int64_t i, const std::array<int64_t, 4>& off) {
        o[i] = apply_binary_grad<T>(decltype(opc)::value, which, gp[off[0]], ap[off[1]], bp[off[2]],
                                    has_y ? yp[off[3]] : T(0));
      });
    });
    return out;
  });
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), op_name(op));
  return float_op(op_name(op), a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, kUInt8);
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    uint8_t* o = out.data<uint8_t>();
    detail::for_each_strided<2>(shape, {detail::broadcast_strides(a, shape), detail::broadcast_strides(b, shape)},
                                [&](int64_t i, const std::array<int64_t, 2>& off) {
                                  o[i] = apply_compare<T>(op, ap[off[0]], bp[off[1]]) ? 1 : 0;
                                });
    return out;
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape shape =
      views::broadcast_shapes(cond.shape(), views::broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  return float_op("where", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, a.dtype());
    const uint8_t* cp = cond.data<uint8_t>();
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    T* o = out.data<T>();
    detail::for_each_strided<3>(shape,
                                {detail::broadcast_strides(cond, shape), detail::broadcast_strides(a, shape),
                                 detail::broadcast_strides(b, shape)},
                                [&](int64_t i, const std::array<int64_t, 3>& off) {
                                  o[i] = cp[off[0]] ? ap[off[1]] : bp[off[2]];
                                });
    return out;
  });
}

namespace {

// GELU (erf form) on float32 as Eigen packet expressions: Eigen's vectorised erf (a rational
// approximation within a few ulp of std::erf) and exp, as PyTorch's vectorised CPU kernel
// approximates erf too. Double keeps std::erf.
void gelu_float(const float* x, float* y, int64_t n) {
  const detail::CArrMap<float> xa(x, n);
  detail::ArrMap<float>(y, n) = xa * 0.5f * (1.0f + (xa * float(math::kSqrt1_2)).erf());
}

// At x = +-inf the derivative is NaN, as PyTorch's (x * pdf(x) is inf * 0). It is set explicitly:
// the vectorised exp of some SIMD levels clamps its argument, so exp(-inf) comes out tiny, not 0.
// The fix-up is its own pass: Eigen's select() over the whole expression is not vectorised, so it
// would evaluate erf and exp one lane at a time (~15x slower).
void gelu_backward_float(const float* g, const float* x, float* out, int64_t n) {
  const detail::CArrMap<float> xa(x, n), ga(g, n);
  detail::ArrMap<float>(out, n) = ga * (0.5f * (1.0f + (xa * float(math::kSqrt1_2)).erf()) +
                                        xa * float(math::kInvSqrt2Pi) * (-0.5f * xa.square()).exp());
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(x[i])) out[i] = std::numeric_limits<float>::quiet_NaN();
  }
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const Tensor x = x_in.contiguous();
  return float_op(op_name(op), x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(x.shape(), x.dtype());
    const T* xp = x.data<T>();
    T* o = out.data<T>();
    detail::parallel_range(x.numel(), int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
      if constexpr (std::is_same_v<T, float>) {
        if (op == UnaryOp::Gelu) return gelu_float(xp + i0, o + i0, i1 - i0);
      }
      for (int64_t i = i0; i < i1; ++i) o[i] = apply_unary<T>(op, xp[i]);
    });
    return out;
  });
}

Tensor unary_backward(UnaryOp op, const Tensor& g_in, const Tensor& x_in, const Tensor& y_in) {
  const Tensor g = g_in.contiguous(), x = x_in.contiguous(), y = y_in.contiguous();
  return float_op(op_name(op), x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(x.shape(), x.dtype());
    const T* gp = g.data<T>();
    const T* xp = x.data<T>();
    const T* yp = y.data<T>();
    T* o = out.data<T>();
    detail::parallel_range(x.numel(), int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
      if constexpr (std::is_same_v<T, float>) {
        if (op == UnaryOp::Gelu) return gelu_backward_float(gp + i0, xp + i0, o + i0, i1 - i0);
      }
      for (int64_t i = i0; i < i1; ++i) o[i] = apply_unary_grad<T>(op, gp[i], xp[i], yp[i]);
    });
    return out;
  });
}

Tensor dropout_mask(const Shape& shape, double p, DType dtype, Device /*device: the CPU*/, Generator& gen) {
  return float_op("dropout", dtype, [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, dtype);
    T* o = out.data<T>();
    const T keep = T(1.0 / (1.0 - p));
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = math::dropout_value<T>(gen.uniform(), p, keep);
    return out;
  });
}

}  // namespace tandem::kernels::cpu
