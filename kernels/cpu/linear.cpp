// CPU linear forward/backward and matmul (kernels/linear.h) under
// tandem::kernels::cpu, on Eigen GEMM.
// Assumes: validated by kernels/linear.cpp; inputs may be non-contiguous
// (copied to contiguous, except that matmul reads a plain transpose of a
// contiguous matrix in place).
// Guarantees: fresh contiguous outputs. Big products are split into row
// blocks of the output, one single-threaded GEMM per block, so each output
// element is computed by exactly one thread in a fixed order.
#include "kernels/linear.h"

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

using detail::CMatMap;
using detail::MatMap;

template <typename T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <typename T>
using CColMap = Eigen::Map<const ColMat<T>, Eigen::Unaligned>;
template <typename T>
using CRowVecMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>, Eigen::Unaligned>;
template <typename T>
using RowVecMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>, Eigen::Unaligned>;

// Chunks of output rows so that each holds >= ~256K multiply-adds.
int64_t row_chunks(int64_t rows, int64_t work_per_row) {
  return detail::num_chunks(rows,
                            std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, work_per_row)));
}

template <typename T>
Tensor forward_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  Tensor y = Tensor::empty({N, O}, x.dtype());
  const CMatMap<T> X(x.data<T>(), N, I), Wm(w.data<T>(), O, I);
  MatMap<T> Y(y.data<T>(), N, O);
  const T* bp = b.defined() ? b.data<T>() : nullptr;
  detail::for_each_chunk(N, row_chunks(N, I * O), [&](int64_t, int64_t r0, int64_t r1) {
    auto rows = Y.middleRows(r0, r1 - r0);
    if (I == 0) {
      rows.setZero();
    } else {
      rows.noalias() = X.middleRows(r0, r1 - r0) * Wm.transpose();
    }
    if (bp) rows.rowwise() += CRowVecMap<T>(bp, O);
  });
  return y;
}

template <typename T>
LinearGrads backward_impl(const Tensor& gy_in, const Tensor& x_in, const Tensor& w_in, bool need_input,
                          bool need_weight, bool need_bias) {
  LinearGrads g;
  if (!need_input && !need_weight && !need_bias) return g;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  const CMatMap<T> GY(gy.data<T>(), N, O), X(x.data<T>(), N, I), Wm(w.data<T>(), O, I);
  if (need_input) {
    g.input = Tensor::empty({N, I}, x.dtype());
    MatMap<T> GX(g.input.data<T>(), N, I);
    detail::for_each_chunk(N, row_chunks(N, I * O), [&](int64_t, int64_t r0, int64_t r1) {
      auto rows = GX.middleRows(r0, r1 - r0);
      if (O == 0) {
        rows.setZero();
      } else {
        rows.noalias() = GY.middleRows(r0, r1 - r0) * Wm;
      }
    });
  }
  if (need_weight) {
    g.weight = Tensor::empty({O, I}, w.dtype());
    MatMap<T> GW(g.weight.data<T>(), O, I);
    detail::for_each_chunk(O, row_chunks(O, N * I), [&](int64_t, int64_t r0, int64_t r1) {
      auto rows = GW.middleRows(r0, r1 - r0);
      if (N == 0) {
        rows.setZero();
      } else {
        rows.noalias() = GY.middleCols(r0, r1 - r0).transpose() * X;
      }
    });
  }
  if (need_bias) {
    g.bias = Tensor::empty({O}, w.dtype());
    RowVecMap<T> GB(g.bias.data<T>(), O);
    if (N == 0) {
      GB.setZero();
    } else {
      GB = GY.colwise().sum();
    }
  }
  return g;
}

// Calls fn(matrix) with an Eigen map of the 2-D tensor t: row-major when t is
// contiguous, column-major when t is the transpose of a contiguous matrix.
template <typename T, typename Fn>
void with_matrix(const Tensor& t, Fn&& fn) {
  const int64_t r = t.size(0), c = t.size(1);
  if (t.is_contiguous()) {
    fn(CMatMap<T>(t.data<T>(), r, c));
  } else if (t.transpose(0, 1).is_contiguous()) {
    fn(CColMap<T>(t.data<T>(), r, c));
  } else {
    const Tensor tc = t.contiguous();
    fn(CMatMap<T>(tc.data<T>(), r, c));
  }
}

template <typename T>
Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  Tensor out = Tensor::empty({M, N}, a.dtype());
  MatMap<T> C(out.data<T>(), M, N);
  if (K == 0) {
    C.setZero();
    return out;
  }
  with_matrix<T>(a, [&](const auto& A) {
    with_matrix<T>(b, [&](const auto& B) {
      detail::for_each_chunk(M, row_chunks(M, K * N), [&](int64_t, int64_t r0, int64_t r1) {
        C.middleRows(r0, r1 - r0).noalias() = A.middleRows(r0, r1 - r0) * B;
      });
    });
  });
  return out;
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_cpu("linear_forward", x);
  return detail::dispatch_float(x.dtype(), "linear_forward",
                                [&](auto t) { return forward_impl<decltype(t)>(x, weight, bias); });
}

LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input,
                            bool need_weight, bool need_bias) {
  detail::check_cpu("linear_backward", x);
  return detail::dispatch_float(x.dtype(), "linear_backward", [&](auto t) {
    return backward_impl<decltype(t)>(grad_out, x, weight, need_input, need_weight, need_bias);
  });
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  detail::check_cpu("matmul", a);
  return detail::dispatch_float(a.dtype(), "matmul", [&](auto t) { return matmul_impl<decltype(t)>(a, b); });
}

}  // namespace tandem::kernels::cpu
