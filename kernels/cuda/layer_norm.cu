// CUDA kernels of kernels/layer_norm.h (float32 and float64) under tandem::kernels::cuda.
// Assumes: validated by kernels/layer_norm.cpp (x holds whole rows of n elements; w, b of n
// elements or undefined; mean and rstd of one per row).
// How: one block of 256 threads per row for the forward and the input gradient (row statistics
// with block_sum in double, as the CPU kernel's); dweight and dbias by column tiles, a block of 32
// neighbouring columns x 8 row lanes whose sums are added in lane order (column_tile_sum of
// reduce.cuh; neighbouring threads read neighbouring addresses; no atomics).
// Guarantees: the CPU kernel's formulas and precision (statistics and sums in double, the rest
// in the element type); fresh contiguous outputs on the input's device, on its compute stream; deterministic.
#include <algorithm>
#include <cmath>

#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
const T* in_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}

template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd,
                                  int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * n;
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += static_cast<double>(row[j]);
    const double mu = block_sum(s) / static_cast<double>(n);
    double s2 = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double d = static_cast<double>(row[j]) - mu;
      s2 += d * d;
    }
    const double rs = 1.0 / ::sqrt(block_sum(s2) / static_cast<double>(n) + eps);
    if (threadIdx.x == 0) {
      mean[r] = static_cast<T>(mu);
      rstd[r] = static_cast<T>(rs);
    }
    const T m = static_cast<T>(mu), rsf = static_cast<T>(rs);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      T v = (row[j] - m) * rsf;
      if (w) v *= w[j];
      if (b) v += b[j];
      y[r * n + j] = v;
    }
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * w.
template <typename T>
__global__ void layer_norm_dx_kernel(const T* g, const T* x, const T* mean, const T* rstd,
                                     const T* w, T* dx, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const T m = mean[r], rs = rstd[r];
    double a = 0, b = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double dxhat = static_cast<double>(gr[j]) * (w ? static_cast<double>(w[j]) : 1.0);
      const double xhat = (static_cast<double>(xr[j]) - m) * rs;
      a += dxhat;
      b += dxhat * xhat;
    }
    a = block_sum(a);
    b = block_sum(b);
    const T ma = static_cast<T>(a / static_cast<double>(n)), mb = static_cast<T>(b / static_cast<double>(n));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T dxhat = gr[j] * (w ? w[j] : T(1));
      const T xhat = (xr[j] - m) * rs;
      dx[r * n + j] = rs * (dxhat - ma - xhat * mb);
    }
  }
}

// dw[j] = sum over rows of dy * xhat, db[j] = sum of dy (either output may be null). A block per tile of
// kColumnTile columns, its kColumnLanes row lanes added in order (column_tile_sum).
template <typename T>
__global__ void layer_norm_dwb_kernel(const T* g, const T* x, const T* mean, const T* rstd, T* dw,
                                      T* db, int64_t rows, int64_t n) {
  const int64_t j = int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  double acc[2] = {0, 0};
  if (j < n) {
    for (int64_t i = threadIdx.y; i < rows; i += kColumnLanes) {
      const double gv = static_cast<double>(g[i * n + j]);
      acc[0] += gv * (static_cast<double>(x[i * n + j]) - mean[i]) * rstd[i];
      acc[1] += gv;
    }
  }
  column_tile_sum(acc);
  if (threadIdx.y == 0 && j < n) {
    if (dw) dw[j] = static_cast<T>(acc[0]);
    if (db) db[j] = static_cast<T>(acc[1]);
  }
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535)); }

}  // namespace

LayerNormForward layer_norm_forward(const Tensor& x_in, int64_t n, const Tensor& w_in, const Tensor& b_in,
                                    double eps) {
  const int dev = check_f32_f64_cuda("layer_norm", {x_in, w_in, b_in});
  const Tensor x = x_in.contiguous();
  const Tensor w = w_in.defined() ? w_in.contiguous() : Tensor(), b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t rows = x.numel() / n;
  const Device device = x.device();
  const DType dt = x.dtype();
  LayerNormForward r{Tensor::empty(x.shape(), dt, device), Tensor::empty({rows}, dt, device),
                     Tensor::empty({rows}, dt, device)};
  if (rows == 0) return r;
  StreamGuard on(dev);
  dispatch_cuda_float(dt, [&](auto t) {
    using T = decltype(t);
    launch(on, layer_norm_kernel<T>, row_grid(rows), kThreads, 0, in_ptr<T>(x), in_ptr<T>(w), in_ptr<T>(b),
           elem_ptr<T>(r.output), elem_ptr<T>(r.mean), elem_ptr<T>(r.rstd), rows, n, eps);
  });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& g_in, const Tensor& x_in, const Tensor& mean_in,
                                   const Tensor& rstd_in, const Tensor& w_in, bool need_input, bool need_weight,
                                   bool need_bias) {
  const int dev = check_f32_f64_cuda("layer_norm", {g_in, x_in, mean_in, rstd_in, w_in});
  const Tensor g = g_in.contiguous(), x = x_in.contiguous();
  const Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const Tensor w = w_in.defined() ? w_in.contiguous() : Tensor();
  const int64_t rows = mean.numel();
  const int64_t n = w.defined() ? w.numel() : rows > 0 ? x.numel() / rows : 0;
  const Device device = x.device();
  LayerNormGrads r;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    if (need_input) {
      r.input = Tensor::empty(x.shape(), x.dtype(), device);
      if (rows > 0 && n > 0) {
        launch(on, layer_norm_dx_kernel<T>, row_grid(rows), kThreads, 0, in_ptr<T>(g), in_ptr<T>(x), in_ptr<T>(mean),
               in_ptr<T>(rstd), in_ptr<T>(w), elem_ptr<T>(r.input), rows, n);
      }
    }
    if (need_weight || need_bias) {
      const Shape shape = w.defined() ? w.shape() : Shape{n};
      if (need_weight) r.weight = Tensor::empty(shape, x.dtype(), device);
      if (need_bias) r.bias = Tensor::empty(shape, x.dtype(), device);
      if (n > 0) {
        launch(on, layer_norm_dwb_kernel<T>, dim3(static_cast<unsigned>((n + kColumnTile - 1) / kColumnTile)),
               dim3(kColumnTile, kColumnLanes), 0, in_ptr<T>(g), in_ptr<T>(x), in_ptr<T>(mean), in_ptr<T>(rstd),
               need_weight ? elem_ptr<T>(r.weight) : nullptr, need_bias ? elem_ptr<T>(r.bias) : nullptr, rows, n);
      }
    }
  });
  return r;
}

}  // namespace tandem::kernels::cuda
