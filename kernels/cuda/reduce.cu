// CUDA kernels of kernels/reduce.h (float32 and float64) under tandem::kernels::cuda,
// registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/reduce.cpp (dims wrapped, sorted and distinct; one float dtype; no empty
// dimension reduced by max/amax).
// How: the input is read as a contiguous [outer, len, inner] block, len being the reduced (or
// softmax) elements: no copy when the input is contiguous and the reduced dimensions are one run;
// otherwise the reduced dimensions are permuted last and copied (inner = 1). With inner == 1 one
// block of 256 threads reduces each row (block_sum, block_max, block_argmax of reduce.cuh); with
// inner > 1 sums go by column tiles (a block of 32 columns x 8 row lanes, column_tile_sum), and the
// max and softmax kernels take one thread per (outer, inner) column walking len serially,
// neighbouring threads reading neighbouring addresses. Kept dimensions stay in order, so [outer, inner] is the output in
// row-major order.
// Guarantees: fresh contiguous outputs on the input's device, on its compute stream; sums in
// double (the CPU's rounding differs by float32 rounding only); max/argmax take the first
// maximum, NaN counting as the maximum (as the CPU and PyTorch); softmax subtracts the row
// maximum first and sums its exps in double, as the CPU kernel; deterministic (no atomics).
#include <algorithm>
#include <vector>

#include "core/cuda/launch.cuh"
#include "core/view.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"
#include "kernels/pointwise_math.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// x as a contiguous [outer, len, inner] with `dims` in the middle.
struct Blocked {
  Tensor data;
  int64_t outer = 1, len = 1, inner = 1;
};

Blocked blocked(const Tensor& x, const std::vector<int64_t>& dims) {
  Blocked b;
  if (dims.empty()) {  // a 0-D input, or nothing to reduce: every element its own row
    b.data = x.contiguous();
    b.outer = x.numel();
    return b;
  }
  bool run = true;
  for (size_t i = 1; i < dims.size(); ++i) run = run && dims[i] == dims[0] + static_cast<int64_t>(i);
  if (run) {
    b.data = x.contiguous();
    for (int64_t d = 0; d < x.dim(); ++d) (d < dims.front() ? b.outer : d > dims.back() ? b.inner : b.len) *= x.shape()[d];
    return b;
  }
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      perm.push_back(d);
      b.outer *= x.shape()[d];
    }
  }
  for (int64_t d : dims) {
    perm.push_back(d);
    b.len *= x.shape()[d];
  }
  b.data = views::permute(x, perm).contiguous();
  return b;
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535)); }

template <typename T>
const T* in_ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

template <typename T>
__global__ void sum_rows_kernel(const T* x, T* out, int64_t rows, int64_t len) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double acc = 0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) acc += x[r * len + j];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[r] = static_cast<T>(acc);
  }
}

// Grid: x over column tiles, y over the outer index (grid-stride); block kColumnTile x kColumnLanes.
template <typename T>
__global__ void sum_cols_kernel(const T* x, T* out, int64_t outer, int64_t len, int64_t inner) {
  const int64_t col = int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    double acc[1] = {0};
    if (col < inner) {
      const T* p = x + o * len * inner + col;
      for (int64_t j = threadIdx.y; j < len; j += kColumnLanes) acc[0] += p[j * inner];
    }
    column_tile_sum(acc);
    if (threadIdx.y == 0 && col < inner) out[o * inner + col] = static_cast<T>(acc[0]);
  }
}

dim3 column_tiles(int64_t outer, int64_t inner) {
  return dim3(static_cast<unsigned>((inner + kColumnTile - 1) / kColumnTile),
              static_cast<unsigned>(std::min<int64_t>(outer, 65535)));
}

// values[r] (and indices[r] unless null) = the first maximum of row r and its position.
template <typename T>
__global__ void max_rows_kernel(const T* x, T* values, int64_t* indices, int64_t rows, int64_t len) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T v = T(-INFINITY);
    int64_t idx = INT64_MAX;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const T w = x[r * len + j];
      if (beats(w, j, v, idx)) {
        v = w;
        idx = j;
      }
    }
    block_argmax(v, idx);
    if (threadIdx.x == 0) {
      values[r] = v;
      if (indices) indices[r] = idx;
    }
  }
}

template <typename T>
__global__ void max_cols_kernel(const T* x, T* values, int64_t* indices, int64_t outer, int64_t len,
                                int64_t inner) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const T* p = x + (t / inner) * len * inner + t % inner;
    T v = p[0];
    int64_t idx = 0;
    for (int64_t j = 1; j < len; ++j) {
      if (beats(p[j * inner], j, v, idx)) {
        v = p[j * inner];
        idx = j;
      }
    }
    values[t] = v;
    if (indices) indices[t] = idx;
  }
}

// softmax / log_softmax of one row or column: n elements `step` apart.
template <typename T>
__device__ __forceinline__ void softmax_write(const T* p, T* o, int64_t c, int64_t step, T mx, double s,
                                              bool log) {
  const T v = p[c * step];
  if (log) {
    o[c * step] = (v - mx) - static_cast<T>(::log(s));  // (x - max) first, as PyTorch
  } else {
    o[c * step] = math::texp(v - mx) * static_cast<T>(1.0 / s);
  }
}

template <typename T>
__global__ void softmax_rows_kernel(const T* x, T* out, int64_t rows, int64_t n, bool log) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* p = x + r * n;
    T mx = T(-INFINITY);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) mx = tmax(mx, p[c]);
    mx = block_max(mx);
    double s = 0;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) s += math::texp(p[c] - mx);
    s = block_sum(s);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) softmax_write(p, out + r * n, c, 1, mx, s, log);
  }
}

template <typename T>
__global__ void softmax_cols_kernel(const T* x, T* out, int64_t outer, int64_t n, int64_t inner, bool log) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const int64_t base = (t / inner) * n * inner + t % inner;
    const T* p = x + base;
    T mx = T(-INFINITY);
    for (int64_t c = 0; c < n; ++c) mx = tmax(mx, p[c * inner]);
    double s = 0;
    for (int64_t c = 0; c < n; ++c) s += math::texp(p[c * inner] - mx);
    for (int64_t c = 0; c < n; ++c) softmax_write(p, out + base, c, inner, mx, s, log);
  }
}

// log_softmax: g - exp(y) * sum(g); softmax: y * (g - sum(g * y)), in double.
template <typename T>
__device__ __forceinline__ double softmax_grad_term(T g, T y, bool log) {
  return log ? static_cast<double>(g) : static_cast<double>(g) * y;
}
template <typename T>
__device__ __forceinline__ T softmax_grad(T g, T y, double s, bool log) {
  return log ? static_cast<T>(g - ::exp(static_cast<double>(y)) * s) : static_cast<T>(y * (g - s));
}

template <typename T>
__global__ void softmax_grad_rows_kernel(const T* g, const T* y, T* out, int64_t rows, int64_t n,
                                         bool log) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * n;
    double s = 0;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) s += softmax_grad_term(g[base + c], y[base + c], log);
    s = block_sum(s);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) out[base + c] = softmax_grad(g[base + c], y[base + c], s, log);
  }
}

template <typename T>
__global__ void softmax_grad_cols_kernel(const T* g, const T* y, T* out, int64_t outer, int64_t n,
                                         int64_t inner, bool log) {
  TANDEM_GRID_STRIDE_LOOP(t, outer * inner) {
    const int64_t base = (t / inner) * n * inner + t % inner;
    double s = 0;
    for (int64_t c = 0; c < n; ++c) s += softmax_grad_term(g[base + c * inner], y[base + c * inner], log);
    for (int64_t c = 0; c < n; ++c) {
      const int64_t k = base + c * inner;
      out[k] = softmax_grad(g[k], y[k], s, log);
    }
  }
}

// The max kernels over x's `dims` into values (and indices unless undefined).
void max_into(int dev, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& values, const Tensor& indices) {
  const Blocked b = blocked(x, dims);
  const int64_t outputs = b.outer * b.inner;
  if (outputs == 0) return;
  int64_t* ip = indices.defined() ? static_cast<int64_t*>(const_cast<void*>(indices.raw_data())) : nullptr;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    if (b.inner == 1) {
      launch(on, max_rows_kernel<T>, row_grid(b.outer), kThreads, 0, in_ptr<T>(b.data), elem_ptr<T>(values), ip, b.outer,
             b.len);
    } else {
      launch(on, max_cols_kernel<T>, grid_for(outputs), kThreads, 0, in_ptr<T>(b.data), elem_ptr<T>(values), ip, b.outer,
             b.len, b.inner);
    }
  });
}

}  // namespace

Tensor sum_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const int dev = check_f32_f64_cuda("sum", {x});
  Tensor out = Tensor::empty(views::reduced_shape(x.shape(), dims, keepdim), x.dtype(), x.device());
  const Blocked b = blocked(x, dims);
  const int64_t outputs = b.outer * b.inner;
  if (outputs == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    if (b.inner == 1) {
      launch(on, sum_rows_kernel<T>, row_grid(b.outer), kThreads, 0, in_ptr<T>(b.data), elem_ptr<T>(out), b.outer,
             b.len);
    } else {
      launch(on, sum_cols_kernel<T>, column_tiles(b.outer, b.inner), dim3(kColumnTile, kColumnLanes), 0,
             in_ptr<T>(b.data), elem_ptr<T>(out), b.outer, b.len, b.inner);
    }
  });
  return out;
}

MaxResult max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  const int dev = check_f32_f64_cuda("max", {x});
  const std::vector<int64_t> dims = x.dim() == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{dim};
  const Shape shape = views::reduced_shape(x.shape(), dims, keepdim);
  MaxResult r{Tensor::empty(shape, x.dtype(), x.device()), Tensor::empty(shape, kInt64, x.device())};
  max_into(dev, x, dims, r.values, r.indices);
  return r;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const int dev = check_f32_f64_cuda("amax", {x});
  Tensor out = Tensor::empty(views::reduced_shape(x.shape(), dims, keepdim), x.dtype(), x.device());
  max_into(dev, x, dims, out, Tensor());
  return out;
}

Tensor softmax_forward(const Tensor& x_in, int64_t dim, bool log) {
  const int dev = check_f32_f64_cuda(log ? "log_softmax" : "softmax", {x_in});
  const Tensor x = x_in.contiguous();
  int64_t outer, n, inner;
  views::split_at(x.shape(), dim, outer, n, inner);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    if (inner == 1) {
      launch(on, softmax_rows_kernel<T>, row_grid(outer), kThreads, 0, in_ptr<T>(x), elem_ptr<T>(out), outer, n, log);
    } else {
      launch(on, softmax_cols_kernel<T>, grid_for(outer * inner), kThreads, 0, in_ptr<T>(x), elem_ptr<T>(out), outer,
             n, inner, log);
    }
  });
  return out;
}

Tensor softmax_backward(const Tensor& g_in, const Tensor& y_in, int64_t dim, bool log) {
  const int dev = check_f32_f64_cuda(log ? "log_softmax" : "softmax", {g_in, y_in});
  const Tensor g = g_in.contiguous(), y = y_in.contiguous();
  int64_t outer, n, inner;
  views::split_at(y.shape(), dim, outer, n, inner);
  Tensor out = Tensor::empty(y.shape(), y.dtype(), y.device());
  if (out.numel() == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(y.dtype(), [&](auto t) {
    using T = decltype(t);
    if (inner == 1) {
      launch(on, softmax_grad_rows_kernel<T>, row_grid(outer), kThreads, 0, in_ptr<T>(g), in_ptr<T>(y),
             elem_ptr<T>(out), outer, n, log);
    } else {
      launch(on, softmax_grad_cols_kernel<T>, grid_for(outer * inner), kThreads, 0, in_ptr<T>(g), in_ptr<T>(y),
             elem_ptr<T>(out), outer, n, inner, log);
    }
  });
  return out;
}

}  // namespace tandem::kernels::cuda
