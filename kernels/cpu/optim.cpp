// CPU fused optimizer updates (kernels/optim.h) under tandem::kernels::cpu:
// one pass over a parameter, its gradient and its state applying the
// functors of kernels/functors.h (the math lives there, once).
// Assumes: validated by kernels/optim.cpp (same shapes, dtypes, devices;
// parameter and state contiguous, since they are updated in place). The
// gradient may be non-contiguous (read through a contiguous copy).
// Guarantees: every element is updated exactly once; large tensors are split
// across the thread pool in contiguous slices. The loops read through
// __restrict pointers into locals and write back once, so GCC vectorizes them
// (the by-reference functor on aliasing pointers stayed scalar: SGD without
// momentum 2.9 -> 1.0 ms per 4M floats, with momentum 6 -> 1.6 ms; bench/PERF_NOTES.md);
// the buffers must therefore not overlap, which is checked.
#include "kernels/ops.h"

#include "kernels/cpu/common.h"

#include <initializer_list>

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kGrain = int64_t{1} << 15;

template <typename T>
T* mutable_data(const Tensor& t) {
  Tensor handle = t;  // same storage: writes land in the caller's tensor
  return handle.data<T>();
}

// The update loops promise the compiler that these buffers do not overlap.
void check_disjoint(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* a : ts)
    for (const Tensor* b : ts) {
      if (a >= b || !a->defined() || !b->defined()) continue;
      const auto* a0 = static_cast<const char*>(a->raw_data());
      const auto* b0 = static_cast<const char*>(b->raw_data());
      const auto* a1 = a0 + a->nbytes();
      const auto* b1 = b0 + b->nbytes();
      TANDEM_CHECK(a1 <= b0 || b1 <= a0, op, ": the parameter, its gradient and its state must not share memory");
    }
}

template <typename T>
void sgd_impl(const Tensor& param, const Tensor& grad_in, const Tensor& buf, const SgdStep& step) {
  const Tensor grad = grad_in.contiguous();
  T* p = mutable_data<T>(param);
  const T* g = grad.data<T>();
  T* b = buf.defined() ? mutable_data<T>(buf) : nullptr;
  check_disjoint("sgd_update", {&param, &grad, &buf});
  detail::parallel_range(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    const SgdStep st = step;
    T* __restrict pr = p;
    const T* __restrict gr = g;
    if (b && st.momentum != 0.0f) {
      T* __restrict br = b;
      for (int64_t i = i0; i < i1; ++i) {
        T pi = pr[i], bi = br[i];
        st(pi, gr[i], bi);
        pr[i] = pi;
        br[i] = bi;
      }
    } else {
      SgdStep plain = st;  // momentum == 0: the functor never reads the buffer
      plain.momentum = 0.0f;
      for (int64_t i = i0; i < i1; ++i) {
        T pi = pr[i], unused = 0;
        plain(pi, gr[i], unused);
        pr[i] = pi;
      }
    }
  });
}

// Adadelta and Adam: a parameter, its gradient and two state buffers, one functor call per element.
template <typename T, typename Step>
void two_state_impl(const char* op, const Tensor& param, const Tensor& grad_in, const Tensor& s1,
                    const Tensor& s2, const Step& step) {
  const Tensor grad = grad_in.contiguous();
  T* p = mutable_data<T>(param);
  const T* g = grad.data<T>();
  T* a = mutable_data<T>(s1);
  T* b = mutable_data<T>(s2);
  check_disjoint(op, {&param, &grad, &s1, &s2});
  detail::parallel_range(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    const Step st = step;
    T* __restrict pr = p;
    const T* __restrict gr = g;
    T* __restrict ar = a;
    T* __restrict br = b;
    for (int64_t i = i0; i < i1; ++i) {
      T pi = pr[i], ai = ar[i], bi = br[i];
      st(pi, gr[i], ai, bi);
      pr[i] = pi;
      ar[i] = ai;
      br[i] = bi;
    }
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
    two_state_impl<decltype(t)>("adadelta_update", param, grad, square_avg, acc_delta, step);
  });
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamStep& step) {
  detail::check_cpu("adam_update", param);
  detail::dispatch_float(param.dtype(), "adam_update",
                         [&](auto t) {
    two_state_impl<decltype(t)>("adam_update", param, grad, exp_avg, exp_avg_sq, step);
  });
}

}  // namespace tandem::kernels::cpu
