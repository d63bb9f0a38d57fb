// CPU kernel of kernels/layer_norm.h. Assumes: validated by kernels/layer_norm.cpp.
// Guarantees: fresh contiguous outputs; rows processed in parallel, row statistics and the
// backward's row means in double; dw/db summed over rows in double, column block by column block
// (deterministic for a given thread count: each column's sum runs over the rows in order).
#include "kernels/ops.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {

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
        double s = 0, s2 = 0;
        for (int64_t j = 0; j < n; ++j) s += static_cast<double>(row[j]);
        const double mu = s / static_cast<double>(n);
        for (int64_t j = 0; j < n; ++j) {
          const double d = static_cast<double>(row[j]) - mu;
          s2 += d * d;
        }
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
          double a = 0, b = 0;  // sums of dxhat and dxhat * xhat
          for (int64_t j = 0; j < n; ++j) {
            const double dxhat = static_cast<double>(gr[j]) * (wp ? static_cast<double>(wp[j]) : 1.0);
            const double xhat = (static_cast<double>(xr[j]) - mp[i]) * sp[i];
            a += dxhat;
            b += dxhat * xhat;
          }
          const T ma = T(a / static_cast<double>(n)), mb = T(b / static_cast<double>(n));
          for (int64_t j = 0; j < n; ++j) {
            const T dxhat = gr[j] * (wp ? wp[j] : T(1));
            const T xhat = (xr[j] - mp[i]) * sp[i];
            dx[i * n + j] = sp[i] * (dxhat - ma - xhat * mb);
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
          for (int64_t i = 0; i < rows; ++i) {
            for (int64_t j = c0; j < c1; ++j) {
              const double gv = static_cast<double>(gp[i * n + j]);
              dw[j] += gv * (static_cast<double>(xp[i * n + j]) - mp[i]) * sp[i];
              db[j] += gv;
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
