// Internal to kernels/cpu/conv.cpp: a conv's geometry and the float32 AVX-512 plans that build and
// scatter its column matrix with vector permutes (Im2colPermute, Col2imGather; stubs that never
// apply at other SIMD levels).
// Assumes: contiguous NCHW float tensors; the geometry of validated arguments.
// Guarantees: Col2imGather adds per pixel the same terms in the same order as col2im (the same bits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/conv.h"
#include "kernels/cpu/conv3x3.h"
#include "kernels/cpu/conv_c1.h"
#include "kernels/cpu/conv_strided.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail::conv_plan {

struct Geometry {
  int64_t N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw;
  int64_t crs() const { return C * R * S; }
  int64_t pq() const { return P * Q; }
  // The column matrix is the input itself: 1x1 kernel, stride 1, no padding.
  bool identity_col() const { return R == 1 && S == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
  // One input channel, 3x3, stride 1, padding 0 or 1: the direct kernels of conv_c1.h (float32).
  bool direct_c1() const { return detail::conv_c1_supported(C, R, S, sh, sw, ph, pw); }
  // 3x3, stride 1, padding 1, up to 64 channels: the direct kernels of conv3x3.h (float32).
  bool direct_3x3() const { return detail::conv3x3_supported(C, K, R, S, sh, sw, ph, pw); }
  // Stride 2, 1x1 or 3x3, up to 64 channels: the direct kernels of conv_strided.h (float32).
  bool direct_strided() const { return detail::conv_strided_supported(C, K, R, S, sh, sw, ph, pw); }
  detail::StridedConvShape strided() const { return {C, H, W, K, R, S, ph, pw, P, Q}; }
  // A float32 column matrix is built and scattered with vector rows (copy_spill, add_spill,
  // Im2colPermute, Col2imGather) where they are compiled in: rows of stride 1. The direct kernels'
  // geometry is one of these.
  bool vector_rows() const { return !identity_col() && sw == 1; }
};

// The vector rows are written for AVX-512 only; other levels run im2col/col2im and Eigen.
constexpr bool kVectorRows = kSimdLevel == SimdLevel::avx512;

Geometry make_geometry(const Tensor& x, const Tensor& w, const Conv2dArgs& a) {
  Geometry g{};
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.K = w.size(0), g.R = w.size(2), g.S = w.size(3);
  g.sh = a.stride_h, g.sw = a.stride_w, g.ph = a.pad_h, g.pw = a.pad_w;
  g.P = (g.H + 2 * g.ph - g.R) / g.sh + 1;
  g.Q = (g.W + 2 * g.pw - g.S) / g.sw + 1;
  return g;
}

// Slack past the end of a column-matrix row that vector row copies may write (see conv.cpp).
template <typename T>
constexpr int64_t kSpill = 64 / sizeof(T);

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// im2col for float, stride 1, no padding, when each output vector of 16
// column-matrix elements comes from a source span of at most 32 floats (true
// for the MNIST conv2: Q = 11, W = 13). A row (c, r, s) of the column matrix
// is the P x Q window of channel c at (r, s) read with pitch W; output vector
// j is one permute (vpermt2ps) of two masked loads at a fixed offset from the
// window start, then one full store. This replaces Q-float row copies whose
// overlapping, line-splitting stores dominated the general im2col. Spill
// past the end of a row: as im2col (kSpill slack, overwritten by the next row).
class Im2colPermute {
 public:
  static constexpr int64_t kMaxVectors = 64;

  // False when the geometry does not qualify (then use im2col).
  bool plan(const Geometry& g) {
    if (g.sh != 1 || g.sw != 1 || g.ph != 0 || g.pw != 0 || g.Q <= 0 || g.P <= 0) return false;
    const int64_t PQ = g.pq();
    nvec_ = (PQ + 15) / 16;
    if (nvec_ > kMaxVectors) return false;
    for (int64_t j = 0; j < nvec_; ++j) {
      const int64_t first = 16 * j, lanes = std::min<int64_t>(16, PQ - first);
      auto src = [&](int64_t i) { return (i / g.Q) * g.W + i % g.Q; };
      lo_[j] = src(first);
      alignas(64) int32_t idx[16] = {};
      int64_t span = 0;
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t rel = src(first + l) - lo_[j];
        if (rel >= 32) return false;
        idx[l] = static_cast<int32_t>(rel);
        span = std::max(span, rel + 1);
      }
      idx_[j] = _mm512_load_si512(idx);
      ma_[j] = simd::lane_mask(span);
      mb_[j] = simd::lane_mask(span - 16);
    }
    return true;
  }

  void run(const float* x, const Geometry& g, float* col) const {
    const int64_t PQ = g.pq();
    for (int64_t c = 0; c < g.C; ++c) {
      for (int64_t r = 0; r < g.R; ++r) {
        for (int64_t s = 0; s < g.S; ++s) {
          float* dst = col + ((c * g.R + r) * g.S + s) * PQ;
          const float* base = x + (c * g.H + r) * g.W + s;
          for (int64_t j = 0; j < nvec_; ++j) {
            const float* p = base + lo_[j];
            const __m512 a = _mm512_maskz_loadu_ps(ma_[j], p), b = _mm512_maskz_loadu_ps(mb_[j], p + 16);
            _mm512_storeu_ps(dst + 16 * j, _mm512_permutex2var_ps(a, idx_[j], b));
          }
        }
      }
    }
  }

 private:
  int64_t nvec_ = 0;
  int64_t lo_[kMaxVectors];
  __m512i idx_[kMaxVectors];
  __mmask16 ma_[kMaxVectors], mb_[kMaxVectors];
};

// col2im for float and stride 1 (any padding) as a gather: each output
// vector of 16 image pixels of channel c sums, over (r, s) in the same order
// as col2im, one permute of two masked loads from column-matrix row (c, r, s),
// with lanes that kernel tap does not reach zeroed; then one store. No
// zero-fill, no read-modify-write of the image, nothing written past it, and
// per pixel the same additions in the same order as col2im (so the same bits).
// Applies when, for every (r, s, vector), the reached source elements span at
// most 32 floats.
class Col2imGather {
 public:
  bool plan(const Geometry& g) {
    if (g.sh != 1 || g.sw != 1 || g.P <= 0 || g.Q <= 0) return false;
    const int64_t HW = g.H * g.W;
    nvec_ = (HW + 15) / 16;
    if (nvec_ * g.R * g.S > 4096) return false;
    taps_.assign(static_cast<size_t>(g.R * g.S * nvec_), Tap{});
    for (int64_t r = 0; r < g.R; ++r) {
      for (int64_t s = 0; s < g.S; ++s) {
        for (int64_t j = 0; j < nvec_; ++j) {
          Tap& t = taps_[(r * g.S + s) * nvec_ + j];
          int64_t src[16], lo = -1, hi = -1;
          for (int64_t l = 0; l < 16; ++l) {
            src[l] = -1;
            const int64_t i = 16 * j + l;
            if (i >= HW) continue;
            const int64_t p = i / g.W + g.ph - r, q = i % g.W + g.pw - s;
            if (p < 0 || p >= g.P || q < 0 || q >= g.Q) continue;
            src[l] = p * g.Q + q;
            lo = lo < 0 ? src[l] : std::min(lo, src[l]);
            hi = std::max(hi, src[l]);
          }
          if (lo < 0) continue;  // this tap reaches no pixel of the vector: lanes stays 0
          const int64_t span = hi - lo + 1;
          if (span > 32) return false;
          alignas(64) int32_t idx[16] = {};
          unsigned lanes = 0;
          for (int l = 0; l < 16; ++l) {
            if (src[l] < 0) continue;
            idx[l] = static_cast<int32_t>(src[l] - lo);
            lanes |= 1u << l;
          }
          t.lo = lo;
          t.idx = _mm512_load_si512(idx);
          t.lanes = __mmask16(lanes);
          t.ma = simd::lane_mask(span);
          t.mb = simd::lane_mask(span - 16);
        }
      }
    }
    return true;
  }

  // dx[c] = sum over (r, s) of the reached dcol elements, for all channels.
  void run(const float* dcol, const Geometry& g, float* dx) const {
    const int64_t PQ = g.pq(), HW = g.H * g.W, RS = g.R * g.S;
    for (int64_t c = 0; c < g.C; ++c) {
      const float* rows = dcol + c * RS * PQ;
      float* out = dx + c * HW;
      for (int64_t j = 0; j < nvec_; ++j) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t rs = 0; rs < RS; ++rs) {
          const Tap& t = taps_[rs * nvec_ + j];
          if (!t.lanes) continue;
          const float* p = rows + rs * PQ + t.lo;
          const __m512 a = _mm512_maskz_loadu_ps(t.ma, p), b = _mm512_maskz_loadu_ps(t.mb, p + 16);
          acc = _mm512_add_ps(acc, _mm512_maskz_permutex2var_ps(t.lanes, a, t.idx, b));
        }
        simd::store_first(out + 16 * j, acc, HW - 16 * j);
      }
    }
  }

 private:
  struct Tap {
    __m512i idx;
    int64_t lo = 0;
    __mmask16 lanes = 0, ma = 0, mb = 0;
  };
  int64_t nvec_ = 0;
  std::vector<Tap> taps_;
};

#else  // no AVX-512: the plans never apply, im2col and col2im run instead

struct Im2colPermute {
  bool plan(const Geometry&) { return false; }
  void run(const float*, const Geometry&, float*) const {}
};
struct Col2imGather {
  bool plan(const Geometry&) { return false; }
  void run(const float*, const Geometry&, float*) const {}
};

#endif

}  // namespace tandem::kernels::cpu::detail::conv_plan
