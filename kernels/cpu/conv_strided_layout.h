// Internal: the input side of the stride-2 direct convolutions, which their forward
// (kernels/cpu/conv_strided.cpp) and their weight gradient (kernels/cpu/conv_strided_wgrad.cpp) both
// read: the phase planes a 3x3 reads, the even pixels a 1x1 projection reads, and the flat groups of
// images the projections' small maps take (flat_group). AVX-512 only (the callers compile it only there).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cpu/conv_strided.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

constexpr int kMaxTaps = 9;

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// buf holding n zeros, its storage kept from call to call (each thread its own): a fresh buffer
// of a few hundred KiB is a fresh mapping, whose page faults cost more than these layers'
// arithmetic.
inline float* zeroed(std::vector<float>& buf, int64_t n) {
  buf.assign(static_cast<size_t>(n), 0.0f);
  return buf.data();
}

// even[m] = src[2 m] (m < n_even) and odd[m] = src[2 m + 1] (m < n_odd), for a row of w floats:
// two masked loads (nothing read at or past src + w) and two permutes per 32 source floats;
// masked stores (nothing written at or past even + n_even, odd + n_odd). A null even or odd is
// not written.
inline void deinterleave(const float* src, int64_t w, float* even, int64_t n_even, float* odd, int64_t n_odd) {
  const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  if (!even) n_even = 0;
  if (!odd) n_odd = 0;
  for (int64_t m = 0; m < std::max(n_even, n_odd); m += 16) {
    const __m512 lo = simd::load_first(src + 2 * m, w - 2 * m);
    const __m512 hi = simd::load_first(src + 2 * m + 16, w - 2 * m - 16);
    if (m < n_even) simd::store_first(even + m, _mm512_permutex2var_ps(lo, even_idx, hi), n_even - m);
    if (m < n_odd) simd::store_first(odd + m, _mm512_permutex2var_ps(lo, odd_idx, hi), n_odd - m);
  }
}

// The phase planes of the input side (forward and weight gradient), all of pitch Q, so that output
// (p, q) is flat position p * Q + q in every plane, in y and in gy alike (no dead columns, y written and
// gy read in place). Plane (a, b, d) holds at (i, j) the padded pixel (2 i + a, 2 (j + d) + b), and tap
// (r, s) reads plane (r % 2, s % 2, s / 2) at row offset r / 2: the tap's column step is taken in the
// plane itself, where an offset of one column would wrap into the next row at q = Q - 1. A 3x3 reads
// six planes (its taps s = 0 and s = 2 of phase column b = 0 two planes one column apart), a 1x1 one.
constexpr int kMaxSlots = 6;
struct Phases {
  int64_t Hf, plane, L;  // plane = Hf * Q; L = P * Q flat output positions
  int slots = 0;
  std::array<int, kMaxSlots> key_a{}, key_b{}, key_d{};  // slot -> its plane (a, b, d)
  int T = 0;
  std::array<int64_t, kMaxTaps> off{};  // tap r * S + s -> offset from c * plane

  explicit Phases(const StridedConvShape& g) {
    Hf = g.P + (g.R - 1) / 2, plane = Hf * g.Q, L = g.P * g.Q;
    T = int(g.R * g.S);
    for (int64_t r = 0; r < g.R; ++r)
      for (int64_t s = 0; s < g.S; ++s) {
        const int a = int(r % 2), b = int(s % 2), d = int(s / 2);
        int sl = 0;
        while (sl < slots && !(key_a[sl] == a && key_b[sl] == b && key_d[sl] == d)) ++sl;
        if (sl == slots) key_a[sl] = a, key_b[sl] = b, key_d[sl] = d, ++slots;
        off[r * g.S + s] = sl * g.C * plane + (r / 2) * g.Q;
      }
  }
  int64_t image_floats(const StridedConvShape& g) const { return slots * g.C * plane; }

  // Writes image xn's planes into xp (whose other positions are zero and stay so: each image writes the
  // same positions). Source row ih is padded row ih + pad_h = 2 i + a; source column iw = 2 m + parity is
  // padded column 2 J + b with b = (parity + pad_w) % 2 and J = J0 + m, J0 = (parity + pad_w) / 2, and
  // lands in plane (a, b, d) at column J - d where that lies in [0, Q). Only a 3x3 is filled (the 1x1
  // projections gather their one plane): three planes of each row parity a, (a, 0, 0), (a, 0, 1) and
  // (a, 1, 0), filled together in a pass over the rows of that parity, everything the loop needs in
  // locals (a masked store would otherwise order the reloads of the shape behind it).
  void fill(const float* xn, const StridedConvShape& g, float* xp) const {
    const int64_t C = g.C, H = g.H, W = g.W, Q = g.Q, pad_h = g.pad_h, rows = Hf, pitch = plane;
    // Rows of at most 32 pixels whose plane rows fit a vector (the ResNet's): two masked loads, then one
    // permute and one masked store a plane; wider rows split through a buffer.
    const bool narrow = W <= 32 && Q <= 16;
    const __mmask16 lo_m = simd::lane_mask(W), hi_m = simd::lane_mask(W - 16);
    thread_local std::vector<float> split_buf;
    const int64_t half = W / 2 + 32;
    if (!narrow) split_buf.resize(static_cast<size_t>(2 * half));
    for (int a = 0; a < 2; ++a) {
      // Plane u of this a: its columns [col0, col0 + count) hold source pixels first_m[u] + l of the
      // column parity parity[u], at dst[u] from the channel's row.
      int parity[3] = {}, first_m[3] = {};
      int64_t dst[3] = {}, count[3] = {};
      __m512i idx[3];
      __mmask16 mask[3] = {};
      int n = 0;
      for (int k = 0; k < slots && n < 3; ++k) {
        if (key_a[k] != a) continue;
        parity[n] = int((key_b[k] + g.pad_w) & 1);
        const int64_t first = (parity[n] + g.pad_w) / 2 - key_d[k], n_src = (W - parity[n] + 1) / 2;
        const int64_t col0 = std::max<int64_t>(0, first), col1 = std::min(Q, first + n_src);
        dst[n] = k * C * pitch + col0, count[n] = std::max<int64_t>(0, col1 - col0), first_m[n] = int(col0 - first);
        alignas(64) int32_t table[16] = {};
        for (int l = 0; l < 16 && l < count[n]; ++l) {
          table[l] = int32_t(parity[n] + 2 * (first_m[n] + l));
          mask[n] |= __mmask16(1u << l);
        }
        idx[n++] = _mm512_load_si512(table);
      }
      // Rows ih = 2 i + a - pad_h in [0, H), i < Hf.
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t ih = ((a - pad_h) % 2 + 2) % 2; ih < H; ih += 2) {
          const int64_t i = (ih + pad_h) / 2;
          if (i >= rows) break;
          const float* src = xn + (c * H + ih) * W;
          float* row = xp + c * pitch + i * Q;
          if (narrow) {
            const __m512 lo = _mm512_maskz_loadu_ps(lo_m, src), hi = _mm512_maskz_loadu_ps(hi_m, src + 16);
#pragma GCC unroll 3
            for (int u = 0; u < 3; ++u) {
              _mm512_mask_storeu_ps(row + dst[u], mask[u], _mm512_permutex2var_ps(lo, idx[u], hi));
            }
            continue;
          }
          float* split[2] = {split_buf.data(), split_buf.data() + half};
          deinterleave(src, W, split[0], (W + 1) / 2, split[1], W / 2);
          for (int u = 0; u < 3; ++u) {
            const float* from = split[parity[u]] + first_m[u];
            std::copy(from, from + count[u], row + dst[u]);
          }
        }
      }
    }
  }
};

// A 1x1 stride-2 projection without padding: output (p, q) reads input pixel (2 p, 2 q) alone.
inline bool plain_projection(const StridedConvShape& g) {
  return g.R == 1 && g.S == 1 && g.pad_h == 0 && g.pad_w == 0;
}

// xs[c * ld + p * Q + q] = xn[c][2 p][2 q]: the pixels a projection reads, channel by channel. Rows of
// at most 32 pixels (the ResNet's) take one permute each, with masks computed once. Not inlined: inlined
// into the weight gradient's group loop, the 16->32 projection's weight gradient measured 0.94x.
[[gnu::noinline]] inline void gather_even_pixels(const float* xn, const StridedConvShape& g, float* xs, int64_t ld) {
  const int64_t C = g.C, H = g.H, W = g.W, P = g.P, Q = g.Q;  // locals: not reloaded after each store
  const __mmask16 lo_mask = simd::lane_mask(W), hi_mask = simd::lane_mask(W - 16), q_mask = simd::lane_mask(Q);
  const __m512i even = simd::even_lanes();
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t p = 0; p < P; ++p) {
      const float* src = xn + (c * H + 2 * p) * W;
      float* dst = xs + c * ld + p * Q;
      if (W > 32) {
        deinterleave(src, W, dst, Q, nullptr, 0);
        continue;
      }
      const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, src), hi = _mm512_maskz_loadu_ps(hi_mask, src + 16);
      _mm512_mask_storeu_ps(dst, q_mask, _mm512_permutex2var_ps(lo, even, hi));
    }
  }
}

// Eight vectors as 128 floats indexed by (vector i, lane l), traded between layouts in registers: three
// stages, each pairing the vectors whose index differs in one bit and trading that bit for one lane bit
// through two two-source permutes (the same two tables every stage).
// kToChannels: vector i = channels 2 i (lanes 0-7) and 2 i + 1 (lanes 8-15) over 8 positions -> vector
// q = the 16 channels of position q; kFromChannels the other way.
class PairTranspose {
 public:
  enum Kind { kToChannels, kFromChannels };
  explicit PairTranspose(Kind kind) : ascending_(kind == kToChannels) {
    alignas(64) int32_t a[16], b[16];
    for (int l = 0; l < 16; ++l) {
      a[l] = ascending_ ? (l >> 3) * 16 + (l & 7) * 2 : (l & 1) * 16 + (l >> 1);
      b[l] = a[l] + (ascending_ ? 1 : 8);
    }
    a_ = _mm512_load_si512(a), b_ = _mm512_load_si512(b);
  }
  void operator()(__m512 v[8]) const {
#pragma GCC unroll 3
    for (int t = 0; t < 3; ++t) {
      const int bit = 1 << (ascending_ ? t : 2 - t);
      __m512 u[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        if (i & bit) continue;
        u[i] = _mm512_permutex2var_ps(v[i], a_, v[i | bit]);
        u[i | bit] = _mm512_permutex2var_ps(v[i], b_, v[i | bit]);
      }
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) v[i] = u[i];
    }
  }

 private:
  bool ascending_;
  __m512i a_, b_;
};

// The even pixels channels last, where a projection has 16 CG input channels and its maps are at most 16
// wide (the 16->32 projection's 14 x 14): xt[(p Q + q) C + c] = xn[c][2 p][2 q]. Per output row and group of
// 16 channels: a permute of two channels' rows gives their even columns side by side (lanes 8 h + q hold
// channel 2 i + h of vector i), PairTranspose turns them into one vector of 16 channels a pixel, and Q
// stores write them.
inline bool even_pixels_channels_last(const StridedConvShape& g) {
  return plain_projection(g) && g.C % 16 == 0 && g.C <= 32 && g.W <= 16;
}

[[gnu::noinline]] inline void gather_even_pixels_channels_last(const float* xn, const StridedConvShape& g, float* xt) {
  const int64_t C = g.C, HW = g.H * g.W, W = g.W, P = g.P, Q = g.Q;
  const __mmask16 row = simd::lane_mask(W);
  const __m512i even = simd::even_lanes();
  const PairTranspose to_channels(PairTranspose::kToChannels);
  for (int64_t cg = 0; cg < C; cg += 16) {
    for (int64_t p = 0; p < P; ++p) {
      const float* r = xn + cg * HW + 2 * p * W;
      __m512 v[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        v[i] = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(row, r + 2 * i * HW), even,
                                      _mm512_maskz_loadu_ps(row, r + (2 * i + 1) * HW));
      }
      to_channels(v);
      for (int64_t q = 0; q < Q; ++q) _mm512_storeu_ps(xt + (p * Q + q) * C + cg, v[q]);
    }
  }
}

// The even pixels of a projection of at most 8 input channels with an even Q (maps at most 32 wide: the
// 8->16 projection's 28 x 28) in pairs of positions: xt[(f / 2) 16 + 2 c + f % 2] = xn[c][2 p][2 q] at flat
// position f = p Q + q. Per output row: each channel's even columns by one permute of its row's two
// vectors, then an 8x8 transpose of the float pairs (simd::transpose8x8_64); the channels past C are zeros.
inline bool even_pixel_pairs(const StridedConvShape& g) {
  return plain_projection(g) && g.C <= 8 && g.Q % 2 == 0 && g.W <= 32;
}

[[gnu::noinline]] inline void gather_even_pixel_pairs(const float* xn, const StridedConvShape& g, float* xt) {
  const int64_t C = g.C, HW = g.H * g.W, W = g.W, P = g.P, Q = g.Q;
  const __mmask16 lo = simd::lane_mask(W), hi = simd::lane_mask(W - 16);
  const __m512i even = simd::even_lanes();
  for (int64_t p = 0; p < P; ++p) {
    __m512 v[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const float* r = xn + c * HW + 2 * p * W;
      v[c] = c < C ? _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lo, r), even, _mm512_maskz_loadu_ps(hi, r + 16))
                   : _mm512_setzero_ps();
    }
    simd::transpose8x8_64(v);
    for (int64_t j = 0; j < Q / 2; ++j) _mm512_storeu_ps(xt + (p * Q / 2 + j) * 16, v[j]);
  }
}

// Images a flat group: one where an image's P Q fills its vectors to within an eighth (the 8->16
// projection's 196 in 13), else enough that G P Q is a whole number of vectors where that takes at
// most 16 images (16 / gcd(P Q, 16)), fewer where the group's gathered input would pass 256 KiB. No
// larger than it must be: the 8->16 projection in groups of 4 measured 0.9x of one image at a time.
inline int64_t flat_group(int64_t PQ, int64_t C, int64_t n) {
  if (8 * (round_up(PQ, 16) - PQ) <= round_up(PQ, 16)) return 1;
  int64_t G = 16;
  while (G > 1 && (PQ * G / 2) % 16 == 0) G /= 2;
  while (G > 1 && G * C * PQ > (int64_t{1} << 16)) G /= 2;
  return std::max<int64_t>(1, std::min(G, n));
}

#endif

}  // namespace tandem::kernels::cpu::detail
