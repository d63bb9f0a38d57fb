// CPU kernel of kernels/layer_norm.h. Assumes: validated by kernels/layer_norm.cpp.
// Guarantees: fresh contiguous outputs; rows processed in parallel, row statistics and the
// backward's row means in double (partial sums in vector lanes: AVX-512 rows for float32 where the
// kernels are compiled for it, else kLanes interleaved partials the compiler can vectorise); dw/db
// summed over rows in double, column block by column block (deterministic for a given thread count:
// each column's sum runs over the rows in order).
#include "kernels/ops.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

// The row sums below keep kLanes partial sums in double, one per column residue, so that the compiler
// can run them as vector lanes (a single running sum is a chain of dependent additions), and add the
// partials in order at the end.
constexpr int kLanes = 8;

// sum_j x[j] in double.
template <typename T>
double row_sum(const T* x, int64_t n) {
  double p[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int u = 0; u < kLanes; ++u) p[u] += static_cast<double>(x[j + u]);
  double s = 0;
  for (; j < n; ++j) s += static_cast<double>(x[j]);
  for (double v : p) s += v;
  return s;
}

// sum_j (x[j] - mu)^2 in double.
template <typename T>
double row_square_deviation(const T* x, int64_t n, double mu) {
  double p[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) {
      const double d = static_cast<double>(x[j + u]) - mu;
      p[u] += d * d;
    }
  }
  double s = 0;
  for (; j < n; ++j) {
    const double d = static_cast<double>(x[j]) - mu;
    s += d * d;
  }
  for (double v : p) s += v;
  return s;
}

// The backward's row sums a = sum dxhat and b = sum dxhat * xhat, dxhat = g * w (w = 1 when absent),
// xhat = (x - mean) * rstd, in double.
template <bool kHasWeight, typename T>
void row_grad_sums(const T* g, const T* x, const T* w, int64_t n, double mean, double rstd, double& a, double& b) {
  double pa[kLanes] = {}, pb[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) {
      double dxhat = static_cast<double>(g[j + u]);
      if constexpr (kHasWeight) dxhat *= static_cast<double>(w[j + u]);
      const double xhat = (static_cast<double>(x[j + u]) - mean) * rstd;
      pa[u] += dxhat;
      pb[u] += dxhat * xhat;
    }
  }
  a = 0;
  b = 0;
  for (; j < n; ++j) {
    const double dxhat = static_cast<double>(g[j]) * (kHasWeight ? static_cast<double>(w[j]) : 1.0);
    const double xhat = (static_cast<double>(x[j]) - mean) * rstd;
    a += dxhat;
    b += dxhat * xhat;
  }
  for (int u = 0; u < kLanes; ++u) {
    a += pa[u];
    b += pb[u];
  }
}

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// The same sums over float rows in AVX-512 lanes: 16 floats widened (exactly) to two vectors of doubles.
using simd::widen;

double row_sum(const float* x, int64_t n) {
  simd::WideSum s;
  for (int64_t j = 0; j < n; j += 16) s.add(simd::load_first(x + j, n - j));
  return s.total();
}

double row_square_deviation(const float* x, int64_t n, double mu) {
  const __m512d m = _mm512_set1_pd(mu);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = simd::lane_mask(n - j);
    __m512d lo, hi;
    widen(simd::load_first(x + j, n - j), lo, hi);
    lo = _mm512_maskz_sub_pd(__mmask8(k), lo, m);
    hi = _mm512_maskz_sub_pd(__mmask8(k >> 8), hi, m);
    s0 = _mm512_fmadd_pd(lo, lo, s0);
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

template <bool kHasWeight>
void row_grad_sums(const float* g, const float* x, const float* w, int64_t n, double mean, double rstd, double& a,
                   double& b) {
  const __m512d m = _mm512_set1_pd(mean), r = _mm512_set1_pd(rstd);
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), b0 = _mm512_setzero_pd(), b1 = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {  // g is 0 past the row: those lanes add nothing
    __m512d g0, g1, x0, x1;
    widen(simd::load_first(g + j, n - j), g0, g1);
    widen(simd::load_first(x + j, n - j), x0, x1);
    if constexpr (kHasWeight) {
      __m512d w0, w1;
      widen(simd::load_first(w + j, n - j), w0, w1);
      g0 = _mm512_mul_pd(g0, w0);
      g1 = _mm512_mul_pd(g1, w1);
    }
    a0 = _mm512_add_pd(a0, g0);
    a1 = _mm512_add_pd(a1, g1);
    b0 = _mm512_fmadd_pd(g0, _mm512_mul_pd(_mm512_sub_pd(x0, m), r), b0);
    b1 = _mm512_fmadd_pd(g1, _mm512_mul_pd(_mm512_sub_pd(x1, m), r), b1);
  }
  a = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  b = _mm512_reduce_add_pd(_mm512_add_pd(b0, b1));
}
#endif

// One row's input gradient: the row sums, then dx = rstd * (dxhat - ma - xhat * mb), ma and mb their means.
template <bool kHasWeight, typename T>
void row_input_grad(const T* __restrict g, const T* __restrict x, const T* __restrict w, int64_t n, T mean, T rstd,
                    T* __restrict dx) {
  double a = 0, b = 0;  // sums of dxhat and dxhat * xhat
  row_grad_sums<kHasWeight>(g, x, w, n, static_cast<double>(mean), static_cast<double>(rstd), a, b);
  const T ma = T(a / static_cast<double>(n)), mb = T(b / static_cast<double>(n));
  for (int64_t j = 0; j < n; ++j) {
    T dxhat = g[j];
    if constexpr (kHasWeight) dxhat *= w[j];
    const T xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (dxhat - ma - xhat * mb);
  }
}

}  // namespace

LayerNormForward layer_norm_forward(const Tensor& x_in, int64_t n, const Tensor& w_in, const Tensor& b_in,
                                    double eps) {
  const Tensor x = x_in.contiguous();
  const Tensor w = w_in.defined() ? w_in.contiguous() : Tensor(), b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t rows = x.numel() / n;
  return detail::dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    LayerNormForward r{Tensor::empty(x.shape(), x.dtype()), Tensor::empty({rows}, x.dtype()),
                       Tensor::empty({rows}, x.dtype())};
    const T* xp = x.data<T>();
    const T* wp = w.defined() ? w.data<T>() : nullptr;
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* yp = r.output.data<T>();
    T* mp = r.mean.data<T>();
    T* sp = r.rstd.data<T>();
    detail::parallel_range(rows, std::max<int64_t>(1, 4096 / n), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const T* row = xp + i * n;
        const double mu = row_sum(row, n) / static_cast<double>(n);
        const double s2 = row_square_deviation(row, n, mu);
        const double rstd = 1.0 / std::sqrt(s2 / static_cast<double>(n) + eps);
        mp[i] = T(mu);
        sp[i] = T(rstd);
        const T m = T(mu), rs = T(rstd);
        T* out = yp + i * n;
        for (int64_t j = 0; j < n; ++j) {
          T v = (row[j] - m) * rs;
          if (wp) v *= wp[j];
          if (bp) v += bp[j];
          out[j] = v;
        }
      }
    });
    return r;
  });
}

LayerNormGrads layer_norm_backward(const Tensor& g_in, const Tensor& x_in, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& w_in, bool need_input, bool need_weight, bool need_bias) {
  const Tensor g = g_in.contiguous(), x = x_in.contiguous();
  const Tensor w = w_in.defined() ? w_in.contiguous() : Tensor();
  const int64_t rows = mean.numel(), n = rows > 0 ? x.numel() / rows : 0;
  return detail::dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    LayerNormGrads r;
    const T* gp = g.data<T>();
    const T* xp = x.data<T>();
    const T* mp = mean.data<T>();
    const T* sp = rstd.data<T>();
    const T* wp = w.defined() ? w.data<T>() : nullptr;
    if (need_input) {
      r.input = Tensor::empty(x.shape(), x.dtype());
      T* dx = r.input.data<T>();
      detail::parallel_range(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0; i < r1; ++i) {
          const T* gr = gp + i * n;
          const T* xr = xp + i * n;
          if (wp) {
            row_input_grad<true>(gr, xr, wp, n, mp[i], sp[i], dx + i * n);
          } else {
            row_input_grad<false>(gr, xr, wp, n, mp[i], sp[i], dx + i * n);
          }
        }
      });
    }
    if (need_weight || need_bias) {
      // Column blocks of 256 over all rows: dw = sum dy * xhat, db = sum dy.
      constexpr int64_t kCols = 256;
      std::vector<double> dw(n, 0.0), db(n, 0.0);
      detail::parallel_range((n + kCols - 1) / kCols, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t blk = b0; blk < b1; ++blk) {
          const int64_t c0 = blk * kCols, c1 = std::min(n, c0 + kCols);
          double* __restrict dwp = dw.data();
          double* __restrict dbp = db.data();
          for (int64_t i = 0; i < rows; ++i) {
            const double mean_i = static_cast<double>(mp[i]), rstd_i = static_cast<double>(sp[i]);
            const T* __restrict gr = gp + i * n;
            const T* __restrict xr = xp + i * n;
            for (int64_t j = c0; j < c1; ++j) {
              const double gv = static_cast<double>(gr[j]);
              dwp[j] += gv * (static_cast<double>(xr[j]) - mean_i) * rstd_i;
              dbp[j] += gv;
            }
          }
        }
      });
      const Shape shape = w.defined() ? w.shape() : Shape{n};
      if (need_weight) {
        r.weight = Tensor::empty(shape, x.dtype());
        for (int64_t j = 0; j < n; ++j) r.weight.data<T>()[j] = T(dw[j]);
      }
      if (need_bias) {
        r.bias = Tensor::empty(shape, x.dtype());
        for (int64_t j = 0; j < n; ++j) r.bias.data<T>()[j] = T(db[j]);
      }
    }
    return r;
  });
}

}  // namespace tandem::kernels::cpu
