// Per-element math written once, used by the CPU kernels (kernels/cpu) and the
// CUDA kernels (kernels/cuda) alike. Every functor is a host-device function of
// scalars; state tensors are updated through references. Semantics follow
// PyTorch's (torch.optim, torch.nn.functional) exactly.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

namespace tandem::kernels {

// sqrt in the argument's own precision, on host and device alike.
TANDEM_HD float tsqrt(float x) { return sqrtf(x); }
TANDEM_HD double tsqrt(double x) { return sqrt(x); }

// relu as PyTorch's: NaN stays NaN (x != x), so a diverging run shows; the gradient is zero only where
// the output is <= 0 (threshold_backward's rule), so a NaN passes its gradient on.
struct ReluForward {
  template <typename T> TANDEM_HD T operator()(T x) const { return x > T(0) || x != x ? x : T(0); }
};

struct ReluBackward {  // from the output: relu'(x) = !(y <= 0)
  template <typename T> TANDEM_HD T operator()(T grad, T y) const { return y <= T(0) ? T(0) : grad; }
};

// torch.optim.SGD: d = g + wd*p; buf = first ? d : momentum*buf + (1-dampening)*d;
// d = nesterov ? d + momentum*buf : buf; p -= lr*d.
struct SgdStep {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first;
  template <typename T> TANDEM_HD void operator()(T& p, T g, T& buf) const {
    T d = g + T(weight_decay) * p;
    if (momentum != 0.0f) {
      buf = first ? d : T(momentum) * buf + T(1.0f - dampening) * d;
      d = nesterov ? d + T(momentum) * buf : buf;
    }
    p -= T(lr) * d;
  }
};

// torch.optim.Adadelta: g += wd*p; sq = rho*sq + (1-rho)*g^2;
// delta = sqrt(acc + eps) / sqrt(sq + eps) * g; acc = rho*acc + (1-rho)*delta^2; p -= lr*delta.
struct AdadeltaStep {
  float lr, rho, eps, weight_decay;
  template <typename T> TANDEM_HD void operator()(T& p, T g, T& square_avg, T& acc_delta) const {
    g += T(weight_decay) * p;
    square_avg = T(rho) * square_avg + T(1.0f - rho) * g * g;
    const T std = tsqrt(square_avg + T(eps));
    const T delta = tsqrt(acc_delta + T(eps)) / std * g;
    acc_delta = T(rho) * acc_delta + T(1.0f - rho) * delta * delta;
    p -= T(lr) * delta;
  }
};

// torch.optim.Adam / AdamW (decoupled weight decay), without amsgrad.
// bias_correction1 = 1 - beta1^step, bias_correction2 = 1 - beta2^step.
struct AdamStep {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  float bias_correction1, bias_correction2;
  // 1 - beta1, 1 - beta2 and AdamW's 1 - lr * weight_decay, rounded once from double as PyTorch's
  // scalars are (1.0f - 0.999f is 1.3e-5 away from 0.001 in relative terms). make() sets them.
  float one_minus_beta1 = 0, one_minus_beta2 = 0, decay = 1;
  static AdamStep make(double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                       double bias_correction1, double bias_correction2) {
    return {float(lr), float(beta1), float(beta2), float(eps), float(weight_decay), decoupled,
            float(bias_correction1), float(bias_correction2), float(1.0 - beta1), float(1.0 - beta2),
            float(1.0 - lr * weight_decay)};
  }
  template <typename T> TANDEM_HD void operator()(T& p, T g, T& m, T& v) const {
    if (decoupled) {
      p *= T(decay);
    } else {
      g += T(weight_decay) * p;
    }
    m = T(beta1) * m + T(one_minus_beta1) * g;
    v = T(beta2) * v + T(one_minus_beta2) * g * g;
    const T denom = tsqrt(v) / T(tsqrt(bias_correction2)) + T(eps);
    p -= T(lr / bias_correction1) * m / denom;
  }
};

}  // namespace tandem::kernels
