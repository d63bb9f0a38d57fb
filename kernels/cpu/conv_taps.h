// Internal: the inner block of the direct float32 convolutions (kernels/cpu/conv3x3.cpp,
// kernels/cpu/conv_strided.cpp). Both lay an image out flat, so that output position j reads tap t
// of input channel c at in + c * plane + off[t] + j: KB output channels at 16 NV consecutive
// positions are KB x NV vector accumulators, each tap of each input channel NV vector loads and KB
// broadcast weights. AVX-512 only (the callers compile it only there).
// Also the row copies both use around it (copy_rows) and the bias gradient beside their weight
// gradients (bias_grad, which has a plain loop at other levels for conv.cpp to compile).
// Guarantees: an output is its bias (or 0) plus the products summed over input channels, then
// taps, in increasing order; nothing is written at or past position L.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

// Output channels [k0, k0 + KB) at flat positions [j0, j0 + 16 NV) of out [KB][pitch] (b: their
// biases, or null); wk: the block's packed weights [Cin][T][KB]; T taps at offsets off[0..T).
template <int KB, int NV, int T>
void taps_block(const float* in, const int64_t* off, const float* wk, const float* b, float* out, int64_t Cin,
                int64_t plane, int64_t pitch, int64_t L, int64_t j0) {
  __m512 acc[KB][NV];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[j][v] = b ? _mm512_set1_ps(b[j]) : _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < Cin; ++c) {
    const float* base = in + c * plane + j0;
    const float* wc = wk + c * T * KB;
#pragma GCC unroll 9
    for (int t = 0; t < T; ++t) {
      __m512 v_in[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) v_in[v] = _mm512_loadu_ps(base + off[t] + 16 * v);
#pragma GCC unroll 8
      for (int j = 0; j < KB; ++j) {
        const __m512 wv = _mm512_set1_ps(wc[t * KB + j]);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_fmadd_ps(wv, v_in[v], acc[j][v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) simd::store_first(out + j * pitch + j0 + 16 * v, acc[j][v], L - j0 - 16 * v);
  }
}

// db[k] += the sum of gy's channel k over images [n0, n1) (gy [N][K][PQ], read in place, the last
// vector of each map masked): 4 per-lane partial sums in image and position order, then one
// horizontal sum a channel, so the result depends only on [n0, n1).
inline void bias_grad(const float* gy, int64_t n0, int64_t n1, int64_t K, int64_t PQ, float* db) {
  for (int64_t k = 0; k < K; ++k) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int u = 0;
    for (int64_t n = n0; n < n1; ++n) {
      const float* g = gy + (n * K + k) * PQ;
      for (int64_t j = 0; j < PQ; j += 16, u = (u + 1) & 3) {
        acc[u] = _mm512_add_ps(acc[u], simd::load_first(g + j, PQ - j));
      }
    }
    db[k] += simd::hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

// rows x cols floats from src (row pitch src_pitch, default cols) to dst (pitch dst_pitch): one
// copy when both pitches are cols (the 1x1 layers' maps), else each row by vectors, its last one
// masked (rows of 7-28 floats, where a library call per row cost more than the copy).
inline void copy_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t dst_pitch,
                      int64_t src_pitch = -1) {
  if (src_pitch < 0) src_pitch = cols;
  if (src_pitch == cols && dst_pitch == cols) {
    std::memcpy(dst, src, rows * cols * sizeof(float));
    return;
  }
  const int64_t full = cols / 16 * 16;
  const __mmask16 tail = simd::lane_mask(cols - full);  // computed once: rows are often a single short vector
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * src_pitch;
    float* d = dst + r * dst_pitch;
    for (int64_t c = 0; c < full; c += 16) _mm512_storeu_ps(d + c, _mm512_loadu_ps(s + c));
    if (tail) _mm512_mask_storeu_ps(d + full, tail, _mm512_maskz_loadu_ps(tail, s + full));
  }
}

#else  // no direct kernels at this level: the same sums in one chain a channel (never reached by conv.cpp)

inline void bias_grad(const float* gy, int64_t n0, int64_t n1, int64_t K, int64_t PQ, float* db) {
  for (int64_t k = 0; k < K; ++k) {
    float acc = 0.0f;
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t j = 0; j < PQ; ++j) acc += gy[(n * K + k) * PQ + j];
    db[k] += acc;
  }
}

#endif

}  // namespace tandem::kernels::cpu::detail
