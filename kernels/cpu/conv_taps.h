// Internal: the inner block of the direct float32 convolutions (kernels/cpu/conv3x3.cpp,
// kernels/cpu/conv_strided.cpp). Both lay an image out flat, so that output position j reads tap t
// of input channel c at a fixed offset from j (conv_strided.cpp: in its phase planes; conv3x3.cpp's
// forward: in the map itself, the border's lanes masked off by SameTaps): KB output channels at 16 NV
// consecutive positions are KB x NV vector accumulators, each tap of each input channel NV vector
// loads and KB broadcast weights. AVX-512 only (the callers compile it only there).
// Also the row copies both use around it (copy_rows) and the bias gradient beside their weight
// gradients (bias_grad, which has a plain loop at other levels for conv.cpp to compile).
// Guarantees: an output is its bias (or 0) plus the products summed over input channels, then
// taps, in increasing order; nothing is written at or past position L.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

// Output channels [k0, k0 + KB) at flat positions [j0, j0 + 16 NV) of out [KB][pitch] (b: their
// biases, or null); wk: the block's packed weights [Cin][T][KB]; load(c, t, v): input channel c's tap t
// for the block's vector v (a plain load at a fixed offset, or SameTaps' masked one).
template <int KB, int NV, int T, typename Load>
void taps_block(Load load, const float* wk, const float* b, float* out, int64_t Cin, int64_t pitch, int64_t L,
                int64_t j0) {
  __m512 acc[KB][NV];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[j][v] = b ? _mm512_set1_ps(b[j]) : _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < Cin; ++c) {
    const float* wc = wk + c * T * KB;
#pragma GCC unroll 9
    for (int t = 0; t < T; ++t) {
      __m512 v_in[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) v_in[v] = load(c, t, v);
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

// Padding 1, stride 1, 3x3, in the flat layout without a border (kernels/cpu/conv_c1.cpp,
// kernels/cpu/conv3x3.cpp): output j = p * W + q of an H x W map reads tap t = (r, s) at input
// j + offset(t), offset(t) = (r - 1) * W + s - 1, in the lanes where row p + r - 1 and column q + s - 1
// lie in the map; mask(v, t) holds those lanes of vector v (positions 16 v .. 16 v + 15, none at or
// past H * W). Vectors span row ends, so every lane is an output position: no bordered copy in, no row
// copies out.
class SameTaps {
 public:
  SameTaps(int64_t H, int64_t W) : HW_(H * W), nvec_((H * W + 15) / 16), masks_(static_cast<size_t>(nvec_ * 9), 0) {
    for (int t = 0; t < 9; ++t) off_[t] = (t / 3 - 1) * W + t % 3 - 1;
    for (int64_t j = 0; j < HW_; ++j) {
      const int64_t p = j / W, q = j % W;
      for (int t = 0; t < 9; ++t) {
        const int64_t r = p + t / 3 - 1, c = q + t % 3 - 1;
        if (r >= 0 && r < H && c >= 0 && c < W) masks_[(j / 16) * 9 + t] |= __mmask16(1u << (j % 16));
      }
    }
  }
  int64_t vectors() const { return nvec_; }
  int64_t lanes(int64_t v) const { return std::min<int64_t>(16, HW_ - 16 * v); }
  // Tap t of vector v of map xi, 0 in the lanes where it reads the border. The address of a
  // masked-off lane may lie outside the map (before its first row, past its last): it is formed in
  // integers and never read.
  __m512 load(const float* xi, int64_t v, int t) const {
    const int64_t bytes = (16 * v + off_[t]) * int64_t(sizeof(float));
    const auto at = reinterpret_cast<uintptr_t>(xi) + static_cast<uintptr_t>(bytes);
    return _mm512_maskz_loadu_ps(masks_[v * 9 + t], reinterpret_cast<const float*>(at));
  }
  // All 9 taps of vector v.
  void load(const float* xi, int64_t v, __m512 (&t)[9]) const {
#pragma GCC unroll 9
    for (int i = 0; i < 9; ++i) t[i] = load(xi, v, i);
  }

 private:
  int64_t HW_, nvec_;
  int64_t off_[9];
  std::vector<__mmask16> masks_;
};

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
