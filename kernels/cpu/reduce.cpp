// CPU kernels of kernels/reduce.h under tandem::kernels::cpu,
// registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/reduce.cpp (dims wrapped, sorted and distinct; float dtypes).
// How: a sum over one block of dimensions of a contiguous input with dimensions after it reads it
// as [outer, len, inner] and accumulates 256-column blocks row by row (no copy). Otherwise a
// reduction permutes the reduced dimensions to the end and copies to a contiguous [rows, len]
// block (a no-op when they already are the trailing dimensions of a contiguous input), then
// reduces each row; the kept dimensions stay in order, so the rows are the output in
// row-major order. softmax works on a contiguous [outer, C, inner] view of the input.
// Guarantees: fresh contiguous outputs; sums in double (rows: blocks of 1024 summed in the
// element type, then added in double); max/argmax take the first maximum, a NaN
// counting as the maximum (as PyTorch); softmax subtracts the row maximum first.
#include "kernels/ops.h"

#include <cmath>
#include <limits>

#include "core/view.h"
#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

// x with `dims` moved last, contiguous, as [rows, len].
struct Rows {
  Tensor data;
  int64_t rows = 1, len = 1;
};

Rows to_rows(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> perm;
  Rows r;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      perm.push_back(d);
      r.rows *= x.shape()[d];
    }
  }
  for (int64_t d : dims) {
    perm.push_back(d);
    r.len *= x.shape()[d];
  }
  r.data = views::permute(x, perm).contiguous();
  return r;
}

// When x is contiguous and dims are one block [d0, d1] with trailing dimensions after it, x is
// [outer, len, inner] and the sum needs no transposing copy: sets the three sizes and returns true.
bool as_block(const Tensor& x, const std::vector<int64_t>& dims, int64_t& outer, int64_t& len, int64_t& inner) {
  if (!x.is_contiguous() || dims.empty() || dims.back() == x.dim() - 1) return false;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i] != dims[0] + static_cast<int64_t>(i)) return false;
  }
  outer = len = inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    (d < dims.front() ? outer : d > dims.back() ? inner : len) *= x.shape()[d];
  }
  return true;
}

// out[o, i] = sum_r x[o, r, i], in column blocks of 256 accumulated in double (row-major reads).
template <typename T>
void sum_block(const T* p, T* o, int64_t outer, int64_t len, int64_t inner) {
  constexpr int64_t kCols = 256;
  const int64_t blocks = (inner + kCols - 1) / kCols;
  detail::parallel_range(outer * blocks, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, len * kCols)),
                         [&](int64_t u0, int64_t u1) {
                           double acc[kCols];
                           for (int64_t u = u0; u < u1; ++u) {
                             const int64_t a = u / blocks, c0 = (u % blocks) * kCols;
                             const int64_t n = std::min(kCols, inner - c0);
                             std::fill_n(acc, n, 0.0);
                             for (int64_t r = 0; r < len; ++r) {
                               const T* row = p + (a * len + r) * inner + c0;
                               for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<double>(row[i]);
                             }
                             for (int64_t i = 0; i < n; ++i) o[a * inner + c0 + i] = T(acc[i]);
                           }
                         });
}

}  // namespace

Tensor sum_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Shape out_shape = views::reduced_shape(x.shape(), dims, keepdim);
  return detail::dispatch_float(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(out_shape, x.dtype());
    T* o = out.data<T>();
    int64_t outer, len, inner;
    if (as_block(x, dims, outer, len, inner)) {
      sum_block<T>(x.data<T>(), o, outer, len, inner);
      return out;
    }
    const Rows r = to_rows(x, dims);
    const T* p = r.data.data<T>();
    detail::parallel_range(r.rows, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, r.len)),
                           [&](int64_t r0, int64_t r1) {
                             for (int64_t i = r0; i < r1; ++i) {
                               // Blocks of 1024 summed vectorised in T, the blocks added in double
                               // (the scheme of the whole-tensor sum).
                               double acc = 0;
                               const T* row = p + i * r.len;
                               for (int64_t j = 0; j < r.len; j += 1024) {
                                 acc += static_cast<double>(detail::CArrMap<T>(row + j, std::min<int64_t>(1024, r.len - j)).sum());
                               }
                               o[i] = T(acc);
                             }
                           });
    return out;
  });
}

MaxResult max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  const std::vector<int64_t> dims = x.dim() == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{dim};
  const Shape out_shape = views::reduced_shape(x.shape(), dims, keepdim);
  return detail::dispatch_float(x.dtype(), "max", [&](auto tag) {
    using T = decltype(tag);
    const Rows r = to_rows(x, dims);
    MaxResult res{Tensor::empty(out_shape, x.dtype()), Tensor::empty(out_shape, kInt64)};
    const T* p = r.data.data<T>();
    T* v = res.values.data<T>();
    int64_t* ix = res.indices.data<int64_t>();
    detail::parallel_range(r.rows, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const T* row = p + i * r.len;
        int64_t best = 0;
        for (int64_t j = 1; j < r.len && !std::isnan(row[best]); ++j) {
          if (row[j] > row[best] || std::isnan(row[j])) best = j;
        }
        v[i] = row[best];
        ix[i] = best;
      }
    });
    return res;
  });
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Shape out_shape = views::reduced_shape(x.shape(), dims, keepdim);
  return detail::dispatch_float(x.dtype(), "amax", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(out_shape, x.dtype());
    T* o = out.data<T>();
    const Rows r = to_rows(x, dims);
    const T* p = r.data.data<T>();
    detail::parallel_range(r.rows, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const T* row = p + i * r.len;
        T best = row[0];
        for (int64_t j = 1; j < r.len && !std::isnan(best); ++j) {
          if (row[j] > best || std::isnan(row[j])) best = row[j];
        }
        o[i] = best;
      }
    });
    return out;
  });
}

Tensor softmax_forward(const Tensor& x_in, int64_t dim, bool log) {
  const Tensor x = x_in.contiguous();
  int64_t outer, n, inner;
  views::split_at(x.shape(), dim, outer, n, inner);
  return detail::dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(x.shape(), x.dtype());
    const T* p = x.data<T>();
    T* o = out.data<T>();
    detail::parallel_range(outer * inner, 64, [&](int64_t l0, int64_t l1) {
      for (int64_t l = l0; l < l1; ++l) {
        if (inner == 1) {  // contiguous rows (softmax over the last dimension): Eigen's vectorised exp
          const detail::CArrMap<T> row(p + l * n, n);
          detail::ArrMap<T> out_row(o + l * n, n);
          const T mx = n > 0 ? row.maxCoeff() : T(0);
          out_row = (row - mx).exp();
          const double s = out_row.template cast<double>().sum();
          if (log) {
            out_row = (row - mx) - T(std::log(s));  // (x - max) first: exact, whatever max's size
          } else {
            out_row *= T(1.0 / s);
          }
          continue;
        }
        const int64_t base = (l / inner) * n * inner + l % inner;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t c = 0; c < n; ++c) mx = std::max(mx, p[base + c * inner]);
        // exp in the element type (within an ulp), summed in double; softmax keeps the exps.
        double s = 0;
        for (int64_t c = 0; c < n; ++c) {
          const T e = std::exp(p[base + c * inner] - mx);
          if (!log) o[base + c * inner] = e;
          s += static_cast<double>(e);
        }
        if (log) {
          const T ls = T(std::log(s));
          for (int64_t c = 0; c < n; ++c) o[base + c * inner] = (p[base + c * inner] - mx) - ls;
        } else {
          const T inv = T(1.0 / s);
          for (int64_t c = 0; c < n; ++c) o[base + c * inner] *= inv;
        }
      }
    });
    return out;
  });
}

Tensor softmax_backward(const Tensor& g_in, const Tensor& y_in, int64_t dim, bool log) {
  const Tensor g = g_in.contiguous(), y = y_in.contiguous();
  int64_t outer, n, inner;
  views::split_at(y.shape(), dim, outer, n, inner);
  return detail::dispatch_float(y.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(y.shape(), y.dtype());
    const T* gp = g.data<T>();
    const T* yp = y.data<T>();
    T* o = out.data<T>();
    detail::parallel_range(outer * inner, 64, [&](int64_t l0, int64_t l1) {
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t base = (l / inner) * n * inner + l % inner;
        double s = 0;
        for (int64_t c = 0; c < n; ++c) {
          const int64_t k = base + c * inner;
          s += log ? static_cast<double>(gp[k]) : static_cast<double>(gp[k]) * yp[k];
        }
        for (int64_t c = 0; c < n; ++c) {
          const int64_t k = base + c * inner;
          // log_softmax: g - exp(y) * sum(g); softmax: y * (g - sum(g * y)).
          o[k] = log ? T(gp[k] - std::exp(static_cast<double>(yp[k])) * s) : T(yp[k] * (gp[k] - s));
        }
      }
    });
    return out;
  });
}

}  // namespace tandem::kernels::cpu
