// kernels/attention.h on the CPU: FlashAttention's blocked recurrence with Eigen GEMMs on blocks of
// kRows query rows by kCols key columns, one batch entry per task of the thread pool.
// Forward, per block of query rows: the running row maximum m and sum l of exp(s - m) over the key
// blocks seen so far, the output accumulated unnormalised and rescaled by exp(m_old - m_new) when m
// grows; at the end O = acc / l and lse = m + log(l). The causal mask skips whole key blocks past
// the diagonal and cuts each row of the diagonal block at its own position.
// Backward, per key block and then per query block that sees it: P recomputed from q, k and lse,
// dV += P^T dO, dS = P * (dO V^T - D) * scale, dQ += dS K, dK += dS^T Q; D = rowsum(dO * O) first.
// float32 in a library compiled for AVX-512 runs the same recurrence as vector rows
// (kernels/cpu/attention_rows.h); float64, and float32 at the other levels, the portable rows here
// (simd_path_count's attention_forward / attention_backward record which).
// Assumes L, S >= 1 (kernels/attention.cpp checks). Guarantees: one thread computes a batch entry,
// blocks in a fixed order, so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/ops.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

using detail::CMatMap;
using detail::MatMap;
using detail::RowMat;

using attention::Dims;
using attention::kCols;
using attention::kRows;

// Forward of one batch entry.
template <typename T>
void forward_entry(const Dims& d, T scale, const T* q, const T* k, const T* v, T* o, T* lse, RowMat<T>& s,
                   RowMat<T>& acc, std::vector<T>& m, std::vector<T>& l) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t i0 = 0; i0 < d.L; i0 += kRows) {
    const int64_t rows = std::min(kRows, d.L - i0), jend = d.key_end(i0, rows);
    const CMatMap<T> qb(q + i0 * d.E, rows, d.E);
    auto a = acc.topRows(rows);
    a.setZero();
    std::fill(m.begin(), m.begin() + rows, ninf);
    std::fill(l.begin(), l.begin() + rows, T(0));
    for (int64_t j0 = 0; j0 < jend; j0 += kCols) {
      const int64_t cols = std::min(kCols, jend - j0);
      auto sb = s.topLeftCorner(rows, cols);
      sb.noalias() = qb * CMatMap<T>(k + j0 * d.E, cols, d.E).transpose();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = d.visible(i0 + r, j0, cols);
        auto row = sb.row(r).array();
        if (n == 0) {
          row.setZero();
          continue;
        }
        const T mnew = std::max(m[r], row.head(n).maxCoeff() * scale);
        row.head(n) = (row.head(n) * scale - mnew).exp();
        row.tail(cols - n).setZero();
        const T alpha = std::exp(m[r] - mnew);  // 0 while m[r] is -inf
        l[r] = l[r] * alpha + row.head(n).sum();
        if (alpha != T(1)) a.row(r) *= alpha;
        m[r] = mnew;
      }
      a.noalias() += sb * CMatMap<T>(v + j0 * d.Ev, cols, d.Ev);
    }
    MatMap<T> ob(o + i0 * d.Ev, rows, d.Ev);
    for (int64_t r = 0; r < rows; ++r) {
      ob.row(r) = a.row(r) / l[r];
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// Backward of one batch entry; dq, dk, dv start at zero.
template <typename T>
void backward_entry(const Dims& d, T scale, const T* q, const T* k, const T* v, const T* o, const T* g, const T* lse,
                    T* dq, T* dk, T* dv, RowMat<T>& p, RowMat<T>& dp, std::vector<T>& delta) {
  for (int64_t i = 0; i < d.L; ++i) {
    delta[i] = (CMatMap<T>(g + i * d.Ev, 1, d.Ev).array() * CMatMap<T>(o + i * d.Ev, 1, d.Ev).array()).sum();
  }
  for (int64_t j0 = 0; j0 < d.S; j0 += kCols) {
    const int64_t cols = std::min(kCols, d.S - j0);
    const CMatMap<T> kb(k + j0 * d.E, cols, d.E), vb(v + j0 * d.Ev, cols, d.Ev);
    MatMap<T> dkb(dk + j0 * d.E, cols, d.E), dvb(dv + j0 * d.Ev, cols, d.Ev);
    for (int64_t i0 = d.causal ? j0 / kRows * kRows : 0; i0 < d.L; i0 += kRows) {
      const int64_t rows = std::min(kRows, d.L - i0);
      const CMatMap<T> qb(q + i0 * d.E, rows, d.E), gb(g + i0 * d.Ev, rows, d.Ev);
      auto pb = p.topLeftCorner(rows, cols);
      auto dpb = dp.topLeftCorner(rows, cols);
      pb.noalias() = qb * kb.transpose();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = d.visible(i0 + r, j0, cols);
        auto row = pb.row(r).array();
        row.head(n) = (row.head(n) * scale - lse[i0 + r]).exp();
        row.tail(cols - n).setZero();
      }
      dvb.noalias() += pb.transpose() * gb;
      dpb.noalias() = gb * vb.transpose();
      for (int64_t r = 0; r < rows; ++r) {
        dpb.row(r).array() = pb.row(r).array() * (dpb.row(r).array() - delta[i0 + r]) * scale;
      }
      MatMap<T>(dq + i0 * d.E, rows, d.E).noalias() += dpb * kb;
      dkb.noalias() += dpb.transpose() * qb;
    }
  }
}

// Whether float32 calls run the vector rows of kernels/cpu/attention_rows.h (any shape does).
constexpr bool kVectorRows = kSimdLevel == SimdLevel::avx512;

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// fn(b, scratch) for the B batch entries over the pool, one vector-row scratch per chunk of entries.
template <typename Fn>
void for_entries(int64_t B, const Dims& d, Fn&& fn) {
  detail::parallel_range(B, 1, [&](int64_t b0, int64_t b1) {
    attention::RowScratch w(d);
    for (int64_t b = b0; b < b1; ++b) fn(b, w);
  });
}
#endif

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal) {
  return Dims{q.size(1), k.size(1), q.size(2), v.size(2), is_causal};
}

}  // namespace

AttentionForward attention_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale,
                                   bool is_causal) {
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Dims d = dims_of(q, k, v, is_causal);
  const int64_t B = q.size(0);
  AttentionForward r{Tensor::empty({B, d.L, d.Ev}, q.dtype()), Tensor::empty({B, d.L}, q.dtype())};
  detail::dispatch_float(q.dtype(), "fused attention", [&](auto tag) {
    using T = decltype(tag);
    detail::count_simd_path(SimdKernel::attention_forward, detail::simd_path<T>(kVectorRows));
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
    if constexpr (std::is_same_v<T, float>) {
      for_entries(B, d, [&](int64_t b, attention::RowScratch& w) {
        attention::forward_rows(d, float(scale), q.data<float>() + b * d.L * d.E, k.data<float>() + b * d.S * d.E,
                                v.data<float>() + b * d.S * d.Ev, r.output.data<float>() + b * d.L * d.Ev,
                                r.lse.data<float>() + b * d.L, w);
      });
      return;
    }
#endif
    detail::parallel_range(B, 1, [&](int64_t b0, int64_t b1) {
      RowMat<T> s(kRows, kCols), acc(kRows, d.Ev);
      std::vector<T> m(kRows), l(kRows);
      for (int64_t b = b0; b < b1; ++b) {
        forward_entry<T>(d, T(scale), q.data<T>() + b * d.L * d.E, k.data<T>() + b * d.S * d.E,
                         v.data<T>() + b * d.S * d.Ev, r.output.data<T>() + b * d.L * d.Ev,
                         r.lse.data<T>() + b * d.L, s, acc, m, l);
      }
    });
  });
  return r;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                  const Tensor& out, const Tensor& lse_in, double scale, bool is_causal) {
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Tensor g = grad_out.contiguous(), o = out.contiguous(), lse = lse_in.contiguous();
  const Dims d = dims_of(q, k, v, is_causal);
  const int64_t B = q.size(0);
  AttentionGrads r{Tensor::zeros(q.shape(), q.dtype()), Tensor::zeros(k.shape(), q.dtype()),
                   Tensor::zeros(v.shape(), q.dtype())};
  detail::dispatch_float(q.dtype(), "fused attention backward", [&](auto tag) {
    using T = decltype(tag);
    detail::count_simd_path(SimdKernel::attention_backward, detail::simd_path<T>(kVectorRows));
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
    if constexpr (std::is_same_v<T, float>) {
      for_entries(B, d, [&](int64_t b, attention::RowScratch& w) {
        attention::backward_rows(d, float(scale), q.data<float>() + b * d.L * d.E, k.data<float>() + b * d.S * d.E,
                                 v.data<float>() + b * d.S * d.Ev, o.data<float>() + b * d.L * d.Ev,
                                 g.data<float>() + b * d.L * d.Ev, lse.data<float>() + b * d.L,
                                 r.q.data<float>() + b * d.L * d.E, r.k.data<float>() + b * d.S * d.E,
                                 r.v.data<float>() + b * d.S * d.Ev, w);
      });
      return;
    }
#endif
    detail::parallel_range(B, 1, [&](int64_t b0, int64_t b1) {
      RowMat<T> p(kRows, kCols), dp(kRows, kCols);
      std::vector<T> delta(d.L);
      for (int64_t b = b0; b < b1; ++b) {
        backward_entry<T>(d, T(scale), q.data<T>() + b * d.L * d.E, k.data<T>() + b * d.S * d.E,
                          v.data<T>() + b * d.S * d.Ev, o.data<T>() + b * d.L * d.Ev, g.data<T>() + b * d.L * d.Ev,
                          lse.data<T>() + b * d.L, r.q.data<T>() + b * d.L * d.E, r.k.data<T>() + b * d.S * d.E,
                          r.v.data<T>() + b * d.S * d.Ev, p, dp, delta);
      }
    });
  });
  return r;
}

}  // namespace tandem::kernels::cpu
