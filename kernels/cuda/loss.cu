// log_softmax over the rows of x [N, C] and nll_loss's fast path, the mean over the rows whose
// int64 target [N] is not ignore_index, on CUDA (float32 and float64). log_softmax: one warp per row
// (max, sum of exp, in the element type); backward dx = g - exp(y) * sum(g).
// nll_loss forward: one block sums -log_probs[i, target[i]] over the kept rows (double
// accumulation) and divides by their count (none kept: NaN); backward, one block, counts the kept
// rows and writes -grad / kept at each kept row's target into a zeroed [N, C] (none kept: zeros);
// grad is read on the device, so nothing waits for the host.
// Out-of-range targets: the host cannot see the targets without waiting for the device, so the
// kernels skip such rows (never reading or writing out of bounds) and record the first one in the
// device's kernel-error record (core/cuda/context.h). The error is thrown, naming the row and the value, at
// the next read of any result from that device (e.g. loss.item()); the loss value itself is then
// never seen by the caller. class_targets (cross_entropy's target pass) reports the same way.
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"
#include "kernels/pointwise_math.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <typename T>
__device__ __forceinline__ T warp_all_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = tmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_all_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void log_softmax_forward_kernel(const T* x, T* y, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;  // the whole warp leaves together
  const T* xr = x + row * C;
  T m = T(-INFINITY);
  for (int64_t j = lane; j < C; j += 32) m = tmax(m, xr[j]);
  m = warp_all_max(m);
  T s = T(0);
  for (int64_t j = lane; j < C; j += 32) s += math::texp(xr[j] - m);
  s = warp_all_sum(s);
  const T ls = math::tlog(s);
  T* yr = y + row * C;
  for (int64_t j = lane; j < C; j += 32) yr[j] = (xr[j] - m) - ls;  // (x - max) first, as PyTorch
}

template <typename T>
__global__ void log_softmax_backward_kernel(const T* g, const T* y, T* dx, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* gr = g + row * C;
  const T* yr = y + row * C;
  T s = T(0);
  for (int64_t j = lane; j < C; j += 32) s += gr[j];
  s = warp_all_sum(s);
  T* dr = dx + row * C;
  for (int64_t j = lane; j < C; j += 32) dr[j] = gr[j] - math::texp(yr[j]) * s;
}

__device__ void report_bad_target(KernelErrorRecord* rec, int64_t row, int64_t value, int64_t C) {
  tandem::cuda::report_kernel_error(rec, kNllTargetOutOfRange, 0, row, value, C);
}

// Whether row i counts: its target is a class (out-of-range targets are reported and skipped).
__device__ __forceinline__ bool kept_row(const int64_t* target, int64_t i, int64_t C, int64_t ignore_index,
                                         KernelErrorRecord* rec) {
  const int64_t t = target[i];
  if (t == ignore_index) return false;
  if (t < 0 || t >= C) {
    report_bad_target(rec, i, t, C);
    return false;
  }
  return true;
}

template <typename T>
__global__ void nll_forward_kernel(const T* lp, const int64_t* target, int64_t N, int64_t C, int64_t ignore_index,
                                   T* out, KernelErrorRecord* rec) {
  double acc = 0, kept = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    if (!kept_row(target, i, C, ignore_index, rec)) continue;
    acc -= lp[i * C + target[i]];
    kept += 1;
  }
  acc = block_sum(acc);
  kept = block_sum(kept);
  if (threadIdx.x == 0) *out = static_cast<T>(acc / kept);  // nothing kept: 0 / 0 = NaN, as PyTorch
}

template <typename T>
__global__ void nll_backward_kernel(const T* grad, const int64_t* target, T* dx, int64_t N, int64_t C,
                                    int64_t ignore_index, KernelErrorRecord* rec) {
  double kept = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) kept += kept_row(target, i, C, ignore_index, rec) ? 1 : 0;
  kept = block_sum(kept);
  if (kept == 0) return;  // the NaN mean has a zero gradient, as PyTorch's
  const T g = -grad[0] / static_cast<T>(kept);
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const int64_t t = target[i];
    if (t != ignore_index && t >= 0 && t < C) dx[i * C + t] = g;
  }
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock); }

void check_rows(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.dim() == 2, op, ": expected a 2-D [N, C] tensor, got ", x.str());
  TANDEM_CHECK((x.size(0) + kWarpsPerBlock - 1) / kWarpsPerBlock <= 0x7fffffff, op, ": too many rows in ", x.str());
}

void check_target(const char* op, const Tensor& log_probs, const Tensor& target) {
  TANDEM_CHECK(log_probs.dim() == 2, op, ": log_probs must be [N, C], got ", log_probs.str());
  TANDEM_CHECK(target.defined() && target.dtype() == kInt64 && target.device() == log_probs.device(), op,
               ": target must be int64 on ", log_probs.device().str(), ", got ", target.str());
  TANDEM_CHECK(target.dim() == 1 && target.size(0) == log_probs.size(0), op, ": target must be [",
               log_probs.size(0), "], got ", target.str());
}

template <typename K>
__global__ void class_targets_kernel(const int64_t* target, int64_t M, int64_t C, int64_t ignore_index, K* keep,
                                     int64_t* safe, KernelErrorRecord* rec) {
  TANDEM_GRID_STRIDE_LOOP(i, M) {
    const int64_t t = target[i];
    const bool ok = t != ignore_index && t >= 0 && t < C;
    if (t != ignore_index && !ok) tandem::cuda::report_kernel_error(rec, kClassTargetOutOfRange, 0, i, t, C);
    keep[i] = ok ? K(1) : K(0);
    safe[i] = ok ? t : 0;
  }
}

}  // namespace

ClassTargets class_targets(const Tensor& target_in, int64_t C, int64_t ignore_index, DType keep_dtype) {
  const int dev = target_in.device().index;
  check_device_index(dev);
  const Tensor target = target_in.contiguous();
  const int64_t M = target.numel();
  ClassTargets r{Tensor::empty({M}, keep_dtype, target.device()), Tensor::empty({M, 1}, kInt64, target.device())};
  if (M == 0) return r;
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  const auto* t = static_cast<const int64_t*>(target.raw_data());
  auto* safe = static_cast<int64_t*>(const_cast<void*>(r.safe.raw_data()));
  void* keep = const_cast<void*>(r.keep.raw_data());
  if (keep_dtype == kFloat64) {
    launch(on, class_targets_kernel<double>, grid_for(M), 256, 0, t, M, C, ignore_index, static_cast<double*>(keep),
           safe, rec);
  } else {
    launch(on, class_targets_kernel<float>, grid_for(M), 256, 0, t, M, C, ignore_index, static_cast<float*>(keep),
           safe, rec);
  }
  mark_kernel_error_check_pending(dev);
  return r;
}

Tensor log_softmax_forward(const Tensor& x_in) {
  const char* op = "log_softmax_forward";
  const int dev = check_f32_f64_cuda(op, {x_in});
  check_rows(op, x_in);
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t N = x.size(0), C = x.size(1);
  if (N == 0 || C == 0) return y;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, log_softmax_forward_kernel<T>, row_blocks(N), kWarpsPerBlock * 32, 0, elem_ptr<T>(x), elem_ptr<T>(y),
           N, C);
  });
  return y;
}

Tensor log_softmax_backward(const Tensor& grad_out_in, const Tensor& y_in) {
  const char* op = "log_softmax_backward";
  const int dev = check_f32_f64_cuda(op, {grad_out_in, y_in});
  check_rows(op, y_in);
  TANDEM_CHECK(grad_out_in.shape() == y_in.shape(), op, ": grad_output ", grad_out_in.str(), " does not match output ",
               y_in.str());
  const Tensor g = grad_out_in.contiguous(), y = y_in.contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  const int64_t N = y.size(0), C = y.size(1);
  if (N == 0 || C == 0) return dx;
  StreamGuard on(dev);
  dispatch_cuda_float(y.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, log_softmax_backward_kernel<T>, row_blocks(N), kWarpsPerBlock * 32, 0, elem_ptr<T>(g), elem_ptr<T>(y),
           elem_ptr<T>(dx), N, C);
  });
  return dx;
}

Tensor nll_loss_mean_forward(const Tensor& log_probs_in, const Tensor& target_in, int64_t ignore_index) {
  const char* op = "nll_loss_forward";
  const int dev = check_f32_f64_cuda(op, {log_probs_in});
  check_target(op, log_probs_in, target_in);
  const Tensor lp = log_probs_in.contiguous(), target = target_in.contiguous();
  Tensor loss = Tensor::empty({}, lp.dtype(), lp.device());
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  dispatch_cuda_float(lp.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, nll_forward_kernel<T>, 1, 256, 0, elem_ptr<T>(lp), elem_ptr<const int64_t>(target), lp.size(0),
           lp.size(1), ignore_index, elem_ptr<T>(loss), rec);
  });
  mark_kernel_error_check_pending(dev);
  return loss;
}

Tensor nll_loss_mean_backward(const Tensor& grad_out_in, const Tensor& log_probs_in, const Tensor& target_in,
                              int64_t ignore_index) {
  const char* op = "nll_loss_backward";
  const int dev = check_f32_f64_cuda(op, {grad_out_in, log_probs_in});
  check_target(op, log_probs_in, target_in);
  TANDEM_CHECK(grad_out_in.numel() == 1, op, ": grad_output must hold one value, got ", grad_out_in.str());
  const Tensor g = grad_out_in.contiguous(), target = target_in.contiguous();
  Tensor dx = Tensor::zeros(log_probs_in.shape(), log_probs_in.dtype(), log_probs_in.device());
  const int64_t N = log_probs_in.size(0), C = log_probs_in.size(1);
  if (N == 0) return dx;
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  dispatch_cuda_float(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, nll_backward_kernel<T>, 1, 256, 0, elem_ptr<T>(g), elem_ptr<const int64_t>(target),
           elem_ptr<T>(dx), N, C, ignore_index, rec);
  });
  mark_kernel_error_check_pending(dev);
  return dx;
}

}  // namespace tandem::kernels::cuda
