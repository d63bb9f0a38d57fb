// CPU fast paths of binary, sum_dims and argmax_dim (kernels/ops.h, TANDEM_OPS_FAST_PATHS) under
// tandem::kernels::cpu: add, sub, mul, scale, sum, argmax.
// Assumes: validated by the entry points (kernels/pointwise.cpp, kernels/reduce.cpp: same shapes, float dtypes);
// inputs may be non-contiguous.
// Guarantees: fresh contiguous outputs. sum cuts the data into fixed blocks
// summed vectorised in the element type, blocks accumulated in double, chunk
// partials added in chunk order (deterministic for a given thread count).
// argmax returns int64 [N]: the first maximum of each row, a NaN counting as
// the maximum (as PyTorch).
#include "kernels/ops.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kGrain = int64_t{1} << 16;

template <typename T, typename Op>
Tensor binary(const Tensor& a_in, const Tensor& b_in, Op op) {
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  T* op_ = out.data<T>();
  detail::parallel_range(a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) op_[i] = op(ap[i], bp[i]);
  });
  return out;
}

template <typename T>
Tensor scale_impl(const Tensor& a_in, double s) {
  const Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  const T* ap = a.data<T>();
  T* op = out.data<T>();
  const T f = T(s);
  detail::parallel_range(a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) op[i] = ap[i] * f;
  });
  return out;
}

template <typename T>
Tensor sum_impl(const Tensor& a_in) {
  const Tensor a = a_in.contiguous();
  const T* ap = a.data<T>();
  const int64_t n = a.numel();
  constexpr int64_t kBlock = 1024;
  const int64_t chunks = detail::num_chunks(n, kGrain);
  std::vector<double> partial(chunks, 0.0);
  detail::for_each_chunk(n, chunks, [&](int64_t c, int64_t i0, int64_t i1) {
    double acc = 0;
    for (int64_t i = i0; i < i1; i += kBlock) {
      acc += detail::CArrMap<T>(ap + i, std::min(kBlock, i1 - i)).sum();
    }
    partial[c] = acc;
  });
  double total = 0;
  for (double p : partial) total += p;
  Tensor out = Tensor::empty({}, a.dtype());
  *out.data<T>() = T(total);
  return out;
}

template <typename T>
Tensor argmax_impl(const Tensor& a_in) {
  const Tensor a = a_in.contiguous();
  const int64_t N = a.size(0), C = a.size(1);
  Tensor out = Tensor::empty({N}, kInt64);
  const T* ap = a.data<T>();
  int64_t* op = out.data<int64_t>();
  detail::parallel_range(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, C)),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t r = r0; r < r1; ++r) {
                             const T* row = ap + r * C;
                             int64_t best = 0;
                             for (int64_t c = 1; c < C && !std::isnan(row[best]); ++c) {
                               if (row[c] > row[best] || std::isnan(row[c])) best = c;
                             }
                             op[r] = best;
                           }
                         });
  return out;
}

template <typename Fn>
Tensor float_op(const char* op, const Tensor& t, Fn&& fn) {
  detail::check_cpu(op, t);
  return detail::dispatch_float(t.dtype(), op, std::forward<Fn>(fn));
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return float_op("add", a, [&](auto t) {
    using T = decltype(t);
    return binary<T>(a, b, [](T x, T y) { return x + y; });
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return float_op("sub", a, [&](auto t) {
    using T = decltype(t);
    return binary<T>(a, b, [](T x, T y) { return x - y; });
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return float_op("mul", a, [&](auto t) {
    using T = decltype(t);
    return binary<T>(a, b, [](T x, T y) { return x * y; });
  });
}

Tensor scale(const Tensor& a, double s) {
  return float_op("scale", a, [&](auto t) { return scale_impl<decltype(t)>(a, s); });
}

Tensor sum(const Tensor& a) {
  return float_op("sum", a, [&](auto t) { return sum_impl<decltype(t)>(a); });
}

Tensor argmax(const Tensor& a) {
  return float_op("argmax", a, [&](auto t) { return argmax_impl<decltype(t)>(a); });
}

}  // namespace tandem::kernels::cpu
