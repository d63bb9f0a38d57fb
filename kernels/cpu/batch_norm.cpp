// CPU batch_norm over the channel dimension of x [N, C, *]. Owns the forward
// (training with running-stat update, eval) and backward kernels of
// kernels/batch_norm.h under tandem::kernels::cpu.
// Assumes: arguments validated by kernels/batch_norm.cpp; running_mean/var,
// when defined, are contiguous [C] tensors of x's dtype (updated in place).
// Guarantees: PyTorch's semantics: biased batch variance to normalise,
// running_var updated with the unbiased one (n/(n-1)); save_mean/save_invstd
// are the statistics used (batch in training, running in eval). Tight
// vectorised passes over rows of H*W values (forward: one pass for the shifted
// first and second moments, one to write; backward: one for the two sums, one
// to write), every pass split by images across threads (as the image-split
// convolutions around a batch norm write and read its tensors: at 2 threads,
// reading rows another core last wrote had doubled a pass's time); each row's
// sums are kept per (image, channel) and added per channel in image order, in
// double: the bits do not depend on the thread count.
// The fused batch_norm+relu entry points (batch_norm_relu_*) share these
// passes; their output is max(0, fma(x, a, b)) with a = invstd * weight and
// b = bias - mean * a per channel, and their backward recomputes that value
// with the same instructions to mask dy (no saved output, no separate relu
// passes over the activations): bitwise the same mask as the forward. Their float rows are
// AVX-512 where compiled in (kernels/cpu/simd.h), else scalar; each call is counted in
// simd_path_count with the level of the rows it ran.
// The statistics, the affine map and the layout are kernels/cpu/batch_norm_stats.h's, shared with
// the fused batch_norm+relu+max_pool kernels (kernels/cpu/batch_norm_pool.cpp).
// x may be bfloat16 (weight, bias, running and saved statistics float32), computed in float32: the
// relu vector rows widen it on load and round the input gradient to bfloat16 on store
// (simd::load_first / store_first), as do the AVX-512 statistics; the AVX2/portable statistics, the
// plain batch_norm's (Eigen) rows and the portable rows widen each row into a per-thread scratch
// first and round the gradient from one (kernels/cpu/batch_norm_stats.h). The output is float32.
// The same instructions in the same order as on float32 rows: the same bits as casting x up, the
// float32 kernel and casting the input gradient down.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/batch_norm_stats.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu {
namespace {

using detail::bn_affine_of;
using detail::bn_affine_value;
using detail::bn_load;
using detail::bn_narrow;
using detail::bn_relu_value;
using detail::BnLayout;

// ---- rows of the fused batch_norm + relu: float with AVX-512 (masked ragged end), else scalar ----
// The vector rows are written for AVX-512 only; other levels run the scalar rows.
constexpr bool kVectorRows = kSimdLevel == SimdLevel::avx512;

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
using simd::kFloatLanes;
using simd::lane_mask;

// The vector rows take x (and write its gradient) as float or bfloat16 (X), converted in the lanes.

// y = relu(fma(x, a, b)) over n values; NaN propagates as in relu.
template <typename X>
void bn_relu_row_vec(const X* x, float* y, int64_t n, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), z = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kFloatLanes) {
    const __mmask16 m = lane_mask(n - i);
    const __m512 v = _mm512_fmadd_ps(simd::load_first(x + i, n - i), va, vb);
    _mm512_mask_storeu_ps(y + i, m, _mm512_max_ps(z, v));  // max(z, NaN) = NaN
  }
}

// The relu mask of the lanes m: !(fma(x, a, b) <= 0), so a NaN passes its gradient (threshold_backward's rule).
inline __mmask16 relu_mask(__mmask16 m, __m512 xv, __m512 va, __m512 vb) {
  return _mm512_mask_cmp_ps_mask(m, _mm512_fmadd_ps(xv, va, vb), _mm512_setzero_ps(), _CMP_NLE_UQ);
}

// GCC 12 reports a false "used uninitialized" inside _mm512_reduce_add_ps (its own headers'
// undefined upper half) when this row is inlined into the bf16 backward; silenced for this row only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
template <typename X>
void bn_relu_sums_row_vec(const float* dy, const X* x, int64_t n, float a, float b, float mean,
                          double& s_dy, double& s_dy_xmu) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vm = _mm512_set1_ps(mean);
  const __m512 z = _mm512_setzero_ps();
  // Two chains each (named registers, no indexed array: GCC would keep one in memory), since
  // one chain of adds is latency-bound.
  __m512 s1a = z, s1b = z, s2a = z, s2b = z;
  auto step = [&](int64_t i, __mmask16 m, __m512& s1, __m512& s2) {
    const __m512 xv = simd::load_first(x + i, n - i);
    const __m512 d = _mm512_mask_blend_ps(relu_mask(m, xv, va, vb), z, _mm512_maskz_loadu_ps(m, dy + i));
    s1 = _mm512_add_ps(s1, d);
    s2 = _mm512_fmadd_ps(d, _mm512_sub_ps(xv, vm), s2);
  };
  int64_t i = 0;
  for (; i + 2 * kFloatLanes <= n; i += 2 * kFloatLanes) {
    step(i, 0xFFFF, s1a, s2a);
    step(i + kFloatLanes, 0xFFFF, s1b, s2b);
  }
  for (; i < n; i += kFloatLanes) step(i, lane_mask(n - i), s1a, s2a);
  s_dy += simd::hsum(_mm512_add_ps(s1a, s1b));
  s_dy_xmu += simd::hsum(_mm512_add_ps(s2a, s2b));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

template <typename X>
void bn_relu_grad_row_vec(const float* dy, const X* x, X* gx, int64_t n, float a, float b, float mean,
                          float grad_mean, float k, float scale) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vm = _mm512_set1_ps(mean);
  const __m512 vg = _mm512_set1_ps(grad_mean), vk = _mm512_set1_ps(k), vs = _mm512_set1_ps(scale);
  const __m512 z = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kFloatLanes) {
    const __mmask16 m = lane_mask(n - i);
    const __m512 xv = simd::load_first(x + i, n - i);
    const __m512 d = _mm512_mask_blend_ps(relu_mask(m, xv, va, vb), z, _mm512_maskz_loadu_ps(m, dy + i));
    const __m512 t = _mm512_sub_ps(_mm512_sub_ps(d, vg), _mm512_mul_ps(_mm512_sub_ps(xv, vm), vk));
    simd::store_first(gx + i, _mm512_mul_ps(t, vs), n - i);
  }
}
#endif

// The scalar rows read x stored as X (widened exactly) and store the gradient as X.

// y = relu(fma(x, a, b)) over n values; NaN propagates as in relu.
template <typename T, typename X>
void bn_relu_row(const X* x, T* y, int64_t n, T a, T b) {
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
  if constexpr (std::is_same_v<T, float>) return bn_relu_row_vec(x, y, n, a, b);
#endif
  for (int64_t i = 0; i < n; ++i) {
    y[i] = bn_relu_value(bn_affine_value(bn_load<T>(x[i]), a, b));
  }
}

// With d = (fma(x, a, b) <= 0 ? 0 : dy): s_dy += sum d, s_dy_xmu += sum d * (x - mean).
template <typename T, typename X>
void bn_relu_sums_row(const T* dy, const X* x, int64_t n, T a, T b, T mean, double& s_dy, double& s_dy_xmu) {
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
  if constexpr (std::is_same_v<T, float>) return bn_relu_sums_row_vec(dy, x, n, a, b, mean, s_dy, s_dy_xmu);
#endif
  T t1 = 0, t2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T xi = bn_load<T>(x[i]);
    const T d = bn_affine_value(xi, a, b) <= T(0) ? T(0) : dy[i];
    t1 += d;
    t2 += d * (xi - mean);
  }
  s_dy += t1;
  s_dy_xmu += t2;
}

// gx = (d - grad_mean - (x - mean) * k) * scale with d as above (training); gx = d * scale (eval: x
// takes no part, so a NaN x that passes its gradient gives dy * scale there, as PyTorch's eval
// backward; for finite x the training formula with grad_mean = k = 0 has the same bits).
template <typename T, typename X>
void bn_relu_grad_row(const T* dy, const X* x, X* gx, int64_t n, T a, T b, T mean, T grad_mean, T k, T scale,
                      bool eval = false) {
  if (eval) {
    for (int64_t i = 0; i < n; ++i) {
      gx[i] = bn_narrow<X>((bn_affine_value(bn_load<T>(x[i]), a, b) <= T(0) ? T(0) : dy[i]) * scale);
    }
    return;
  }
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
  if constexpr (std::is_same_v<T, float>) return bn_relu_grad_row_vec(dy, x, gx, n, a, b, mean, grad_mean, k, scale);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const T xi = bn_load<T>(x[i]);
    const T d = bn_affine_value(xi, a, b) <= T(0) ? T(0) : dy[i];
    gx[i] = bn_narrow<X>((d - grad_mean - (xi - mean) * k) * scale);
  }
}

using detail::ArrMap;
using detail::bn_out_row;
using detail::bn_row;
using detail::bn_store_row;
using detail::BnRowScratch;
using detail::CArrMap;

// Whether the relu rows read x (and write its gradient) in x's storage type X themselves: the float
// vector rows (and any X = T). Else a bfloat16 row is widened into a scratch first and its gradient
// rounded from one, so that the portable rows run on float rows only; so do the Eigen rows of the
// plain batch_norm and the statistics.
template <typename T, typename X>
constexpr bool kDirectRows = std::is_same_v<X, T> || (std::is_same_v<T, float> && kVectorRows);

// Row `off` of x as the relu rows take it: in place where kDirectRows, else widened into s.
template <typename T, typename X>
auto relu_row_x(const X* x, int64_t off, int64_t n, BnRowScratch<T>& s) {
  if constexpr (kDirectRows<T, X>) {
    return x + off;
  } else {
    return bn_row<T>(x, off, n, s);
  }
}
// Where the relu rows write row `off` of the input gradient: in place where kDirectRows, else in s
// (then bn_store_row).
template <typename T, typename X>
auto relu_row_gx(X* gx, int64_t off, BnRowScratch<T>& s) {
  if constexpr (kDirectRows<T, X>) {
    return gx + off;
  } else {
    return bn_out_row<T>(gx, off, s);
  }
}

template <typename T, typename X>
BatchNormForward forward_impl(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                              const Tensor& running_mean, const Tensor& running_var, bool training,
                              double momentum, double eps, bool relu) {
  const detail::BnForwardArgs<T, X> a(x_in, weight_in, bias_in, running_mean, running_var);
  const BnLayout& l = a.l;
  const X* xp = a.xp;
  BatchNormForward r;
  r.output = Tensor::empty(a.x.shape(), dtype_of<T>);
  r.save_mean = a.save_mean;
  r.save_invstd = a.save_invstd;
  T* yp = r.output.data<T>();
  if (relu) detail::count_simd_path(SimdKernel::bn_relu_forward, detail::simd_path<T>(kVectorRows));

  std::vector<detail::BnAffine<T>> affine(static_cast<size_t>(l.C));
  a.all_channels(training, momentum, eps, affine.data());
  detail::parallel_range(l.N, detail::bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    auto xs = BnRowScratch<T>::template of<X>(l.HW);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t c = 0; c < l.C; ++c) {
        const auto [alpha, beta] = affine[c];
        const int64_t off = (n * l.C + c) * l.HW;
        if (relu) {
          bn_relu_row<T>(relu_row_x<T>(xp, off, l.HW, xs), yp + off, l.HW, alpha, beta);
        } else {
          ArrMap<T>(yp + off, l.HW) = CArrMap<T>(bn_row<T>(xp, off, l.HW, xs), l.HW) * alpha + beta;
        }
      }
    }
  });
  return r;
}

// relu: the output was relu(batch_norm(x)); bias_in is the forward's bias (the mask needs it). x and
// the input gradient are stored as X.
template <typename T, typename X>
BatchNormGrads backward_impl(const Tensor& gy_in, const Tensor& x_in, const Tensor& weight_in,
                             const Tensor& save_mean_in, const Tensor& save_invstd_in, bool training,
                             bool need_input, bool need_weight, bool need_bias, bool relu = false,
                             const Tensor& bias_in = Tensor()) {
  BatchNormGrads g;
  if (relu) detail::count_simd_path(SimdKernel::bn_relu_backward, detail::simd_path<T>(kVectorRows));
  if (!need_input && !need_weight && !need_bias) return g;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous();
  const Tensor weight = detail::contiguous_if_defined(weight_in);
  const Tensor save_mean = save_mean_in.contiguous(), save_invstd = save_invstd_in.contiguous();
  const BnLayout l = detail::bn_layout_of(x);
  if (need_input) g.input = Tensor::empty(x.shape(), x.dtype());
  if (need_weight) g.weight = Tensor::empty({l.C}, dtype_of<T>);
  if (need_bias) g.bias = Tensor::empty({l.C}, dtype_of<T>);

  const T* gyp = gy.data<T>();
  const X* xp = detail::bn_data<X>(x);
  const T* wp = detail::data_or_null<T>(weight);
  const Tensor bias = relu ? detail::contiguous_if_defined(bias_in) : Tensor();
  const T* bp = detail::data_or_null<T>(bias);
  const T* mp = save_mean.data<T>();
  const T* ip = save_invstd.data<T>();
  X* gxp = need_input ? detail::bn_data<X>(g.input) : nullptr;
  T* gwp = need_weight ? g.weight.data<T>() : nullptr;
  T* gbp = need_bias ? g.bias.data<T>() : nullptr;
  const int64_t M = l.N * l.HW;
  // Training needs both sums for the input gradient; eval needs them only for
  // the weight and bias gradients.
  const bool need_sums = need_weight || need_bias || (need_input && training);

  const int64_t C = l.C, grain = detail::bn_image_grain(l);
  // The forward's affine maps, recomputed exactly as forward_impl did (relu mask).
  const std::vector<detail::BnAffine<T>> affine = detail::saved_affine_maps<T>(mp, ip, wp, bp, C);
  // Pass 1, image by image: each channel's sum dy and sum dy * (x - mean).
  std::vector<double> sums(static_cast<size_t>(2 * C), 0.0);
  if (need_sums) {
    sums = detail::channel_sums_by_images<T, X>(
        l, [&](int64_t n, int64_t c, BnRowScratch<T>& xs, double& s1, double& s2) {
          const int64_t off = (n * C + c) * l.HW;
          if (relu) {
            bn_relu_sums_row<T>(gyp + off, relu_row_x<T>(xp, off, l.HW, xs), l.HW, affine[c].alpha, affine[c].beta,
                                mp[c], s1, s2);
          } else {
            const CArrMap<T> dy(gyp + off, l.HW), xv(bn_row<T>(xp, off, l.HW, xs), l.HW);
            s1 += dy.sum();
            s2 += (dy * (xv - mp[c])).sum();
          }
        });
  }
  // The coefficients of gx = (d - grad_mean - (x - mean) * k) * scale (eval: grad_mean = k = 0).
  std::vector<detail::BnGradCoef<T>> coef(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    coef[c] = detail::bn_grad_coefficients<T>(sums[2 * c], sums[2 * c + 1], c, ip[c], wp, M, training, gwp, gbp);
  }
  if (!gxp) return g;
  // Pass 2, image by image: the input gradient's rows.
  detail::parallel_range(l.N, grain, [&](int64_t n0, int64_t n1) {
    auto xs = BnRowScratch<T>::template of<X>(l.HW), gs = BnRowScratch<T>::template of<X>(l.HW);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t off = (n * C + c) * l.HW;
        const T mean = mp[c], grad_mean = coef[c].grad_mean, k = coef[c].k, scale = coef[c].scale;
        if (relu) {
          const auto gr = relu_row_gx<T>(gxp, off, gs);
          bn_relu_grad_row<T>(gyp + off, relu_row_x<T>(xp, off, l.HW, xs), gr, l.HW, affine[c].alpha, affine[c].beta,
                              mean, grad_mean, k, scale, /*eval=*/!training);
          if constexpr (!kDirectRows<T, X>) bn_store_row<T>(gr, gxp, off, l.HW);
          continue;
        }
        T* gr = bn_out_row<T>(gxp, off, gs);
        if (training) {
          const CArrMap<T> dy(gyp + off, l.HW), xv(bn_row<T>(xp, off, l.HW, xs), l.HW);
          ArrMap<T>(gr, l.HW) = (dy - grad_mean - (xv - mean) * k) * scale;
        } else {
          ArrMap<T>(gr, l.HW) = CArrMap<T>(gyp + off, l.HW) * scale;
        }
        bn_store_row<T>(gr, gxp, off, l.HW);
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
  return detail::bn_dispatch(x.dtype(), "batch_norm_forward", [&](auto t, auto s) {
    return forward_impl<decltype(t), decltype(s)>(x, weight, bias, running_mean, running_var, training, momentum, eps,
                                     /*relu=*/false);
  });
}

BatchNormForward batch_norm_relu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& running_mean, const Tensor& running_var, bool training,
                                         double momentum, double eps) {
  detail::check_cpu("batch_norm_relu_forward", x);
  return detail::bn_dispatch(x.dtype(), "batch_norm_relu_forward", [&](auto t, auto s) {
    return forward_impl<decltype(t), decltype(s)>(x, weight, bias, running_mean, running_var, training, momentum, eps,
                                     /*relu=*/true);
  });
}

BatchNormGrads batch_norm_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                        const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd,
                                        bool training, bool need_input, bool need_weight, bool need_bias) {
  detail::check_cpu("batch_norm_relu_backward", x);
  return detail::bn_dispatch(x.dtype(), "batch_norm_relu_backward", [&](auto t, auto s) {
    return backward_impl<decltype(t), decltype(s)>(grad_out, x, weight, save_mean, save_invstd, training, need_input,
                                      need_weight, need_bias, /*relu=*/true, bias);
  });
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd, bool training,
                                   bool need_input, bool need_weight, bool need_bias) {
  detail::check_cpu("batch_norm_backward", x);
  return detail::bn_dispatch(x.dtype(), "batch_norm_backward", [&](auto t, auto s) {
    return backward_impl<decltype(t), decltype(s)>(grad_out, x, weight, save_mean, save_invstd, training, need_input,
                                      need_weight, need_bias);
  });
}

}  // namespace tandem::kernels::cpu
