// Internal to the CPU batch_norm kernels (kernels/cpu/batch_norm.cpp and the fused
// batch_norm+relu+max_pool of kernels/cpu/batch_norm_pool.cpp); not part of the public API.
// Owns: the [N, C, HW] view of an input, the chunking by images, the per-channel statistics
// (training: batch mean and biased-variance invstd, running stats updated with momentum and the
// unbiased variance, as PyTorch; eval: the running ones) and the per-channel affine map
// y = fma(x, alpha, beta) with its relu, written once so that every fused kernel produces the
// same bits as batch_norm_relu_forward; the forwards' common set-up (BnForwardArgs).
// x may be stored in bfloat16 (X = uint16_t, its bits) and computed in float (T): the AVX-512
// statistics widen it in the lanes (row_moments, the same function for float rows); elsewhere its rows
// are widened into a row scratch (BnRowScratch) and the input gradient's rows computed there and rounded on
// store, so that every row function runs on float rows exactly as on a float32 tensor: the same bits
// as casting x up, running the float kernel and casting the input gradient down.
// Assumes: x contiguous; running_mean/running_var contiguous [C] of the compute type T when given.
// Guarantees: BnForwardArgs::all_channels takes each row's moments on whichever thread has its
// image and adds them per channel in image order: its results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

struct BnLayout {
  int64_t N, C, HW;
};

inline BnLayout bn_layout_of(const Tensor& x) {
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t HW = N * C == 0 ? 0 : x.numel() / (N * C);
  return {N, C, HW};
}

// The per-channel affine map y = x * alpha + beta of the forward; explicit fma so that forward and
// the fused backward get the same bits whatever the compiler contracts.
template <typename T>
struct BnAffine {
  T alpha, beta;
};
template <typename T>
BnAffine<T> bn_affine_of(T invstd, const T* wp, const T* bp, int64_t c, T mean) {
  const T alpha = wp ? invstd * wp[c] : invstd;
  return {alpha, std::fma(-mean, alpha, bp ? bp[c] : T(0))};
}

// x * a + b rounded once where the CPU has FMA (as the AVX-512 rows do), else twice (std::fma
// would be a slow library call); the same function in forward and backward either way.
template <typename T>
inline T bn_affine_value(T x, T a, T b) {
  if constexpr (simd::kFma) {
    return std::fma(x, a, b);
  } else {
    return x * a + b;
  }
}

// relu as the scalar rows apply it: NaN propagates.
template <typename T>
inline T bn_relu_value(T v) {
  return v > T(0) || v != v ? v : T(0);
}

// ---- x stored in another type (X) than the one computed in (T): bf16 bits (uint16_t) read as float ----

// Runs fn(T{}, X{}) for x's dtype: float32 or float64 (X = T), or bfloat16 (X = uint16_t, T = float).
template <typename Fn>
decltype(auto) bn_dispatch(DType dtype, const char* op, Fn&& fn) {
  if (dtype == kBFloat16) return fn(float{}, uint16_t{});
  return dispatch_float(dtype, op, [&](auto t) { return fn(t, t); });
}

// x's elements in storage type X (checked by the caller: bf16 bits when X is uint16_t).
template <typename X>
const X* bn_data(const Tensor& t) {
  return static_cast<const X*>(t.raw_data());
}
template <typename X>
X* bn_data(Tensor& t) {
  return static_cast<X*>(t.raw_data());
}

// One stored value read as T.
template <typename T, typename X>
inline T bn_load(X v) {
  if constexpr (std::is_same_v<X, uint16_t>) {
    return bf16_bits_to_f32(v);
  } else {
    return v;
  }
}

// One value of T stored as G (bfloat16 bits: rounded as f32_to_bf16_bits).
template <typename G, typename T>
inline G bn_narrow(T v) {
  if constexpr (std::is_same_v<G, uint16_t>) {
    return f32_to_bf16_bits(v);
  } else {
    return v;
  }
}

// A row of float values standing in for a row of a bf16 tensor (widened x, or an input gradient
// before rounding). at(off) places element offset `off` of a tensor at the address a float32 tensor
// (64-byte aligned) would give it, modulo 64 bytes, so that the row functions (Eigen's included,
// whose vector loops may start at the first aligned element) take the same path and give the same
// bits as on the float32 tensor. Holds nothing when X is T (rows are read in place).
template <typename T>
class BnRowScratch {
 public:
  template <typename X>
  static BnRowScratch of(int64_t n) {
    return BnRowScratch(std::is_same_v<X, T> ? 0 : n);
  }
  T* at(int64_t off) {
    const auto base = (reinterpret_cast<uintptr_t>(buf_.data()) + 63) & ~uintptr_t(63);
    return reinterpret_cast<T*>(base) + off % kPerLine;
  }

 private:
  static constexpr int64_t kPerLine = 64 / int64_t(sizeof(T));
  explicit BnRowScratch(int64_t n) : buf_(n > 0 ? size_t(n + 2 * kPerLine) : 0) {}
  std::vector<T> buf_;
};

// Row `off` (n values) of x as T: x's own memory when X is T, else widened into s.
template <typename T, typename X>
const T* bn_row(const X* x, int64_t off, int64_t n, BnRowScratch<T>& s) {
  if constexpr (std::is_same_v<X, T>) {
    return x + off;
  } else {
    T* p = s.at(off);
    const X* r = x + off;
    for (int64_t i = 0; i < n; ++i) p[i] = bn_load<T>(r[i]);
    return p;
  }
}

// Where row `off` of an output stored as G is computed: in place when G is T, else in s, from where
// bn_store_row rounds it into the output.
template <typename T, typename G>
T* bn_out_row(G* y, int64_t off, BnRowScratch<T>& s) {
  if constexpr (std::is_same_v<G, T>) {
    return y + off;
  } else {
    return s.at(off);
  }
}
template <typename T, typename G>
void bn_store_row(const T* row, G* y, int64_t off, int64_t n) {
  if constexpr (!std::is_same_v<G, T>) {
    G* o = y + off;
    for (int64_t i = 0; i < n; ++i) o[i] = bn_narrow<G>(row[i]);
  }
}

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// The sums of (x - shift) and (x - shift)^2 over one row of n values of X (float, or bf16 widened in
// the lanes) in two pairs of 16 float lanes, reduced once into s1 and s2: one read of the row, and
// the same bits for a bf16 row as for the float32 row it widens to.
template <typename X>
inline void row_moments(const X* r, int64_t n, float shift, double& s1, double& s2) {
  const __m512 vs = _mm512_set1_ps(shift);
  __m512 a1 = _mm512_setzero_ps(), a2 = a1, b1 = a1, b2 = a1;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 u = _mm512_sub_ps(simd::load_first(r + i, 16), vs);
    const __m512 v = _mm512_sub_ps(simd::load_first(r + i + 16, 16), vs);
    a1 = _mm512_add_ps(a1, u);
    a2 = _mm512_fmadd_ps(u, u, a2);
    b1 = _mm512_add_ps(b1, v);
    b2 = _mm512_fmadd_ps(v, v, b2);
  }
  for (; i < n; i += 16) {  // the lanes past the row add 0
    const __m512 u = _mm512_maskz_sub_ps(simd::lane_mask(n - i), simd::load_first(r + i, n - i), vs);
    a1 = _mm512_add_ps(a1, u);
    a2 = _mm512_fmadd_ps(u, u, a2);
  }
  s1 += double(simd::hsum(_mm512_add_ps(a1, b1)));
  s2 += double(simd::hsum(_mm512_add_ps(a2, b2)));
}
#endif

template <typename T>
struct BnChannelStats {
  T mean, invstd;
};

// Row n of channel c of x [N, C, HW] (xp): its sums of (x - shift) and (x - shift)^2 added into s1, s2
// (one read at AVX-512, row_moments; Eigen's two sums of the widened row elsewhere).
template <typename T, typename X>
void add_row_moments(const X* xp, const BnLayout& l, int64_t n, int64_t c, T shift, BnRowScratch<T>& xs,
                     double& s1, double& s2) {
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    row_moments(xp + (n * l.C + c) * l.HW, l.HW, shift, s1, s2);
    return;
  }
#endif
  const CArrMap<T> row(bn_row<T>(xp, (n * l.C + c) * l.HW, l.HW, xs), l.HW);  // L1-resident: read twice
  s1 += (row - shift).sum();
  s2 += (row - shift).square().sum();
}

// The shift of channel c's moments: its first value, so that the sum of squares does not cancel
// catastrophically.
template <typename T, typename X>
T channel_shift(const X* xp, const BnLayout& l, int64_t c) {
  return l.N * l.HW > 0 ? bn_load<T>(xp[c * l.HW]) : T(0);
}

// Training statistics of channel c from its shifted sums s1, s2 over M values: batch mean and
// 1/sqrt(biased var + eps); when rm and rv are both non-null, rm[c]/rv[c] are updated with momentum
// (unbiased variance).
template <typename T>
BnChannelStats<T> finish_statistics(double s1, double s2, T shift, int64_t M, int64_t c, double momentum,
                                    double eps, T* rm, T* rv) {
  const double m = M > 0 ? s1 / double(M) : 0.0;
  const double var_sum = std::max(0.0, s2 - s1 * m);  // sum of (x - mean)^2
  const double mean_d = double(shift) + m;
  const double var = M > 0 ? var_sum / double(M) : 0.0;
  if (rm && rv) {
    const double unbiased = M > 1 ? var_sum / double(M - 1) : var;
    rm[c] = T(momentum * mean_d + (1.0 - momentum) * double(rm[c]));
    rv[c] = T(momentum * unbiased + (1.0 - momentum) * double(rv[c]));
  }
  return {T(mean_d), T(1.0 / std::sqrt(var + eps))};
}

// Eval statistics of channel c: the running mean and 1/sqrt(running var + eps).
template <typename T>
BnChannelStats<T> eval_statistics(const T* rm, const T* rv, int64_t c, double eps) {
  return {rm[c], T(1.0 / std::sqrt(double(rv[c]) + eps))};
}

// The input gradient's coefficients of one channel, gx = (d - grad_mean - (x - mean) * k) * scale.
template <typename T>
struct BnGradCoef {
  T grad_mean, k, scale;
};

// From channel c's sums of d and d * (x - mean) over its M values: the weight and bias gradients
// (into gw[c] / gb[c] where non-null) and the input gradient's coefficients (eval: grad_mean = k = 0,
// gx = d * scale).
template <typename T>
BnGradCoef<T> bn_grad_coefficients(double sum_dy, double sum_dy_xmu, int64_t c, T invstd, const T* wp, int64_t M,
                                   bool training, T* gw, T* gb) {
  if (gw) gw[c] = T(sum_dy_xmu * double(invstd));
  if (gb) gb[c] = T(sum_dy);
  const bool batch = training && M > 0;
  return {batch ? T(sum_dy / double(M)) : T(0), batch ? T(sum_dy_xmu / double(M)) * invstd * invstd : T(0),
          invstd * (wp ? wp[c] : T(1))};
}

// Images per parallel chunk: aim for >= 32K elements of work per chunk.
inline int64_t bn_image_grain(const BnLayout& l) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, l.C * l.HW));
}

// Two sums per channel, taken row by row: row(n, c, xs, s1, s2) adds row (n, c)'s two sums into s1, s2
// (which start at 0), the images split over the pool (xs: the thread's row scratch of a bf16 x); the rows'
// sums are kept per (image, channel) and added per channel in image order, so the result does not depend
// on the thread count. Returns [C][2] in double.
template <typename T, typename X, typename Row>
std::vector<double> channel_sums_by_images(const BnLayout& l, Row&& row) {
  Tensor rows = Tensor::empty({2 * l.N * l.C}, kFloat64);
  double* rp = rows.data<double>();
  parallel_range(l.N, bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    auto xs = BnRowScratch<T>::template of<X>(l.HW);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t c = 0; c < l.C; ++c) {
        double s1 = 0, s2 = 0;
        row(n, c, xs, s1, s2);
        rp[2 * (n * l.C + c)] = s1;
        rp[2 * (n * l.C + c) + 1] = s2;
      }
    }
  });
  std::vector<double> sums(static_cast<size_t>(2 * l.C), 0.0);
  for (int64_t c = 0; c < l.C; ++c) {
    for (int64_t n = 0; n < l.N; ++n) {
      sums[2 * c] += rp[2 * (n * l.C + c)];
      sums[2 * c + 1] += rp[2 * (n * l.C + c) + 1];
    }
  }
  return sums;
}

// The forward's affine maps of all C channels from its saved statistics (mp, ip), exactly as it applied them.
template <typename T>
std::vector<BnAffine<T>> saved_affine_maps(const T* mp, const T* ip, const T* wp, const T* bp, int64_t C) {
  std::vector<BnAffine<T>> affine(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) affine[c] = bn_affine_of<T>(ip[c], wp, bp, c, mp[c]);
  return affine;
}

// An optional input (weight, bias): contiguous when given, else undefined; its elements, or nullptr.
inline Tensor contiguous_if_defined(const Tensor& t) { return t.defined() ? t.contiguous() : Tensor(); }
template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// What every CPU batch-norm forward (plain, +relu, +relu+pool) sets up: x, weight and bias made
// contiguous, the saved mean and invstd [C] (of T) it fills, and the running statistics, updated in
// place in the caller's buffers (through handles) when given. x is stored as X.
template <typename T, typename X = T>
struct BnForwardArgs {
  Tensor x, weight, bias, save_mean, save_invstd, running_mean, running_var;
  BnLayout l;
  const X* xp;
  const T *wp, *bp;
  T *mp, *ip, *rmp, *rvp;

  BnForwardArgs(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Tensor& rm,
                const Tensor& rv)
      : x(x_in.contiguous()),
        weight(contiguous_if_defined(weight_in)),
        bias(contiguous_if_defined(bias_in)),
        running_mean(rm),
        running_var(rv),
        l(bn_layout_of(x)) {
    save_mean = Tensor::empty({l.C}, dtype_of<T>);
    save_invstd = Tensor::empty({l.C}, dtype_of<T>);
    xp = bn_data<X>(x);
    wp = data_or_null<T>(weight);
    bp = data_or_null<T>(bias);
    mp = save_mean.data<T>();
    ip = save_invstd.data<T>();
    rmp = running_mean.defined() ? running_mean.data<T>() : nullptr;
    rvp = running_var.defined() ? running_var.data<T>() : nullptr;
  }

  // Every channel's statistics (saved; the running ones updated in training, read in eval) and the
  // affine map its output applies, into out [C]. Training: the rows' moments taken image by image over
  // the pool (a thread reads the images it is given, as an image-split convolution before it wrote
  // them), kept per (image, channel), then added per channel in image order.
  void all_channels(bool training, double momentum, double eps, BnAffine<T>* out) const {
    std::vector<T> shift(static_cast<size_t>(l.C));
    std::vector<double> sums;
    if (training) {
      for (int64_t c = 0; c < l.C; ++c) shift[c] = channel_shift<T>(xp, l, c);
      sums = channel_sums_by_images<T, X>(l, [&](int64_t n, int64_t c, BnRowScratch<T>& xs, double& s1, double& s2) {
        add_row_moments<T>(xp, l, n, c, shift[c], xs, s1, s2);
      });
    }
    for (int64_t c = 0; c < l.C; ++c) {
      const int64_t M = l.N * l.HW;
      const BnChannelStats<T> st = training
                                       ? finish_statistics<T>(sums[2 * c], sums[2 * c + 1], shift[c], M, c, momentum,
                                                              eps, rmp, rvp)
                                       : eval_statistics<T>(rmp, rvp, c, eps);
      mp[c] = st.mean;
      ip[c] = st.invstd;
      out[c] = bn_affine_of<T>(st.invstd, wp, bp, c, st.mean);
    }
  }
};

}  // namespace tandem::kernels::cpu::detail
