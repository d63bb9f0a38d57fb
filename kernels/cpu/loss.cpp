// CPU log_softmax over the last dim of [N, C] (softmax_forward/backward's fast path) and nll_loss's
// fast path, the mean over the rows whose target is not ignore_index (kernels/loss.h), under
// tandem::kernels::cpu.
// Assumes: validated by kernels/loss.cpp (ranks, shapes, int64 targets);
// inputs may be non-contiguous. Target values are checked here, where the
// data is readable: a value outside [0, C) throws naming the row and value.
// class_targets: cross_entropy's target pass (kernels/loss.h), throwing at the first bad target.
// Guarantees: PyTorch's semantics (max-shifted log-sum-exp, NaN rows for +-inf maxima; loss = -mean of
// the picked log-probabilities of the kept rows, a 0-D tensor of the input's dtype; NaN with a zero
// gradient when no row is kept). Rows are
// split across the pool only when there are many of them; a row's exp, sums and maximum are Eigen's
// vectorised ones.
#include "kernels/ops.h"

#include <cmath>

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

// One row of a [N, C] matrix as an Eigen array (vectorised exp, sums and maxima).
template <typename T>
using Row = Eigen::Array<T, 1, Eigen::Dynamic>;

int64_t row_grain(int64_t C) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)); }

template <typename T>
Tensor log_softmax_impl(const Tensor& x_in) {
  const Tensor x = x_in.contiguous();
  const int64_t N = x.size(0), C = x.size(1);
  Tensor y = Tensor::empty({N, C}, x.dtype());
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  if (C == 0) return y;
  detail::parallel_range(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Eigen::Map<const Row<T>> xr(xp + r * C, C);
      // A NaN anywhere makes exp's sum NaN, and a +-inf maximum makes x - m NaN: NaN rows either way,
      // whichever element maxCoeff picks.
      const T m = xr.maxCoeff();
      const T ls = std::log((xr - m).exp().sum());
      Eigen::Map<Row<T>>(yp + r * C, C) = (xr - m) - ls;  // (x - max) first, as PyTorch
    }
  });
  return y;
}

template <typename T>
Tensor log_softmax_backward_impl(const Tensor& gy_in, const Tensor& y_in) {
  const Tensor gy = gy_in.contiguous(), y = y_in.contiguous();
  const int64_t N = y.size(0), C = y.size(1);
  Tensor gx = Tensor::empty({N, C}, y.dtype());
  const T* gp = gy.data<T>();
  const T* yp = y.data<T>();
  T* op = gx.data<T>();
  detail::parallel_range(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Eigen::Map<const Row<T>> g(gp + r * C, C), yr(yp + r * C, C);
      const T s = g.sum();
      Eigen::Map<Row<T>>(op + r * C, C) = g - yr.exp() * s;
    }
  });
  return gx;
}

// The number of kept rows (target != ignore_index); throws at a target neither kept in range nor ignored.
int64_t check_targets(const int64_t* t, int64_t N, int64_t C, int64_t ignore_index) {
  int64_t kept = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (t[i] == ignore_index) continue;
    TANDEM_CHECK(t[i] >= 0 && t[i] < C, "nll_loss (cross_entropy's too): target[", i, "] = ", t[i],
                 " is out of range; expected a class index in [0, ", C, ") or ignore_index ", ignore_index);
    ++kept;
  }
  return kept;
}

template <typename T>
Tensor nll_forward_impl(const Tensor& lp_in, const Tensor& target_in, int64_t ignore_index) {
  const Tensor lp = lp_in.contiguous(), target = target_in.contiguous();
  const int64_t N = lp.size(0), C = lp.size(1);
  const T* p = lp.data<T>();
  const int64_t* t = target.data<int64_t>();
  const int64_t kept = check_targets(t, N, C, ignore_index);
  double sum = 0;
  for (int64_t i = 0; i < N; ++i)
    if (t[i] != ignore_index) sum += double(p[i * C + t[i]]);
  Tensor loss = Tensor::empty({}, lp.dtype());
  *loss.data<T>() = T(-sum / double(kept));  // nothing kept: 0 / 0 = NaN, as PyTorch
  return loss;
}

template <typename T>
Tensor nll_backward_impl(const Tensor& gy, const Tensor& lp, const Tensor& target_in, int64_t ignore_index) {
  const Tensor target = target_in.contiguous();
  const int64_t N = lp.size(0), C = lp.size(1);
  const int64_t* t = target.data<int64_t>();
  const int64_t kept = check_targets(t, N, C, ignore_index);
  const T g = gy.contiguous().data<T>()[0];
  Tensor gx = Tensor::zeros({N, C}, lp.dtype());
  if (kept == 0) return gx;  // the NaN mean has a zero gradient, as PyTorch's
  T* op = gx.data<T>();
  const T v = -g / T(kept);
  for (int64_t i = 0; i < N; ++i)
    if (t[i] != ignore_index) op[i * C + t[i]] = v;
  return gx;
}

}  // namespace

Tensor log_softmax_forward(const Tensor& x) {
  detail::check_cpu("log_softmax_forward", x);
  return detail::dispatch_float(x.dtype(), "log_softmax_forward",
                                [&](auto t) { return log_softmax_impl<decltype(t)>(x); });
}

Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& y) {
  detail::check_cpu("log_softmax_backward", y);
  return detail::dispatch_float(y.dtype(), "log_softmax_backward",
                                [&](auto t) { return log_softmax_backward_impl<decltype(t)>(grad_out, y); });
}

Tensor nll_loss_mean_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index) {
  detail::check_cpu("nll_loss_forward", log_probs);
  return detail::dispatch_float(log_probs.dtype(), "nll_loss_forward", [&](auto t) {
    return nll_forward_impl<decltype(t)>(log_probs, target, ignore_index);
  });
}

Tensor nll_loss_mean_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target,
                              int64_t ignore_index) {
  detail::check_cpu("nll_loss_backward", log_probs);
  return detail::dispatch_float(log_probs.dtype(), "nll_loss_backward", [&](auto t) {
    return nll_backward_impl<decltype(t)>(grad_out, log_probs, target, ignore_index);
  });
}

ClassTargets class_targets(const Tensor& target, int64_t C, int64_t ignore_index, DType keep_dtype) {
  const int64_t M = target.numel();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  ClassTargets r{Tensor::empty({M}, keep_dtype), Tensor::empty({M, 1}, kInt64)};
  for (int64_t i = 0; i < M; ++i) {
    const bool ignored = t[i] == ignore_index;
    TANDEM_CHECK(ignored || (t[i] >= 0 && t[i] < C), "nll_loss (cross_entropy's too): target ", t[i], " at position ", i,
                 " is out of range for ", C, " classes (expected 0 <= target < ", C, " or ignore_index ",
                 ignore_index, ")");
    if (keep_dtype == kFloat64) {
      r.keep.data<double>()[i] = ignored ? 0.0 : 1.0;
    } else {
      r.keep.data<float>()[i] = ignored ? 0.0f : 1.0f;
    }
    r.safe.data<int64_t>()[i] = ignored ? 0 : t[i];
  }
  return r;
}

}  // namespace tandem::kernels::cpu
