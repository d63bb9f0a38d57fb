// CPU relu forward/backward (kernels/activation.h) under tandem::kernels::cpu,
// applying the per-element functors of kernels/functors.h in one pass.
// Assumes: validated by kernels/activation.cpp; inputs may be non-contiguous.
// Guarantees: fresh contiguous outputs; large tensors are split across the
// thread pool in contiguous slices, small ones stay on the calling thread.
#include "kernels/ops.h"

#include "kernels/cpu/common.h"
#include "kernels/functors.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kGrain = int64_t{1} << 16;

template <typename T>
Tensor forward_impl(const Tensor& x_in) {
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  const ReluForward f;
  detail::parallel_range(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] = f(xp[i]);
  });
  return y;
}

template <typename T>
Tensor backward_impl(const Tensor& gy_in, const Tensor& y_in) {
  const Tensor gy = gy_in.contiguous(), y = y_in.contiguous();
  Tensor gx = Tensor::empty(y.shape(), y.dtype());
  const T* gp = gy.data<T>();
  const T* yp = y.data<T>();
  T* op = gx.data<T>();
  const ReluBackward f;
  detail::parallel_range(y.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) op[i] = f(gp[i], yp[i]);
  });
  return gx;
}

}  // namespace

// [op-cpu-kernel]
Tensor relu_forward(const Tensor& x) {
  detail::check_cpu("relu_forward", x);
  return detail::dispatch_float(x.dtype(), "relu_forward",
                                [&](auto t) { return forward_impl<decltype(t)>(x); });
}
// [op-cpu-kernel]

Tensor relu_backward(const Tensor& grad_out, const Tensor& y) {
  detail::check_cpu("relu_backward", y);
  return detail::dispatch_float(y.dtype(), "relu_backward",
                                [&](auto t) { return backward_impl<decltype(t)>(grad_out, y); });
}

}  // namespace tandem::kernels::cpu
