// CPU fused optimizer updates (kernels/optim.h) under tandem::kernels::cpu:
// one pass over a parameter, its gradient and its state applying the
// functors of kernels/functors.h (the math lives there, once).
// Assumes: validated by kernels/optim.cpp (same shapes, dtypes, devices;
// parameter and state contiguous, since they are updated in place). The
// gradient may be non-contiguous (read through a contiguous copy).
// Guarantees: every element is updated exactly once; large tensors are split
// across the thread pool in contiguous slices.
#include "kernels/optim.h"

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kGrain = int64_t{1} << 15;

template <typename T>
T* mutable_data(const Tensor& t) {
  Tensor handle = t;  // same storage: writes land in the caller's tensor
  return handle.data<T>();
}

template <typename T>
void sgd_impl(const Tensor& param, const Tensor& grad_in, const Tensor& buf, const SgdStep& step) {
  const Tensor grad = grad_in.contiguous();
  T* p = mutable_data<T>(param);
  const T* g = grad.data<T>();
  T* b = buf.defined() ? mutable_data<T>(buf) : nullptr;
  detail::parallel_range(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    if (b) {
      for (int64_t i = i0; i < i1; ++i) step(p[i], g[i], b[i]);
    } else {
      T unused = 0;  // momentum == 0: the functor never reads the buffer
      for (int64_t i = i0; i < i1; ++i) step(p[i], g[i], unused);
    }
  });
}

template <typename T>
void adadelta_impl(const Tensor& param, const Tensor& grad_in, const Tensor& sq, const Tensor& acc,
                   const AdadeltaStep& step) {
  const Tensor grad = grad_in.contiguous();
  T* p = mutable_data<T>(param);
  const T* g = grad.data<T>();
  T* s = mutable_data<T>(sq);
  T* a = mutable_data<T>(acc);
  detail::parallel_range(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) step(p[i], g[i], s[i], a[i]);
  });
}

template <typename T>
void adam_impl(const Tensor& param, const Tensor& grad_in, const Tensor& m, const Tensor& v,
               const AdamStep& step) {
  const Tensor grad = grad_in.contiguous();
  T* p = mutable_data<T>(param);
  const T* g = grad.data<T>();
  T* mp = mutable_data<T>(m);
  T* vp = mutable_data<T>(v);
  detail::parallel_range(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) step(p[i], g[i], mp[i], vp[i]);
  });
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& step) {
  detail::check_cpu("sgd_update", param);
  detail::dispatch_float(param.dtype(), "sgd_update",
                         [&](auto t) { sgd_impl<decltype(t)>(param, grad, momentum_buf, step); });
}

void adadelta_update(const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                     const Tensor& acc_delta, const AdadeltaStep& step) {
  detail::check_cpu("adadelta_update", param);
  detail::dispatch_float(param.dtype(), "adadelta_update", [&](auto t) {
    adadelta_impl<decltype(t)>(param, grad, square_avg, acc_delta, step);
  });
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamStep& step) {
  detail::check_cpu("adam_update", param);
  detail::dispatch_float(param.dtype(), "adam_update",
                         [&](auto t) { adam_impl<decltype(t)>(param, grad, exp_avg, exp_avg_sq, step); });
}

}  // namespace tandem::kernels::cpu
