// CPU batch_norm over the channel dimension of x [N, C, *]. Owns the forward
// (training with running-stat update, eval) and backward kernels of
// kernels/batch_norm.h under tandem::kernels::cpu.
// Assumes: arguments validated by kernels/batch_norm.cpp; running_mean/var,
// when defined, are contiguous [C] tensors of x's dtype (updated in place).
// Guarantees: PyTorch's semantics: biased batch variance to normalise,
// running_var updated with the unbiased one (n/(n-1)); save_mean/save_invstd
// are the statistics used (batch in training, running in eval). Each channel
// is handled by one thread in tight vectorised passes over its N rows of
// H*W values (forward: one pass for the shifted first and second moments,
// one to write; backward: one for the two sums, one to write); sums of rows
// accumulate in double.
#include "kernels/batch_norm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

using detail::ArrMap;
using detail::CArrMap;

struct Layout {
  int64_t N, C, HW;
};

Layout layout_of(const Tensor& x) {
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t HW = N * C == 0 ? 0 : x.numel() / (N * C);
  return {N, C, HW};
}

// Channels per parallel chunk: aim for >= 32K elements of work per chunk.
int64_t channel_grain(const Layout& l) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, l.N * l.HW));
}

template <typename T>
BatchNormForward forward_impl(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                              const Tensor& running_mean, const Tensor& running_var, bool training,
                              double momentum, double eps) {
  const Tensor x = x_in.contiguous();
  const Tensor weight = weight_in.defined() ? weight_in.contiguous() : Tensor();
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  const Layout l = layout_of(x);
  BatchNormForward r;
  r.output = Tensor::empty(x.shape(), x.dtype());
  r.save_mean = Tensor::empty({l.C}, x.dtype());
  r.save_invstd = Tensor::empty({l.C}, x.dtype());

  const bool update = training && running_mean.defined() && running_var.defined();
  const T* xp = x.data<T>();
  const T* wp = weight.defined() ? weight.data<T>() : nullptr;
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = r.output.data<T>();
  T* mp = r.save_mean.data<T>();
  T* ip = r.save_invstd.data<T>();
  Tensor rm = running_mean, rv = running_var;  // handles to the caller's buffers
  T* rmp = running_mean.defined() ? rm.data<T>() : nullptr;
  T* rvp = running_var.defined() ? rv.data<T>() : nullptr;
  const int64_t M = l.N * l.HW;

  detail::parallel_range(l.C, channel_grain(l), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      T mean, invstd;
      if (training) {
        // One pass for both moments, shifted by the channel's first value so
        // that the sum of squares does not cancel catastrophically.
        const T shift = M > 0 ? xp[c * l.HW] : T(0);
        double s1 = 0, s2 = 0;
        for (int64_t n = 0; n < l.N; ++n) {
          const CArrMap<T> row(xp + (n * l.C + c) * l.HW, l.HW);  // L1-resident: read twice
          s1 += (row - shift).sum();
          s2 += (row - shift).square().sum();
        }
        const double m = M > 0 ? s1 / double(M) : 0.0;
        const double var_sum = std::max(0.0, s2 - s1 * m);  // sum of (x - mean)^2
        const double mean_d = double(shift) + m;
        mean = T(mean_d);
        const double var = M > 0 ? var_sum / double(M) : 0.0;
        invstd = T(1.0 / std::sqrt(var + eps));
        if (update) {
          const double unbiased = M > 1 ? var_sum / double(M - 1) : var;
          rmp[c] = T(momentum * mean_d + (1.0 - momentum) * double(rmp[c]));
          rvp[c] = T(momentum * unbiased + (1.0 - momentum) * double(rvp[c]));
        }
      } else {
        mean = rmp[c];
        invstd = T(1.0 / std::sqrt(double(rvp[c]) + eps));
      }
      mp[c] = mean;
      ip[c] = invstd;
      const T alpha = wp ? invstd * wp[c] : invstd;
      const T beta = (bp ? bp[c] : T(0)) - mean * alpha;
      for (int64_t n = 0; n < l.N; ++n) {
        const int64_t off = (n * l.C + c) * l.HW;
        ArrMap<T>(yp + off, l.HW) = CArrMap<T>(xp + off, l.HW) * alpha + beta;
      }
    }
  });
  return r;
}

template <typename T>
BatchNormGrads backward_impl(const Tensor& gy_in, const Tensor& x_in, const Tensor& weight_in,
                             const Tensor& save_mean_in, const Tensor& save_invstd_in, bool training,
                             bool need_input, bool need_weight, bool need_bias) {
  BatchNormGrads g;
  if (!need_input && !need_weight && !need_bias) return g;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous();
  const Tensor weight = weight_in.defined() ? weight_in.contiguous() : Tensor();
  const Tensor save_mean = save_mean_in.contiguous(), save_invstd = save_invstd_in.contiguous();
  const Layout l = layout_of(x);
  if (need_input) g.input = Tensor::empty(x.shape(), x.dtype());
  if (need_weight) g.weight = Tensor::empty({l.C}, x.dtype());
  if (need_bias) g.bias = Tensor::empty({l.C}, x.dtype());

  const T* gyp = gy.data<T>();
  const T* xp = x.data<T>();
  const T* wp = weight.defined() ? weight.data<T>() : nullptr;
  const T* mp = save_mean.data<T>();
  const T* ip = save_invstd.data<T>();
  T* gxp = need_input ? g.input.data<T>() : nullptr;
  T* gwp = need_weight ? g.weight.data<T>() : nullptr;
  T* gbp = need_bias ? g.bias.data<T>() : nullptr;
  const int64_t M = l.N * l.HW;
  // Training needs both sums for the input gradient; eval needs them only for
  // the weight and bias gradients.
  const bool need_sums = need_weight || need_bias || (need_input && training);

  detail::parallel_range(l.C, channel_grain(l), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T mean = mp[c], invstd = ip[c];
      const T w = wp ? wp[c] : T(1);
      double sum_dy = 0, sum_dy_xmu = 0;
      if (need_sums) {
        for (int64_t n = 0; n < l.N; ++n) {
          const int64_t off = (n * l.C + c) * l.HW;
          const CArrMap<T> dy(gyp + off, l.HW), xv(xp + off, l.HW);
          sum_dy += dy.sum();
          sum_dy_xmu += (dy * (xv - mean)).sum();
        }
      }
      if (gwp) gwp[c] = T(sum_dy_xmu * double(invstd));
      if (gbp) gbp[c] = T(sum_dy);
      if (!gxp) continue;
      if (training) {
        const T grad_mean = M > 0 ? T(sum_dy / double(M)) : T(0);
        const T k = M > 0 ? T(sum_dy_xmu / double(M)) * invstd * invstd : T(0);
        const T scale = invstd * w;
        for (int64_t n = 0; n < l.N; ++n) {
          const int64_t off = (n * l.C + c) * l.HW;
          const CArrMap<T> dy(gyp + off, l.HW), xv(xp + off, l.HW);
          ArrMap<T>(gxp + off, l.HW) = (dy - grad_mean - (xv - mean) * k) * scale;
        }
      } else {
        const T scale = invstd * w;
        for (int64_t n = 0; n < l.N; ++n) {
          const int64_t off = (n * l.C + c) * l.HW;
          ArrMap<T>(gxp + off, l.HW) = CArrMap<T>(gyp + off, l.HW) * scale;
        }
      }
    }
  });
  return g;
}

}  // namespace

BatchNormForward batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps) {
  detail::check_cpu("batch_norm_forward", x);
  return detail::dispatch_float(x.dtype(), "batch_norm_forward", [&](auto t) {
    return forward_impl<decltype(t)>(x, weight, bias, running_mean, running_var, training, momentum, eps);
  });
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd, bool training,
                                   bool need_input, bool need_weight, bool need_bias) {
  detail::check_cpu("batch_norm_backward", x);
  return detail::dispatch_float(x.dtype(), "batch_norm_backward", [&](auto t) {
    return backward_impl<decltype(t)>(grad_out, x, weight, save_mean, save_invstd, training, need_input,
                                      need_weight, need_bias);
  });
}

}  // namespace tandem::kernels::cpu
