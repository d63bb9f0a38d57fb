// CPU kernels of kernels/scan.h under tandem::kernels::cpu,
// registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/scan.cpp (float dtype, dim wrapped).
// How: the input made contiguous and read as [outer, n, inner]; columns (outer, inner) split over
// the thread pool, each walked serially along n in double.
// Guarantees: fresh contiguous outputs; results independent of the thread count.
#include "kernels/ops.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/view.h"
#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

// PyTorch's sort order: NaN above every number (so last ascending, first descending), -0.0 == 0.0.
template <typename T>
bool sorts_before(T a, T b, bool descending) {
  const bool a_nan = a != a, b_nan = b != b;
  if (descending) return a_nan ? !b_nan : (!b_nan && a > b);
  return b_nan ? !a_nan : (!a_nan && a < b);
}

struct Columns {
  int64_t outer, n, inner;
};

Columns columns_of(const Shape& shape, int64_t dim) {
  Columns c{};
  views::split_at(shape, dim, c.outer, c.n, c.inner);
  return c;
}

// fn(t, base) for each column t = (outer, inner), base its first element's offset (stride inner).
template <typename Fn>
void for_columns(const Columns& c, Fn&& fn) {
  detail::parallel_range(c.outer * c.inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, c.n)),
                         [&](int64_t t0, int64_t t1) {
                           for (int64_t t = t0; t < t1; ++t) fn(t, (t / c.inner) * c.n * c.inner + t % c.inner);
                         });
}

}  // namespace

Tensor prod_dim(const Tensor& x_in, int64_t dim, bool keepdim) {
  const Tensor x = x_in.contiguous();
  const Columns c = columns_of(x.shape(), dim);
  const Shape shape = x.dim() == 0 ? Shape{} : views::reduced_shape(x.shape(), {dim}, keepdim);
  return detail::dispatch_float(x.dtype(), "prod", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, x.dtype());
    const T* p = x.data<T>();
    T* o = out.data<T>();
    for_columns(c, [&](int64_t t, int64_t base) {
      double acc = 1.0;
      for (int64_t k = 0; k < c.n; ++k) acc *= static_cast<double>(p[base + k * c.inner]);
      o[t] = T(acc);
    });
    return out;
  });
}

Tensor prod_dim_backward(const Tensor& g_in, const Tensor& x_in, int64_t dim) {
  const Tensor x = x_in.contiguous(), g = g_in.contiguous();
  const Columns c = columns_of(x.shape(), dim);
  return detail::dispatch_float(x.dtype(), "prod backward", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(x.shape(), x.dtype());
    const T* p = x.data<T>();
    const T* gp = g.data<T>();
    T* o = out.data<T>();
    for_columns(c, [&](int64_t t, int64_t base) {
      // Suffix products into out, then prefix products times them (as the CUDA kernel).
      double suffix = 1.0;
      for (int64_t k = c.n - 1; k >= 0; --k) {
        o[base + k * c.inner] = T(suffix);
        suffix *= static_cast<double>(p[base + k * c.inner]);
      }
      double prefix = static_cast<double>(gp[t]);
      for (int64_t k = 0; k < c.n; ++k) {
        const int64_t i = base + k * c.inner;
        o[i] = T(prefix * static_cast<double>(o[i]));
        prefix *= static_cast<double>(p[i]);
      }
    });
    return out;
  });
}

Tensor cumsum(const Tensor& x_in, int64_t dim, bool reverse) {
  const Tensor x = x_in.contiguous();
  const Columns c = columns_of(x.shape(), dim);
  return detail::dispatch_float(x.dtype(), "cumsum", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(x.shape(), x.dtype());
    const T* p = x.data<T>();
    T* o = out.data<T>();
    for_columns(c, [&](int64_t, int64_t base) {
      double acc = 0.0;
      for (int64_t j = 0; j < c.n; ++j) {
        const int64_t i = base + (reverse ? c.n - 1 - j : j) * c.inner;
        acc += static_cast<double>(p[i]);
        o[i] = T(acc);
      }
    });
    return out;
  });
}

Tensor argsort(const Tensor& x_in, int64_t dim, bool descending) {
  const Tensor x = x_in.contiguous();
  const Columns c = columns_of(x.shape(), dim);
  Tensor out = Tensor::empty(x.shape(), kInt64);
  int64_t* o = out.data<int64_t>();
  detail::dispatch_float(x.dtype(), "argsort", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for_columns(c, [&](int64_t, int64_t base) {
      std::vector<int64_t> order(static_cast<size_t>(c.n));
      std::iota(order.begin(), order.end(), int64_t{0});
      const auto value = [&](int64_t k) { return p[base + k * c.inner]; };
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return sorts_before(value(a), value(b), descending); });
      for (int64_t k = 0; k < c.n; ++k) o[base + k * c.inner] = order[static_cast<size_t>(k)];
    });
    return 0;
  });
  return out;
}

}  // namespace tandem::kernels::cpu
