// The elementwise fast paths on CUDA (float32 and float64): add, sub, mul of same-shape operands,
// scale by a scalar (multiplied in the element type, as T(s) * a), sum of all elements to a 0-D tensor (two
// deterministic passes with double accumulation: per-block partials, then one block), argmax over
// dim 1 of a 2-D tensor to int64 (one warp per row; first maximum wins, NaN counts as the
// maximum, as torch.argmax). Inputs may be strided (made contiguous first); outputs are
// contiguous; all work is on the compute stream.
#include <algorithm>

#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

enum BinaryOp : int { kAdd = 0, kSub = 1, kMul = 2 };

template <typename T>
__global__ void binary_kernel(const T* a, const T* b, T* out, int op, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const T x = a[i], y = b[i];
    out[i] = op == kAdd ? x + y : op == kSub ? x - y : x * y;
  }
}

template <typename T>
__global__ void scale_kernel(const T* a, T s, T* out, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { out[i] = s * a[i]; }
}

template <typename T>
__global__ void partial_sum_kernel(const T* a, int64_t n, double* partial) {
  double acc = 0;
  TANDEM_GRID_STRIDE_LOOP(i, n) { acc += a[i]; }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <typename T>
__global__ void final_sum_kernel(const double* partial, int count, T* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = static_cast<T>(acc);
}

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void argmax_kernel(const T* a, int64_t* out, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* r = a + row * C;
  T best = r[0];
  int64_t best_i = 0;
  for (int64_t j = lane; j < C; j += 32) {
    if (beats(r[j], j, best, best_i)) {
      best = r[j];
      best_i = j;
    }
  }
  warp_argmax(best, best_i);
  if (lane == 0) out[row] = best_i;
}

Tensor binary(const char* op_name, int op, const Tensor& a_in, const Tensor& b_in) {
  const int dev = check_f32_f64_cuda(op_name, {a_in, b_in});
  TANDEM_CHECK(a_in.shape() == b_in.shape(), op_name, ": operands must have the same shape, got ", a_in.str(), " and ",
               b_in.str());
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  const int64_t n = a.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, binary_kernel<T>, grid_for(n), 256, 0, elem_ptr<T>(a), elem_ptr<T>(b), elem_ptr<T>(out), op, n);
  });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", kMul, a, b); }

Tensor scale(const Tensor& a_in, double s) {
  const int dev = check_f32_f64_cuda("scale", {a_in});
  const Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  const int64_t n = a.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, scale_kernel<T>, grid_for(n), 256, 0, elem_ptr<T>(a), static_cast<T>(s), elem_ptr<T>(out), n);
  });
  return out;
}

Tensor sum(const Tensor& a_in) {
  const int dev = check_f32_f64_cuda("sum", {a_in});
  const Tensor a = a_in.contiguous();
  const int64_t n = a.numel();
  Tensor out = Tensor::empty({}, a.dtype(), a.device());
  if (n == 0) return out.zero_();
  constexpr int kThreads = 256, kMaxBlocks = 1024;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  Tensor partial = Tensor::empty({blocks}, kFloat64, a.device());
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, partial_sum_kernel<T>, blocks, kThreads, 0, elem_ptr<T>(a), n, elem_ptr<double>(partial));
    launch(on, final_sum_kernel<T>, 1, kThreads, 0, elem_ptr<const double>(partial), blocks, elem_ptr<T>(out));
  });
  return out;
}

Tensor argmax(const Tensor& a_in) {
  const int dev = check_f32_f64_cuda("argmax", {a_in});
  TANDEM_CHECK(a_in.dim() == 2, "argmax: expected a 2-D [N, C] tensor, got ", a_in.str());
  const int64_t N = a_in.size(0), C = a_in.size(1);
  TANDEM_CHECK(C > 0 || N == 0, "argmax: cannot take the argmax of empty rows in ", a_in.str());
  TANDEM_CHECK((N + kWarpsPerBlock - 1) / kWarpsPerBlock <= 0x7fffffff, "argmax: too many rows in ", a_in.str());
  const Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty({N}, kInt64, a.device());
  if (N == 0) return out;
  StreamGuard on(dev);
  const auto blocks = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, argmax_kernel<T>, blocks, kWarpsPerBlock * 32, 0, elem_ptr<T>(a), elem_ptr<int64_t>(out), N, C);
  });
  return out;
}

}  // namespace tandem::kernels::cuda
