// CPU kernels of the fused max_pool2d(relu(batch_norm(x)), 2) (kernels/batch_norm_pool.h) under
// tandem::kernels::cpu.
// Assumes: arguments validated by kernels/batch_norm.cpp (x 4-D with H, W >= 2; code and
// winner of the pooled shape, written by the forward); inputs may be non-contiguous (copied once).
// Guarantees:
// - forward, per channel: the statistics are kernels/cpu/batch_norm_stats.h's (as
//   batch_norm_relu_forward), then one pass over the channel's planes: each window value is
//   relu(fma(x, a, b)) computed with the same instructions as that kernel's rows, reduced with
//   max_pool2d's rule (first maximum in scan order, NaN wins): the pooled output is bitwise
//   max_pool2d(batch_norm_relu(x)). Written: the pooled output, the codes and the winning x values
//   (pooled size each); the full-size activations never exist.
// - backward, per channel, two passes: (1) over the pooled elements only (winner, dy): d = dy where
//   !(fma(x_win, a, b) <= 0) (relu'(0) = 0, a NaN passes dy, as batch_norm_relu_backward and
//   PyTorch's threshold_backward), else 0, kept in
//   a pooled-size scratch, with the sums of d and d * (x_win - mean); (2) over every x element:
//   gx = (d_here - grad_mean - (x - mean) * k) * scale, d_here being d at the winning position (the
//   code) and 0 elsewhere (also on the last row/column an odd H/W leaves out of pooling). Same
//   per-element formula as batch_norm_relu_backward; only the sums' order differs.
// - float rows use AVX-512 where compiled in, else AVX2+FMA where compiled in, one block each, on
//   kernels/cpu/simd.h's lane masks (masked loads and stores: nothing outside a row is read or
//   written); double and other builds use scalar rows with the same rules. The AVX2 relu is the
//   scalar one (x > 0 or NaN keeps x, else +0), so the AVX2 build's pooled output is bitwise its
//   unfused ops'. Each call is counted in simd_path_count with the level of the rows it ran.
// - threads split images, in every pass (the image-split convolutions before and after wrote and
//   will read those images on the same threads: at 2 threads, reading planes another core last wrote
//   had doubled the passes' time); the statistics and the backward sums are kept per (image,
//   channel) and added per channel in image order: bits do not depend on the thread count. The fused
//   conv before it (kernels/cpu/conv_bn_pool.h) runs these planes on conv images it computes itself.
// - x may be bfloat16 (weight, bias, running and saved statistics float32): the vector rows widen it
//   on load and round the input gradient to bfloat16 on store (simd::load_first / store_first), as
//   do the AVX-512 statistics; the others, and the portable rows, widen each row into a per-thread
//   scratch first (kernels/cpu/batch_norm_stats.h). Computed in float32 with the float
//   rows' instructions and order; the output and winner are float32: the same bits as casting x up,
//   the float32 kernels and casting the input gradient down.
#include "kernels/ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/batch_norm_stats.h"
#include "kernels/cpu/conv_bn_pool.h"
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

// x [N, C, H, W] pooled to [N, C, P, Q] with P = H / 2, Q = W / 2.
struct Geom {
  int64_t H, W, P, Q;
};

// Scalar window rule of max_pool2d: v replaces best when greater or NaN.
template <typename T>
inline void take_max(T v, uint8_t k, T& best, uint8_t& bk) {
  if (v > best || v != v) {
    best = v;
    bk = k;
  }
}

// The vector rows (float): AVX-512 and AVX2, one block each below; other levels run the scalar rows.
constexpr bool kVectorRows = kSimdLevel != SimdLevel::portable;

// Float lanes of the vector rows (1 where there are none).
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
constexpr int64_t kLanes = simd::kFloatLanes;
#else
constexpr int64_t kLanes = 1;
#endif

// A plane's share of its channel's backward sums, as masked_grad_plane writes it: the float vector
// rows' per-lane sums of d, then of d * (x_win - mean) (kLanes each); the scalar rows' two sums. Kept
// per (image, channel), so that images run on any thread and a channel still adds its planes in image
// order.
template <typename T>
constexpr int64_t kPlaneSums = std::is_same_v<T, float> && kVectorRows ? 2 * kLanes : 2;

// A channel's backward sums, sum d and sum d * (x_win - mean), in double: the scalar rows' planes add
// their partial sums, the float vector rows' planes their per-lane float sums into per-lane doubles
// (simd::WideSum), reduced once per channel.
template <typename T>
struct GradSums {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
  simd::WideSum dy_lanes, xmu_lanes;
#endif
  double dy = 0, xmu = 0;
  void add_plane(const T* p) {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
    if constexpr (std::is_same_v<T, float>) {
      dy_lanes.add(simd::load_first(p, kLanes));
      xmu_lanes.add(simd::load_first(p + kLanes, kLanes));
      return;
    }
#endif
    dy += p[0];
    xmu += p[1];
  }
  double sum_dy() const {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
    if constexpr (std::is_same_v<T, float>) return dy_lanes.total();
#endif
    return dy;
  }
  double sum_dy_xmu() const {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
    if constexpr (std::is_same_v<T, float>) return xmu_lanes.total();
#endif
    return xmu;
  }
};

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
using simd::kFloatLanes;
using simd::lane_mask;

// forward_plane's float rows, 16 pooled outputs per step; x float or bfloat16 (X).
template <typename X>
void forward_plane_vec(const X* x, const Geom& g, float a, float b, float* y, uint8_t* code, float* xw) {
  const int64_t Q = g.Q;
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), z = _mm512_setzero_ps();
  const __m512i even = simd::even_lanes(), odd = simd::odd_lanes();
  // relu(fma(x, a, b)) exactly as batch_norm_relu_forward's row: max(z, NaN) = NaN.
  auto act = [&](__m512 xv) { return _mm512_max_ps(z, _mm512_fmadd_ps(xv, va, vb)); };
  for (int64_t p = 0; p < g.P; ++p, y += Q, code += Q, xw += Q) {
    const X* r0 = x + 2 * p * g.W;
    const X* r1 = r0 + g.W;
    for (int64_t q0 = 0; q0 < Q; q0 += kFloatLanes) {
      // n pooled outputs from 2n values of each row; masked-off lanes load 0 and are not stored.
      const int64_t n = std::min<int64_t>(kFloatLanes, Q - q0), n2 = 2 * n;
      const __mmask16 m = lane_mask(n);
      const __m512 xa0 = simd::load_first(r0 + 2 * q0, n2), xa1 = simd::load_first(r0 + 2 * q0 + 16, n2 - 16);
      const __m512 xb0 = simd::load_first(r1 + 2 * q0, n2), xb1 = simd::load_first(r1 + 2 * q0 + 16, n2 - 16);
      const __m512 a0 = act(xa0), a1 = act(xa1), b0 = act(xb0), b1 = act(xb1);
      __m512 best = _mm512_permutex2var_ps(a0, even, a1), xbest = _mm512_permutex2var_ps(xa0, even, xa1);
      __m512i k = _mm512_setzero_si512();
      auto take = [&](__m512 v, __m512 xv, int32_t pos) {
        const __mmask16 t = simd::greater_or_nan(v, best);
        best = _mm512_mask_mov_ps(best, t, v);
        xbest = _mm512_mask_mov_ps(xbest, t, xv);
        k = _mm512_mask_mov_epi32(k, t, _mm512_set1_epi32(pos));
      };
      take(_mm512_permutex2var_ps(a0, odd, a1), _mm512_permutex2var_ps(xa0, odd, xa1), 1);
      take(_mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(xb0, even, xb1), 2);
      take(_mm512_permutex2var_ps(b0, odd, b1), _mm512_permutex2var_ps(xb0, odd, xb1), 3);
      _mm512_mask_storeu_ps(y + q0, m, best);
      _mm512_mask_storeu_ps(xw + q0, m, xbest);
      _mm512_mask_cvtepi32_storeu_epi8(code + q0, m, k);
    }
  }
}

// masked_grad_plane's float rows.
void masked_grad_plane_vec(const float* xw, const float* dy, int64_t n, float a, float b, float mean,
                           float* sums) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vm = _mm512_set1_ps(mean);
  const __m512 z = _mm512_setzero_ps();
  __m512 s1 = z, s2 = z;
  for (int64_t i = 0; i < n; i += kFloatLanes) {
    const __mmask16 m = lane_mask(n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, xw + i);
    // The relu mask as batch_norm_relu_backward computes it at that position.
    const __mmask16 pos = _mm512_mask_cmp_ps_mask(m, _mm512_fmadd_ps(xv, va, vb), z, _CMP_NLE_UQ);
    const __m512 dv = _mm512_maskz_loadu_ps(pos, dy + i);
    s1 = _mm512_add_ps(s1, dv);
    s2 = _mm512_fmadd_ps(dv, _mm512_sub_ps(xv, vm), s2);
  }
  _mm512_storeu_ps(sums, s1);
  _mm512_storeu_ps(sums + kFloatLanes, s2);
}

// input_grad_plane's float rows, 16 columns (8 pooled elements) per step; x and gx float or bfloat16 (X).
template <typename X>
void input_grad_plane_vec(const X* x, const float* xw, const float* dy, const uint8_t* code, const Geom& g, float a,
                          float b, float mean, float grad_mean, float k, float scale, X* gx) {
  const int64_t W = g.W, Q = g.Q;
  const __m512 vm = _mm512_set1_ps(mean), vg = _mm512_set1_ps(grad_mean), vk = _mm512_set1_ps(k);
  const __m512 vs = _mm512_set1_ps(scale), z = _mm512_setzero_ps();
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  // The window position of each lane in an even and an odd row: (h & 1, lane & 1).
  const __m512i here_even = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
  const __m512i here_odd = _mm512_add_epi32(here_even, _mm512_set1_epi32(2));
  auto row = [&](const X* xr, X* gr, __m512 dv, int64_t j0) {
    const __m512 xv = simd::load_first(xr + j0, W - j0);
    const __m512 t = _mm512_sub_ps(_mm512_sub_ps(dv, vg), _mm512_mul_ps(_mm512_sub_ps(xv, vm), vk));
    simd::store_first(gr + j0, _mm512_mul_ps(t, vs), W - j0);
  };
  for (int64_t p = 0; p < g.P; ++p, xw += Q, dy += Q, code += Q) {
    const X* x0 = x + 2 * p * W;
    X* g0 = gx + 2 * p * W;
    for (int64_t j0 = 0; j0 < W; j0 += kFloatLanes) {
      // Pooled elements under these lanes: columns j0 .. min(j0 + 16, 2Q) - 1 (j0 is even); lanes
      // past them get d = 0 (masked loads), so their code does not matter. d as pass 1 computed it.
      const int64_t np = std::min<int64_t>(8, std::max<int64_t>(0, Q - j0 / 2));
      const __mmask8 mp = __mmask8((1u << np) - 1);
      const __m256 xv = _mm256_maskz_loadu_ps(mp, xw + j0 / 2);
      const __mmask8 pos = _mm256_mask_cmp_ps_mask(mp, _mm256_fmadd_ps(xv, va, vb), _mm256_setzero_ps(), _CMP_NLE_UQ);
      const __m512 dp = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(pos, dy + j0 / 2)));
      const __m512i kp =
          _mm512_permutexvar_epi32(dup, _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mp, code + j0 / 2)));
      row(x0, g0, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(kp, here_even), dp), j0);
      row(x0 + W, g0 + W, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(kp, here_odd), dp), j0);
    }
  }
  for (int64_t h = 2 * g.P; h < g.H; ++h) {  // the row an odd H leaves out of pooling: d = 0
    for (int64_t j0 = 0; j0 < W; j0 += kFloatLanes) row(x + h * W, gx + h * W, z, j0);
  }
}

#elif TANDEM_SIMD == TANDEM_SIMD_AVX2
using simd::kFloatLanes;
using simd::load_first;
using simd::store_first;

// bn_relu_value(v) on 8 lanes: v where v > 0 or NaN, else +0.
inline __m256 relu8(__m256 v) { return _mm256_and_ps(v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLE_UQ)); }
// The low bytes of the first n of 8 int32 lanes (values 0..3) stored to out[0..n-1].
inline void store_codes8(uint8_t* out, __m256i k, int64_t n) {
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(k, k), _mm256_setzero_si256());
  const __m128i v = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  if (n == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), v);
  } else {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), v);
    for (int64_t i = 0; i < n; ++i) out[i] = tmp[i];
  }
}
// n (<= 4) codes as int32 lanes, each repeated twice: lanes 2i and 2i + 1 hold in[i]; the rest 0.
inline __m256i load_codes_dup(const uint8_t* in, int64_t n) {
  int32_t k4 = 0;
  if (n == 4) {
    std::memcpy(&k4, in, 4);
  } else {
    for (int64_t i = 0; i < n; ++i) k4 |= int32_t(in[i]) << (8 * i);
  }
  return _mm256_permutevar8x32_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128(k4)),
                                     _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

// forward_plane's float rows, 8 pooled outputs per step; the relu is the scalar rows' (relu8); x float
// or bfloat16 (X).
template <typename X>
void forward_plane_vec(const X* x, const Geom& g, float a, float b, float* y, uint8_t* code, float* xw) {
  const int64_t Q = g.Q;
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  auto act = [&](__m256 xv) { return relu8(_mm256_fmadd_ps(xv, va, vb)); };
  for (int64_t p = 0; p < g.P; ++p, y += Q, code += Q, xw += Q) {
    const X* r0 = x + 2 * p * g.W;
    const X* r1 = r0 + g.W;
    for (int64_t q0 = 0; q0 < Q; q0 += kFloatLanes) {
      // n pooled outputs from 2n values of each row; masked-off lanes load 0 and are not stored.
      const int64_t n = std::min<int64_t>(kFloatLanes, Q - q0);
      const __m256 xa0 = load_first(r0 + 2 * q0, 2 * n), xa1 = load_first(r0 + 2 * q0 + 8, 2 * n - 8);
      const __m256 xb0 = load_first(r1 + 2 * q0, 2 * n), xb1 = load_first(r1 + 2 * q0 + 8, 2 * n - 8);
      __m256 xbest = simd::deinterleave<false>(xa0, xa1), best = act(xbest);
      __m256i k = _mm256_setzero_si256();
      auto take = [&](__m256 xv, int32_t pos) {
        const __m256 v = act(xv);
        const __m256 t = simd::greater_or_nan(v, best);
        best = _mm256_blendv_ps(best, v, t);
        xbest = _mm256_blendv_ps(xbest, xv, t);
        k = _mm256_blendv_epi8(k, _mm256_set1_epi32(pos), _mm256_castps_si256(t));
      };
      take(simd::deinterleave<true>(xa0, xa1), 1);
      take(simd::deinterleave<false>(xb0, xb1), 2);
      take(simd::deinterleave<true>(xb0, xb1), 3);
      store_first(y + q0, best, n);
      store_first(xw + q0, xbest, n);
      store_codes8(code + q0, k, n);
    }
  }
}

// masked_grad_plane's float rows.
void masked_grad_plane_vec(const float* xw, const float* dy, int64_t n, float a, float b, float mean,
                           float* sums) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vm = _mm256_set1_ps(mean);
  const __m256 z = _mm256_setzero_ps();
  __m256 s1 = z, s2 = z;
  for (int64_t i = 0; i < n; i += kFloatLanes) {
    const __m256 xv = load_first(xw + i, n - i);
    // The relu mask as the scalar rows compute it: !(fma(x, a, b) <= 0); dy is 0 past the end.
    const __m256 pos = _mm256_cmp_ps(_mm256_fmadd_ps(xv, va, vb), z, _CMP_NLE_UQ);
    const __m256 dv = _mm256_and_ps(load_first(dy + i, n - i), pos);
    s1 = _mm256_add_ps(s1, dv);
    s2 = _mm256_fmadd_ps(dv, _mm256_sub_ps(xv, vm), s2);
  }
  _mm256_storeu_ps(sums, s1);
  _mm256_storeu_ps(sums + kFloatLanes, s2);
}

// input_grad_plane's float rows, 8 columns (4 pooled elements) per step; x and gx float or bfloat16 (X).
template <typename X>
void input_grad_plane_vec(const X* x, const float* xw, const float* dy, const uint8_t* code, const Geom& g, float a,
                          float b, float mean, float grad_mean, float k, float scale, X* gx) {
  const int64_t W = g.W, Q = g.Q;
  const __m256 vm = _mm256_set1_ps(mean), vg = _mm256_set1_ps(grad_mean), vk = _mm256_set1_ps(k);
  const __m256 vs = _mm256_set1_ps(scale);
  const __m128 va = _mm_set1_ps(a), vb = _mm_set1_ps(b);
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  // The window position of each lane in an even and an odd row: 2 * (h & 1) + (lane & 1).
  const __m256i here_even = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
  const __m256i here_odd = _mm256_add_epi32(here_even, _mm256_set1_epi32(2));
  auto row = [&](const X* xr, X* gr, __m256 dv, int64_t j0) {
    const __m256 xv = load_first(xr + j0, W - j0);
    const __m256 t = _mm256_sub_ps(_mm256_sub_ps(dv, vg), _mm256_mul_ps(_mm256_sub_ps(xv, vm), vk));
    store_first(gr + j0, _mm256_mul_ps(t, vs), W - j0);
  };
  for (int64_t p = 0; p < g.P; ++p, xw += Q, dy += Q, code += Q) {
    const X* x0 = x + 2 * p * W;
    X* g0 = gx + 2 * p * W;
    for (int64_t j0 = 0; j0 < W; j0 += kFloatLanes) {
      // Pooled elements under these lanes: columns j0 .. min(j0 + 8, 2Q) - 1 (j0 is even); lanes
      // past them get d = 0 (masked loads) and code 0, which never matters with d = 0. d as pass 1
      // computed it.
      const int64_t np = std::clamp<int64_t>(Q - j0 / 2, 0, 4);
      const __m128i m4 = _mm256_castsi256_si128(simd::lane_mask(np));
      const __m128 xw4 = np == 4 ? _mm_loadu_ps(xw + j0 / 2) : _mm_maskload_ps(xw + j0 / 2, m4);
      const __m128 dy4 = np == 4 ? _mm_loadu_ps(dy + j0 / 2) : _mm_maskload_ps(dy + j0 / 2, m4);
      const __m128 d4 = _mm_and_ps(dy4, _mm_cmp_ps(_mm_fmadd_ps(xw4, va, vb), _mm_setzero_ps(), _CMP_NLE_UQ));
      const __m256 dp = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d4), dup);
      const __m256i kp = load_codes_dup(code + j0 / 2, np);
      row(x0, g0, _mm256_and_ps(dp, _mm256_castsi256_ps(_mm256_cmpeq_epi32(kp, here_even))), j0);
      row(x0 + W, g0 + W, _mm256_and_ps(dp, _mm256_castsi256_ps(_mm256_cmpeq_epi32(kp, here_odd))), j0);
    }
  }
  for (int64_t h = 2 * g.P; h < g.H; ++h) {  // the row an odd H leaves out of pooling: d = 0
    for (int64_t j0 = 0; j0 < W; j0 += kFloatLanes) row(x + h * W, gx + h * W, _mm256_setzero_ps(), j0);
  }
}
#endif

// ---- forward: one plane x [H, W] (stored as X) -> y, code, xw (x at the winning position) [P, Q] ----
template <typename T, typename X>
void forward_plane(const X* x, const Geom& g, T a, T b, T* y, uint8_t* code, T* xw) {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
  if constexpr (std::is_same_v<T, float>) return forward_plane_vec(x, g, a, b, y, code, xw);
#endif
  const int64_t Q = g.Q;
  for (int64_t p = 0; p < g.P; ++p, y += Q, code += Q, xw += Q) {
    const X* r0 = x + 2 * p * g.W;
    const X* r1 = r0 + g.W;
    for (int64_t q = 0; q < Q; ++q) {
      const T win[4] = {bn_load<T>(r0[2 * q]), bn_load<T>(r0[2 * q + 1]), bn_load<T>(r1[2 * q]),
                        bn_load<T>(r1[2 * q + 1])};
      T best = bn_relu_value(bn_affine_value(win[0], a, b));
      uint8_t bk = 0;
      for (uint8_t i = 1; i < 4; ++i) take_max(bn_relu_value(bn_affine_value(win[i], a, b)), i, best, bk);
      y[q] = best;
      code[q] = bk;
      xw[q] = win[bk];
    }
  }
}

// ---- backward pass 1: one pooled plane of n values. d = dy where !(fma(xw, a, b) <= 0) (xw: x at the
// winning position), else 0; the plane's sums of d and d * (xw - mean) into sums (kPlaneSums<T> values). ----
template <typename T>
void masked_grad_plane(const T* xw, const T* dy, int64_t n, T a, T b, T mean, T* sums) {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
  if constexpr (std::is_same_v<T, float>) return masked_grad_plane_vec(xw, dy, n, a, b, mean, sums);
#endif
  T t1 = 0, t2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T dv = bn_affine_value(xw[i], a, b) <= T(0) ? T(0) : dy[i];
    t1 += dv;
    t2 += dv * (xw[i] - mean);
  }
  sums[0] = t1;
  sums[1] = t2;
}

// ---- backward pass 2: one plane. gx[h, w] = (d_here - grad_mean - (x - mean) * k) * scale with
// d_here = d[h / 2, w / 2] (pass 1's d, recomputed from xw and dy) where code[h / 2, w / 2] ==
// 2 * (h & 1) + (w & 1), h < 2P and w < 2Q; else 0. ----
// Eval (grad_mean = k = 0): gx = d_here * scale, x taking no part (a NaN x whose window it won gets
// dy * scale, as PyTorch's eval backward; finite x give the same bits either way).
template <typename T, typename X>
void input_grad_plane(const X* x, const T* xw, const T* dy, const uint8_t* code, const Geom& g, T a, T b, T mean,
                      T grad_mean, T k, T scale, X* gx, bool eval) {
#if TANDEM_SIMD != TANDEM_SIMD_PORTABLE
  if constexpr (std::is_same_v<T, float>) {
    if (!eval) return input_grad_plane_vec(x, xw, dy, code, g, a, b, mean, grad_mean, k, scale, gx);
  }
#endif
  const int64_t W = g.W, Q = g.Q;
  for (int64_t h = 0; h < g.H; ++h) {
    const bool pooled = h < 2 * g.P;
    for (int64_t w = 0; w < W; ++w) {
      const int64_t i = (h / 2) * Q + w / 2;
      T dv = T(0);
      if (pooled && w < 2 * Q && code[i] == 2 * (h & 1) + (w & 1)) {
        dv = bn_affine_value(xw[i], a, b) <= T(0) ? T(0) : dy[i];
      }
      gx[h * W + w] =
          bn_narrow<X>(eval ? dv * scale : (dv - grad_mean - (bn_load<T>(x[h * W + w]) - mean) * k) * scale);
    }
  }
}

using detail::BnRowScratch;

// Whether the plane rows read (and write) x's storage type X themselves: the float vector rows (and
// any X = T); else a bfloat16 plane is widened into a scratch first and its gradient rounded from one,
// so that the portable rows run on float planes only.
template <typename T, typename X>
constexpr bool kDirectRows = std::is_same_v<X, T> || (std::is_same_v<T, float> && kVectorRows);

template <typename T, typename X>
BatchNormReluPoolForward forward_impl(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                                      const Tensor& running_mean, const Tensor& running_var, bool training,
                                      double momentum, double eps) {
  const detail::BnForwardArgs<T, X> a(x_in, weight_in, bias_in, running_mean, running_var);
  const BnLayout& l = a.l;
  const X* xp = a.xp;
  const Tensor& x = a.x;
  const Geom g{x.size(2), x.size(3), x.size(2) / 2, x.size(3) / 2};
  BatchNormReluPoolForward r;
  r.output = Tensor::empty({l.N, l.C, g.P, g.Q}, dtype_of<T>);
  r.code = Tensor::empty({l.N, l.C, g.P, g.Q}, kUInt8);
  r.winner = Tensor::empty({l.N, l.C, g.P, g.Q}, dtype_of<T>);
  r.save_mean = a.save_mean;
  r.save_invstd = a.save_invstd;
  T* yp = r.output.data<T>();
  uint8_t* kp = r.code.data<uint8_t>();
  T* xwp = r.winner.data<T>();
  const int64_t PQ = g.P * g.Q;
  detail::count_simd_path(SimdKernel::bn_relu_pool_forward, detail::simd_path<T>(kVectorRows));

  std::vector<detail::BnAffine<T>> affine(static_cast<size_t>(l.C));
  a.all_channels(training, momentum, eps, affine.data());
  detail::parallel_range(l.N, detail::bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    auto xs = BnRowScratch<T>::template of<X>(l.HW);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t c = 0; c < l.C; ++c) {
        const auto [alpha, beta] = affine[c];
        const int64_t o = (n * l.C + c) * PQ, off = (n * l.C + c) * l.HW;
        if constexpr (kDirectRows<T, X>) {
          forward_plane<T>(xp + off, g, alpha, beta, yp + o, kp + o, xwp + o);
        } else {
          forward_plane<T>(detail::bn_row<T>(xp, off, l.HW, xs), g, alpha, beta, yp + o, kp + o, xwp + o);
        }
      }
    }
  });
  return r;
}

// Backward pass 1 over the pooled planes of l.N images (pooled plane size PQ): each plane's sums of d
// and d * (x_win - mean), added per channel in image order; the weight and bias gradients (into gw / gb
// where non-null) and each channel's coefficients of pass 2.
template <typename T>
std::vector<detail::BnGradCoef<T>> pooled_grad_coefficients(const T* gyp, const T* xwp, const BnLayout& l, int64_t PQ,
                                                            const std::vector<detail::BnAffine<T>>& affine,
                                                            const T* mp, const T* ip, const T* wp, bool training,
                                                            T* gwp, T* gbp) {
  const int64_t C = l.C;
  Tensor plane_sums = Tensor::empty({l.N * C * kPlaneSums<T>}, dtype_of<T>);
  T* sp = plane_sums.data<T>();
  detail::parallel_range(l.N, detail::bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t o = (n * C + c) * PQ;
        masked_grad_plane<T>(xwp + o, gyp + o, PQ, affine[c].alpha, affine[c].beta, mp[c],
                             sp + (n * C + c) * kPlaneSums<T>);
      }
    }
  });
  std::vector<detail::BnGradCoef<T>> coef(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    GradSums<T> sums;
    for (int64_t n = 0; n < l.N; ++n) sums.add_plane(sp + (n * C + c) * kPlaneSums<T>);
    coef[c] = detail::bn_grad_coefficients<T>(sums.sum_dy(), sums.sum_dy_xmu(), c, ip[c], wp, l.N * l.HW, training,
                                              gwp, gbp);
  }
  return coef;
}

// x and the input gradient are stored as X.
template <typename T, typename X>
BatchNormGrads backward_impl(const Tensor& gy_in, const Tensor& x_in, const Tensor& code_in,
                             const Tensor& winner_in, const Tensor& weight_in, const Tensor& bias_in,
                             const Tensor& save_mean_in, const Tensor& save_invstd_in, bool training,
                             bool need_input, bool need_weight, bool need_bias) {
  BatchNormGrads r;
  detail::count_simd_path(SimdKernel::bn_relu_pool_backward, detail::simd_path<T>(kVectorRows));
  if (!need_input && !need_weight && !need_bias) return r;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), code = code_in.contiguous();
  const Tensor winner = winner_in.contiguous();
  const Tensor weight = detail::contiguous_if_defined(weight_in);
  const Tensor bias = detail::contiguous_if_defined(bias_in);
  const Tensor save_mean = save_mean_in.contiguous(), save_invstd = save_invstd_in.contiguous();
  const BnLayout l = detail::bn_layout_of(x);
  const Geom g{x.size(2), x.size(3), x.size(2) / 2, x.size(3) / 2};
  if (need_input) r.input = Tensor::empty(x.shape(), x.dtype());
  if (need_weight) r.weight = Tensor::empty({l.C}, dtype_of<T>);
  if (need_bias) r.bias = Tensor::empty({l.C}, dtype_of<T>);
  const T* gyp = gy.data<T>();
  const X* xp = detail::bn_data<X>(x);
  const uint8_t* kp = code.data<uint8_t>();
  const T* xwp = winner.data<T>();
  const T* wp = detail::data_or_null<T>(weight);
  const T* bp = detail::data_or_null<T>(bias);
  const T* mp = save_mean.data<T>();
  const T* ip = save_invstd.data<T>();
  X* gxp = need_input ? detail::bn_data<X>(r.input) : nullptr;
  T* gwp = need_weight ? r.weight.data<T>() : nullptr;
  T* gbp = need_bias ? r.bias.data<T>() : nullptr;
  const int64_t PQ = g.P * g.Q, C = l.C;
  // Both passes run image by image (as the image-split convolutions around them read and write), each
  // plane a fixed function of its channel's values: the bits do not depend on the thread count.
  // The forward's affine maps (the relu mask), recomputed exactly as the forward did.
  const std::vector<detail::BnAffine<T>> affine = detail::saved_affine_maps<T>(mp, ip, wp, bp, C);
  const std::vector<detail::BnGradCoef<T>> coef =
      pooled_grad_coefficients<T>(gyp, xwp, l, PQ, affine, mp, ip, wp, training, gwp, gbp);
  if (!gxp) return r;
  detail::parallel_range(l.N, detail::bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    // The portable rows' widened planes of a bfloat16 x and its gradient.
    auto xs = BnRowScratch<T>::template of<X>(kDirectRows<T, X> ? 0 : l.HW);
    auto gs = BnRowScratch<T>::template of<X>(kDirectRows<T, X> ? 0 : l.HW);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t off = (n * C + c) * l.HW, o = (n * C + c) * PQ;
        const detail::BnGradCoef<T>& f = coef[c];
        const auto [alpha, beta] = affine[c];
        if constexpr (kDirectRows<T, X>) {
          input_grad_plane<T>(xp + off, xwp + o, gyp + o, kp + o, g, alpha, beta, mp[c], f.grad_mean, f.k, f.scale,
                              gxp + off, !training);
        } else {
          T* gr = detail::bn_out_row<T>(gxp, off, gs);
          input_grad_plane<T>(detail::bn_row<T>(xp, off, l.HW, xs), xwp + o, gyp + o, kp + o, g, alpha, beta, mp[c],
                              f.grad_mean, f.k, f.scale, gr, !training);
          detail::bn_store_row<T>(gr, gxp, off, l.HW);
        }
      }
    }
  });
  return r;
}

}  // namespace

namespace detail {
void bn_pool_forward_plane(const float* x, int64_t H, int64_t W, float a, float b, float* y, uint8_t* code,
                           float* xw) {
  forward_plane<float>(x, Geom{H, W, H / 2, W / 2}, a, b, y, code, xw);
}
std::vector<BnGradCoef<float>> bn_pool_grad_coefficients(const float* gy, const float* winner, const BnLayout& l,
                                                         int64_t PQ, const std::vector<BnAffine<float>>& affine,
                                                         const float* mean, const float* invstd, const float* w,
                                                         bool training, float* gw, float* gb) {
  return pooled_grad_coefficients<float>(gy, winner, l, PQ, affine, mean, invstd, w, training, gw, gb);
}
void bn_pool_input_grad_plane(const float* x, const float* xw, const float* dy, const uint8_t* code, int64_t H,
                              int64_t W, const BnAffine<float>& affine, float mean, const BnGradCoef<float>& f,
                              float* gx, bool eval) {
  input_grad_plane<float>(x, xw, dy, code, Geom{H, W, H / 2, W / 2}, affine.alpha, affine.beta, mean, f.grad_mean,
                          f.k, f.scale, gx, eval);
}
}  // namespace detail

BatchNormReluPoolForward batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& weight,
                                                            const Tensor& bias, const Tensor& running_mean,
                                                            const Tensor& running_var, bool training,
                                                            double momentum, double eps) {
  detail::check_cpu("batch_norm_relu_max_pool2d_forward", x);
  return detail::bn_dispatch(x.dtype(), "batch_norm_relu_max_pool2d_forward", [&](auto t, auto s) {
    return forward_impl<decltype(t), decltype(s)>(x, weight, bias, running_mean, running_var, training, momentum, eps);
  });
}

BatchNormGrads batch_norm_relu_max_pool2d_backward(const Tensor& grad_out, const Tensor& x,
                                                   const Tensor& code, const Tensor& winner,
                                                   const Tensor& weight, const Tensor& bias,
                                                   const Tensor& save_mean, const Tensor& save_invstd,
                                                   bool training, bool need_input, bool need_weight,
                                                   bool need_bias) {
  detail::check_cpu("batch_norm_relu_max_pool2d_backward", x);
  return detail::bn_dispatch(x.dtype(), "batch_norm_relu_max_pool2d_backward", [&](auto t, auto s) {
    return backward_impl<decltype(t), decltype(s)>(grad_out, x, code, winner, weight, bias, save_mean, save_invstd,
                                      training, need_input, need_weight, need_bias);
  });
}

}  // namespace tandem::kernels::cpu
