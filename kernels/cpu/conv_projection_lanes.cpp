// The 1x1 stride-2 projections with channels in the vector lanes (kernels/cpu/conv_projection_lanes.h).
// Transposes in registers: the forward's one vector of output channels over 16 positions takes
// simd::transpose16; over 8 positions (the forward's two vectors, every input gradient) three stages of
// eight two-source permutes a vector of channels (PairTranspose, conv_strided_layout.h), after which vector i
// holds channel 2 i in lanes 0-7 and channel 2 i + 1 in lanes 8-15.
#include "kernels/cpu/conv_projection_lanes.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/conv_strided_layout.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

namespace {

// KV vectors of output channels; up to 16 / KV positions of one output row (Q of them real).
template <int KV>
void forward_image(const float* xn, const float* wt, const float* bias, float* yn, const StridedConvShape& g) {
  constexpr int NQ = 16 / KV;
  constexpr int64_t KP = 16 * KV;  // the packed weights' and biases' pitch
  const int64_t C = g.C, HW = g.H * g.W, W = g.W, K = g.K, P = g.P, Q = g.Q, L = P * Q;
  const __mmask16 row = simd::lane_mask(Q);
  const PairTranspose to_pairs(PairTranspose::kFromChannels);
  for (int64_t p = 0; p < P; ++p) {
    __m512 acc[NQ][KV];
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 2
      for (int v = 0; v < KV; ++v) acc[q][v] = _mm512_loadu_ps(bias + 16 * v);
    }
    const float* src = xn + 2 * p * W;  // row 2 p of channel 0
    for (int64_t c = 0; c < C; ++c) {
      __m512 wv[KV];
#pragma GCC unroll 2
      for (int v = 0; v < KV; ++v) wv[v] = _mm512_loadu_ps(wt + c * KP + 16 * v);
      const float* r = src + c * HW;
#pragma GCC unroll 16
      for (int q = 0; q < NQ; ++q) {
        if (q >= Q) break;
        const __m512 xb = _mm512_set1_ps(r[2 * q]);
#pragma GCC unroll 2
        for (int v = 0; v < KV; ++v) acc[q][v] = _mm512_fmadd_ps(xb, wv[v], acc[q][v]);
      }
    }
    float* out = yn + p * Q;
    if constexpr (KV == 1) {
      __m512 t[16];
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) t[q] = acc[q][0];
      simd::transpose16(t);
      for (int64_t k = 0; k < K; ++k) _mm512_mask_storeu_ps(out + k * L, row, t[k]);
    } else {
#pragma GCC unroll 2
      for (int v = 0; v < KV; ++v) {
        __m512 u[8];
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) u[q] = acc[q][v];
        to_pairs(u);
        for (int i = 0; i < 8; ++i) {
          const int64_t k = 16 * v + 2 * i;
          if (k < K) _mm512_mask_storeu_ps(out + k * L, row, u[i]);
          if (k + 1 < K) {
            // Lanes 8 .. 8 + Q - 1 to the row of k + 1: its address less 8 floats (formed in integers; the
            // lanes below 8 are masked off and not written).
            const auto at = reinterpret_cast<uintptr_t>(out + (k + 1) * L) - 8 * sizeof(float);
            _mm512_mask_storeu_ps(reinterpret_cast<float*>(at), __mmask16(row << 8), u[i]);
          }
        }
      }
    }
  }
}

// The input gradient of one image: CV vectors of input channels over up to 8 positions of an output row
// (maps at most 16 wide). Each channel's row of values goes to the even columns of image row 2 p by one
// zero-masking permute (expand[h], keep[h]: from the half h of a two-channel vector); kAdd adds them there
// in place (nothing else read or written), else the odd columns and the odd row get zeros.
template <int CV, bool kAdd>
void input_grad_image(const float* gyn, const float* wp, float* gxn, const StridedConvShape& g,
                      const __m512i* expand, const __mmask16* keep) {
  constexpr int64_t CP = 16 * CV;
  const int64_t C = g.C, H = g.H, W = g.W, HW = H * W, K = g.K, P = g.P, Q = g.Q, L = P * Q;
  const __mmask16 cols = simd::lane_mask(W);
  const PairTranspose to_pairs(PairTranspose::kFromChannels);
  const auto put = [&](float* row, __m512 v, int h) {
    const __m512 e = _mm512_maskz_permutexvar_ps(keep[h], expand[h], v);
    if constexpr (kAdd) {
      _mm512_mask_storeu_ps(row, keep[h], _mm512_add_ps(_mm512_maskz_loadu_ps(keep[h], row), e));
    } else {
      _mm512_mask_storeu_ps(row, cols, e);
    }
  };
  for (int64_t p = 0; p < P; ++p) {
    __m512 acc[8][CV];
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
#pragma GCC unroll 2
      for (int v = 0; v < CV; ++v) acc[q][v] = _mm512_setzero_ps();
    }
    const float* src = gyn + p * Q;
    for (int64_t k = 0; k < K; ++k) {
      __m512 wv[CV];
#pragma GCC unroll 2
      for (int v = 0; v < CV; ++v) wv[v] = _mm512_loadu_ps(wp + k * CP + 16 * v);
      const float* r = src + k * L;
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) {
        if (q >= Q) break;
        const __m512 gb = _mm512_set1_ps(r[q]);
#pragma GCC unroll 2
        for (int v = 0; v < CV; ++v) acc[q][v] = _mm512_fmadd_ps(gb, wv[v], acc[q][v]);
      }
    }
    float* out = gxn + 2 * p * W;
#pragma GCC unroll 2
    for (int v = 0; v < CV; ++v) {
      __m512 u[8];
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) u[q] = acc[q][v];
      to_pairs(u);
      for (int i = 0; i < 8; ++i) {
        const int64_t c = 16 * v + 2 * i;
        if (c < C) put(out + c * HW, u[i], 0);
        if (c + 1 < C) put(out + (c + 1) * HW, u[i], 1);
      }
    }
    if (!kAdd && 2 * p + 1 < H) {
      for (int64_t c = 0; c < C; ++c) _mm512_mask_storeu_ps(out + c * HW + W, cols, _mm512_setzero_ps());
    }
  }
}

template <bool kAdd>
void input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1, const StridedConvShape& g) {
  const int CV = g.C <= 16 ? 1 : 2;
  const int64_t CP = 16 * CV;
  std::vector<float> wp(static_cast<size_t>(g.K * CP), 0.0f);  // [K][CP], the channels past C zero
  for (int64_t k = 0; k < g.K; ++k) {
    for (int64_t c = 0; c < g.C; ++c) wp[k * CP + c] = w[k * g.C + c];
  }
  // Lane l of an image row: even column l holds position l / 2, lane 8 h + l / 2 of the half h.
  __m512i expand[2];
  __mmask16 keep[2] = {};
  for (int h = 0; h < 2; ++h) {
    alignas(64) int32_t t[16] = {};
    for (int l = 0; l < 16; ++l) {
      if (l < g.W && l % 2 == 0) t[l] = 8 * h + l / 2, keep[h] |= __mmask16(1u << l);
    }
    expand[h] = _mm512_load_si512(t);
  }
  const int64_t L = g.P * g.Q, HW = g.H * g.W;
  for (int64_t n = n0; n < n1; ++n) {
    if (CV == 1) {
      input_grad_image<1, kAdd>(gy + n * g.K * L, wp.data(), gx + n * g.C * HW, g, expand, keep);
    } else {
      input_grad_image<2, kAdd>(gy + n * g.K * L, wp.data(), gx + n * g.C * HW, g, expand, keep);
    }
  }
}

}  // namespace

bool projection_lanes_forward_supported(const StridedConvShape& g) {
  return plain_projection(g) && ((g.K <= 16 && g.Q <= 16) || (g.K <= 32 && g.Q <= 8));
}

void projection_lanes_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                              const StridedConvShape& g) {
  const int KV = g.K <= 16 ? 1 : 2;
  const int64_t KP = 16 * KV;
  // The weights transposed, [C][KP], and the biases, [KP]; the channels past K zero.
  std::vector<float> wt(static_cast<size_t>(g.C * KP), 0.0f), bias(static_cast<size_t>(KP), 0.0f);
  for (int64_t k = 0; k < g.K; ++k) {
    for (int64_t c = 0; c < g.C; ++c) wt[c * KP + k] = w[k * g.C + c];
    if (b) bias[k] = b[k];
  }
  for (int64_t n = n0; n < n1; ++n) {
    const float* xn = x + n * g.C * g.H * g.W;
    float* yn = y + n * g.K * g.P * g.Q;
    if (KV == 1) {
      forward_image<1>(xn, wt.data(), bias.data(), yn, g);
    } else {
      forward_image<2>(xn, wt.data(), bias.data(), yn, g);
    }
  }
}

bool projection_lanes_input_grad_supported(const StridedConvShape& g) {
  return plain_projection(g) && g.C <= 32 && g.W <= 16;
}

void projection_lanes_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                                 const StridedConvShape& g, bool add) {
  if (add) return input_grad<true>(gy, w, gx, n0, n1, g);
  input_grad<false>(gy, w, gx, n0, n1, g);
}

#else  // no AVX-512: never called (conv_strided_supported is false)

bool projection_lanes_forward_supported(const StridedConvShape&) { return false; }
void projection_lanes_forward(const float*, const float*, const float*, float*, int64_t, int64_t,
                              const StridedConvShape&) {}
bool projection_lanes_input_grad_supported(const StridedConvShape&) { return false; }
void projection_lanes_input_grad(const float*, const float*, float*, int64_t, int64_t, const StridedConvShape&,
                                 bool) {}

#endif

}  // namespace tandem::kernels::cpu::detail
