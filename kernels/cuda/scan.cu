// CUDA kernels of kernels/scan.h (float32 and float64) under tandem::kernels::cuda,
// registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/scan.cpp (one CUDA device, dim wrapped).
// How: the input made contiguous and read as [outer, n, inner]; one thread per (outer, inner)
// column walks n serially in double (neighbouring threads read neighbouring addresses when inner
// > 1), the same order and precision as the CPU kernels.
// argsort: one thread per column too, a stable merge sort (slow for one long column, exact always).
// Guarantees: fresh contiguous outputs on the input's device, on its compute stream; deterministic
// (no atomics).
#include <cstdint>

#include "core/cuda/launch.cuh"
#include "core/view.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t column_base(int64_t t, int64_t n, int64_t inner) {
  return (t / inner) * n * inner + t % inner;
}

template <typename T>
__global__ void prod_kernel(const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const int64_t base = column_base(t, n, inner);
    double acc = 1.0;
    for (int64_t k = 0; k < n; ++k) acc *= static_cast<double>(x[base + k * inner]);
    out[t] = static_cast<T>(acc);
  }
}

// Suffix products into out, then prefix products (times the gradient) times them.
template <typename T>
__global__ void prod_grad_kernel(const T* g, const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const int64_t base = column_base(t, n, inner);
    double suffix = 1.0;
    for (int64_t k = n - 1; k >= 0; --k) {
      out[base + k * inner] = static_cast<T>(suffix);
      suffix *= static_cast<double>(x[base + k * inner]);
    }
    double prefix = static_cast<double>(g[t]);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = base + k * inner;
      out[i] = static_cast<T>(prefix * static_cast<double>(out[i]));
      prefix *= static_cast<double>(x[i]);
    }
  }
}

template <typename T>
__global__ void cumsum_kernel(const T* x, T* out, bool reverse, int64_t outer, int64_t n, int64_t inner) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const int64_t base = column_base(t, n, inner);
    double acc = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = base + (reverse ? n - 1 - j : j) * inner;
      acc += static_cast<double>(x[i]);
      out[i] = static_cast<T>(acc);
    }
  }
}

// PyTorch's sort order (kernels/cpu/scan.cpp's sorts_before): NaN above every number, -0.0 == 0.0.
template <typename T>
__device__ __forceinline__ bool sorts_before(T a, T b, bool descending) {
  const bool a_nan = a != a, b_nan = b != b;
  if (descending) return a_nan ? !b_nan : (!b_nan && a > b);
  return b_nan ? !a_nan : (!a_nan && a < b);
}

// A stable bottom-up merge sort of each column's positions, ping-ponging between out and scratch
// (both strided by inner as the column is): the CPU kernel's std::stable_sort order exactly.
template <typename T>
__global__ void argsort_kernel(const T* x, int64_t* out, int64_t* scratch, bool descending, int64_t outer,
                               int64_t n, int64_t inner) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const int64_t base = column_base(t, n, inner);
    int64_t* src = out;
    int64_t* dst = scratch;
    for (int64_t k = 0; k < n; ++k) src[base + k * inner] = k;
    for (int64_t width = 1; width < n; width *= 2) {
      for (int64_t lo = 0; lo < n; lo += 2 * width) {
        const int64_t mid = min(lo + width, n), hi = min(lo + 2 * width, n);
        int64_t i = lo, j = mid;
        for (int64_t o = lo; o < hi; ++o) {
          const int64_t left = i < mid ? src[base + i * inner] : -1;
          const int64_t right = j < hi ? src[base + j * inner] : -1;
          const bool take_right =
              right >= 0 && (left < 0 || sorts_before(x[base + right * inner], x[base + left * inner], descending));
          dst[base + o * inner] = take_right ? right : left;
          if (take_right)
            ++j;
          else
            ++i;
        }
      }
      int64_t* swap = src;
      src = dst;
      dst = swap;
    }
    if (src != out)
      for (int64_t k = 0; k < n; ++k) out[base + k * inner] = src[base + k * inner];
  }
}

// x contiguous, read as [outer, n, inner] around dim.
struct Columns {
  Tensor x;
  int64_t outer = 1, n = 1, inner = 1;
};

Columns columns_of(const Tensor& x, int64_t dim) {
  Columns c{x.contiguous()};
  views::split_at(x.shape(), dim, c.outer, c.n, c.inner);
  return c;
}

// One thread per column: kernel(args..., outer, n, inner), nothing launched without columns.
template <typename... Params, typename... Args>
void launch_columns(int dev, const Columns& c, void (*kernel)(Params...), Args... args) {
  if (c.outer * c.inner == 0) return;
  StreamGuard on(dev);
  launch(on, kernel, grid_for(c.outer * c.inner), kThreads, 0, args..., c.outer, c.n, c.inner);
}

}  // namespace

Tensor prod_dim(const Tensor& x, int64_t dim, bool keepdim) {
  const int dev = check_f32_f64_cuda("prod", {x});
  const Columns c = columns_of(x, dim);
  Tensor out = Tensor::empty(x.dim() == 0 ? Shape{} : views::reduced_shape(x.shape(), {dim}, keepdim), x.dtype(),
                             x.device());
  dispatch_cuda_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch_columns(dev, c, prod_kernel<T>, elem_ptr<const T>(c.x), elem_ptr<T>(out));
  });
  return out;
}

Tensor prod_dim_backward(const Tensor& g, const Tensor& x, int64_t dim) {
  const int dev = check_f32_f64_cuda("prod backward", {g, x});
  const Columns c = columns_of(x, dim);
  const Tensor gc = g.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  dispatch_cuda_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch_columns(dev, c, prod_grad_kernel<T>, elem_ptr<const T>(gc), elem_ptr<const T>(c.x), elem_ptr<T>(out));
  });
  return out;
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  const int dev = check_f32_f64_cuda("argsort", {x});
  const Columns c = columns_of(x, dim);
  Tensor out = Tensor::empty(x.shape(), kInt64, x.device());
  if (out.numel() == 0) return out;
  Tensor scratch = Tensor::empty(x.shape(), kInt64, x.device());
  dispatch_cuda_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch_columns(dev, c, argsort_kernel<T>, elem_ptr<const T>(c.x), elem_ptr<int64_t>(out),
                   elem_ptr<int64_t>(scratch), descending);
  });
  return out;
}

Tensor cumsum(const Tensor& x, int64_t dim, bool reverse) {
  const int dev = check_f32_f64_cuda("cumsum", {x});
  const Columns c = columns_of(x, dim);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  dispatch_cuda_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    launch_columns(dev, c, cumsum_kernel<T>, elem_ptr<const T>(c.x), elem_ptr<T>(out), reverse);
  });
  return out;
}

}  // namespace tandem::kernels::cuda
