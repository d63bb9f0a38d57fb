// Direct convolutions with stride 2 (kernels/cpu/conv_strided.h). Layout (forward and weight
// gradient): the zero-padded input is split into planes of pitch Q, plane (a, b, d) holding padded
// pixel (2 i + a, 2 (j + d) + b) at (i, j) for i < Hf = P + (R - 1) / 2 and j < Q; output (p, q) is flat
// position p * Q + q and reads tap (r, s) at that position plus (r / 2) * Q in plane (r % 2, s % 2,
// s / 2). With the output's own pitch, y is written and gy read in place (no dead columns between
// rows). Splitting a source row into its planes is one permute of two loads a plane. Forward: per
// block of 8 output channels and 32 positions, 16 accumulators take, for every input channel and
// tap, 2 input vectors and 8 broadcast weights (taps_block, kernels/cpu/conv_taps.h, with a table of
// tap offsets). Weight gradient: per block of output and input channels (3 x 1 for 3x3, 4 x 4 for 1x1),
// per lane accumulators over the output gradient (its last vector masked), each input vector held in a
// register for the block's output channels (simd::in_register). Input gradient: per
// phase (a, b) of the padded input, the taps of that phase read the output gradient, copied into
// a zero border of (R - 1) / 2 rows and (S - 1) / 2 columns, at fixed offsets (the same forward
// kernel with the output and input channels swapped); the phases' rows are then interleaved into
// the image's rows (one permute per 16 pixel pairs). The 1x1 projections without padding skip the
// phases: the forward and the weight gradient gather the even pixels of the even rows (one permute a
// row), and the input gradient is W^T gy scattered to those pixels, gy read in place.
#include "kernels/cpu/conv_strided.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv3x3.h"
#include "kernels/cpu/conv_taps.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

bool conv_strided_supported(int64_t C, int64_t K, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w,
                            int64_t pad_h, int64_t pad_w) {
  const bool kernel = (R == 1 && S == 1) || (R == 3 && S == 3);
  return kernel && stride_h == 2 && stride_w == 2 && pad_h >= 0 && pad_w >= 0 && pad_h < R && pad_w < S && C >= 1 &&
         K >= 1 && C <= kConv3x3MaxChannels && K <= kConv3x3MaxChannels;
}

namespace {

constexpr int64_t kBlock = 8;  // output channels per forward block
constexpr int kMaxTaps = 9;

// even[m] = src[2 m] (m < n_even) and odd[m] = src[2 m + 1] (m < n_odd), for a row of w floats:
// two masked loads (nothing read at or past src + w) and two permutes per 32 source floats;
// masked stores (nothing written at or past even + n_even, odd + n_odd). A null even or odd is
// not written.
void deinterleave(const float* src, int64_t w, float* even, int64_t n_even, float* odd, int64_t n_odd) {
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

// dst[2 m] = e[m], dst[2 m + 1] = o[m] for the n destination floats (e and o readable 16 floats
// past (n + 1) / 2).
void interleave(const float* e, const float* o, int64_t n, float* dst) {
  const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t m = 0; 2 * m < n; m += 16) {
    const __m512 ev = _mm512_loadu_ps(e + m), ov = _mm512_loadu_ps(o + m);
    simd::store_first(dst + 2 * m, _mm512_permutex2var_ps(ev, lo_idx, ov), n - 2 * m);
    simd::store_first(dst + 2 * m + 16, _mm512_permutex2var_ps(ev, hi_idx, ov), n - 2 * m - 16);
  }
}

// All Cout output channels over flat positions [0, L) into out [Cout][pitch] (the operands are
// read up to L rounded up to 32): blocks of kBlock channels, then single ones. packed: [Cout
// blocks][Cin][T][kb] as pack_weights writes it.
void taps_conv(const float* in, const int64_t* off, int T, const float* packed, const float* b, float* out,
               int64_t pitch, int64_t Cin, int64_t Cout, int64_t plane, int64_t L) {
  int64_t k0 = 0;
  const auto run = [&](auto kb_tag, auto t_tag) {
    constexpr int KB = decltype(kb_tag)::value, TT = decltype(t_tag)::value;
    const float* wk = packed + k0 * Cin * TT;
    const float* bk = b ? b + k0 : nullptr;
    for (int64_t j0 = 0; j0 < L; j0 += 32) {
      const auto load = [&](int64_t c, int t, int v) { return _mm512_loadu_ps(in + c * plane + off[t] + j0 + 16 * v); };
      if (L - j0 > 16) {
        taps_block<KB, 2, TT>(load, wk, bk, out + k0 * pitch, Cin, pitch, L, j0);
      } else {
        taps_block<KB, 1, TT>(load, wk, bk, out + k0 * pitch, Cin, pitch, L, j0);
      }
    }
  };
  // The tap counts the supported kernels make: 9 (3x3), 4, 2 and 1 (the input gradient's phases of
  // a 3x3; a 1x1).
  const auto taps = [&](auto kb_tag) {
    switch (T) {
      case 9: return run(kb_tag, std::integral_constant<int, 9>{});
      case 4: return run(kb_tag, std::integral_constant<int, 4>{});
      case 2: return run(kb_tag, std::integral_constant<int, 2>{});
      default: return run(kb_tag, std::integral_constant<int, 1>{});
    }
  };
  for (; k0 + kBlock <= Cout; k0 += kBlock) taps(std::integral_constant<int, kBlock>{});
  for (; k0 < Cout; ++k0) taps(std::integral_constant<int, 1>{});
}

// packed[k0 * Cin * T + (c * T + t) * kb + j] = weight(k0 + j, c, t), in taps_conv's blocks.
template <typename F>
std::vector<float> pack_weights(int64_t Cin, int64_t Cout, int T, F weight) {
  std::vector<float> packed(static_cast<size_t>(Cout * Cin * T));
  for (int64_t k0 = 0; k0 < Cout;) {
    const int64_t kb = k0 + kBlock <= Cout ? kBlock : 1;
    for (int64_t c = 0; c < Cin; ++c)
      for (int t = 0; t < T; ++t)
        for (int64_t j = 0; j < kb; ++j) packed[k0 * Cin * T + (c * T + t) * kb + j] = weight(k0 + j, c, t);
    k0 += kb;
  }
  return packed;
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

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// buf holding n zeros, its storage kept from call to call (each thread its own): a fresh buffer
// of a few hundred KiB is a fresh mapping, whose page faults cost more than these layers'
// arithmetic.
float* zeroed(std::vector<float>& buf, int64_t n) {
  buf.assign(static_cast<size_t>(n), 0.0f);
  return buf.data();
}
inline int64_t floor_div2(int64_t v) { return v >= 0 ? v / 2 : -((1 - v) / 2); }

// ---- 1x1 stride-2 projections without padding: the backward read straight from gy ----
// Output (p, q) reads input pixel (2 p, 2 q) alone, so the input gradient is the product
// W^T gy [C][P Q] scattered to the even pixels of the even rows (everything else 0), and the
// weight gradient the products of gy with those pixels. Neither needs the phase planes, gy's
// bordered copies or the three empty phases of the general path.

bool plain_projection(const StridedConvShape& g) { return g.R == 1 && g.S == 1 && g.pad_h == 0 && g.pad_w == 0; }

// xs[c * ld + p * Q + q] = xn[c][2 p][2 q]: the pixels a projection reads, channel by channel. Rows of
// at most 32 pixels (the ResNet's) take one permute each, with masks computed once.
void gather_even_pixels(const float* xn, const StridedConvShape& g, float* xs, int64_t ld) {
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

// out[(c0 + j) * ld + pos] = sum_k w[k * C + c0 + j] * gy[k * L + pos], j < CB, pos < L (vectors past L
// written up to ld, which is L rounded up to 32; gy read only below L).
template <int CB>
void projection_transposed(const float* gy, int64_t L, const float* w, int64_t C, int64_t K, int64_t c0, float* out,
                           int64_t ld) {
  for (int64_t pos = 0; pos < L; pos += 32) {
    const __mmask16 m0 = simd::lane_mask(L - pos), m1 = simd::lane_mask(L - pos - 16);
    __m512 acc[CB][2];
#pragma GCC unroll 8
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const __m512 g0 = _mm512_maskz_loadu_ps(m0, gy + k * L + pos);
      const __m512 g1 = _mm512_maskz_loadu_ps(m1, gy + k * L + pos + 16);
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) {
        const __m512 wv = _mm512_set1_ps(w[k * C + c0 + j]);
        acc[j][0] = _mm512_fmadd_ps(wv, g0, acc[j][0]);
        acc[j][1] = _mm512_fmadd_ps(wv, g1, acc[j][1]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) {
      _mm512_storeu_ps(out + (c0 + j) * ld + pos, acc[j][0]);
      _mm512_storeu_ps(out + (c0 + j) * ld + pos + 16, acc[j][1]);
    }
  }
}

// Image rows 2 p and 2 p + 1 (2 W floats, contiguous) from row p of the product (its Q values): the
// values at the even pixels of row 2 p, 0 everywhere else. Maps at most 32 wide (the ResNet's): a row
// pair is at most 4 vectors, each one zero-masking permute of the product's row.
class RowPairScatter {
 public:
  // Tables only where the map is at most 32 wide (active()); wider ones interleave row by row.
  explicit RowPairScatter(const StridedConvShape& g)
      : W_(g.W), Q_(g.Q), nv_(g.W <= 32 ? int((2 * g.W + 15) / 16) : 0) {
    for (int u = 0; u < nv_; ++u) {
      alignas(64) int32_t idx[16] = {};
      __mmask16 keep = 0;
      for (int l = 0; l < 16; ++l) {
        const int64_t i = 16 * u + l, col = i % W_;
        if (i < W_ && col % 2 == 0) idx[l] = int32_t(col / 2), keep |= __mmask16(1u << l);
      }
      idx_[u] = _mm512_load_si512(idx);
      keep_[u] = keep;
    }
  }
  bool active() const { return nv_ > 0; }
  // One channel: the P rows of the product (prod, Q values a row) into the H x W image gxc. The tables
  // and the shape in locals (a masked store would have the loop reload them).
  void run(const float* prod, int64_t P, int64_t H, float* gxc) const {
    const int64_t W = W_, Q = Q_, HW = H * W_;
    const int nv = nv_;
    __m512i idx[4];
    __mmask16 keep[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) idx[u] = idx_[u], keep[u] = keep_[u];
    const __mmask16 q_mask = simd::lane_mask(Q);
    for (int64_t p = 0; p < P; ++p) {
      const __m512 v = _mm512_maskz_loadu_ps(q_mask, prod + p * Q);
      float* dst = gxc + 2 * p * W;
      const int64_t count = std::min(2 * W, HW - 2 * p * W);  // 2 W, or W for a last even row alone
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        if (u < nv && 16 * u < count) {
          simd::store_first(dst + 16 * u, _mm512_maskz_permutexvar_ps(keep[u], idx[u], v), count - 16 * u);
        }
      }
    }
  }

 private:
  int64_t W_, Q_;
  int nv_;
  __m512i idx_[4] = {};
  __mmask16 keep_[4] = {};
};

void projection_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                           const StridedConvShape& g) {
  const int64_t L = g.P * g.Q, ld = round_up(L, 32) + 16, HW = g.H * g.W;
  thread_local std::vector<float> prod_buf, zero_buf;
  float* prod = zeroed(prod_buf, g.C * ld);                 // [C][ld]: slack read by interleave
  const float* zeros = zeroed(zero_buf, g.W / 2 + 32);  // the odd columns
  const RowPairScatter scatter(g);
  for (int64_t n = n0; n < n1; ++n) {
    const float* gyn = gy + n * g.K * L;
    int64_t c = 0;
    for (; c + kBlock <= g.C; c += kBlock) projection_transposed<kBlock>(gyn, L, w, g.C, g.K, c, prod, ld);
    for (; c < g.C; ++c) projection_transposed<1>(gyn, L, w, g.C, g.K, c, prod, ld);
    float* gxn = gx + n * g.C * HW;
    for (int64_t ci = 0; ci < g.C; ++ci) {
      if (scatter.active()) {
        scatter.run(prod + ci * ld, g.P, g.H, gxn + ci * HW);
        continue;
      }
      for (int64_t ih = 0; ih < g.H; ++ih) {
        float* row = gxn + ci * HW + ih * g.W;
        if (ih % 2) {
          std::fill(row, row + g.W, 0.0f);
        } else {
          interleave(prod + ci * ld + (ih / 2) * g.Q, zeros, g.W, row);
        }
      }
    }
  }
}

}  // namespace

void conv_strided_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                          const StridedConvShape& g) {
  const Phases ph(g);
  const int64_t Lr = round_up(ph.L, 32), PQ = g.P * g.Q;
  const std::vector<float> packed =
      pack_weights(g.C, g.K, ph.T, [&](int64_t k, int64_t c, int t) { return w[(k * g.C + c) * ph.T + t]; });
  thread_local std::vector<float> xp_buf;
  float* xp = zeroed(xp_buf, ph.image_floats(g) + Lr + 64);  // borders stay 0
  for (int64_t n = n0; n < n1; ++n) {
    if (plain_projection(g)) {  // its one plane, P x Q
      gather_even_pixels(x + n * g.C * g.H * g.W, g, xp, ph.plane);
    } else {
      ph.fill(x + n * g.C * g.H * g.W, g, xp);
    }
    // The planes' pitch is Q: straight into y.
    taps_conv(xp, ph.off.data(), ph.T, packed.data(), b, y + n * g.K * PQ, PQ, g.C, g.K, ph.plane, PQ);
  }
}

void conv_strided_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                             const StridedConvShape& g) {
  if (plain_projection(g)) return projection_input_grad(gy, w, gx, n0, n1, g);
  // Phase (a, b) of the padded input: rows i with 2 i + a - pad_h in [0, H), from i0[a]; columns
  // likewise from j0[b]. Its value at (i, j) sums tap (r, s) (r % 2 = a, s % 2 = b) times the
  // output gradient at (i - r / 2, j - s / 2).
  const int64_t tr = (g.R - 1) / 2, ts = (g.S - 1) / 2;
  int64_t i0[2], rows[2], j0[2], cols[2];
  for (int64_t a = 0; a < 2; ++a) {
    i0[a] = std::max<int64_t>(0, -floor_div2(a - g.pad_h));
    rows[a] = std::max<int64_t>(0, floor_div2(g.H - 1 + g.pad_h - a) - i0[a] + 1);
    j0[a] = std::max<int64_t>(0, -floor_div2(a - g.pad_w));
    cols[a] = std::max<int64_t>(0, floor_div2(g.W - 1 + g.pad_w - a) - j0[a] + 1);
  }
  const int64_t Wg = std::max({g.Q, j0[0] + cols[0], j0[1] + cols[1]}) + ts;
  const int64_t Hg = std::max({g.P, i0[0] + rows[0], i0[1] + rows[1]}) + tr;
  const int64_t plane = Hg * Wg, PQ = g.P * g.Q, HW = g.H * g.W;

  struct Phase {
    int T = 0;
    std::array<int64_t, kMaxTaps> off{};
    std::vector<float> packed;
    int64_t L = 0, Lr = 0;
    std::vector<float> out;  // [C][Lr] (+ slack): zeros when the phase has no taps
  };
  std::array<Phase, 4> phases;
  for (int ph = 0; ph < 4; ++ph) {
    const int64_t a = ph / 2, b = ph % 2;
    Phase& f = phases[ph];
    std::array<int64_t, kMaxTaps> tap{};
    for (int64_t r = a; r < g.R; r += 2)
      for (int64_t s = b; s < g.S; s += 2) {
        tap[f.T] = r * g.S + s;
        f.off[f.T++] = (i0[a] - r / 2 + tr) * Wg + (j0[b] - s / 2 + ts);
      }
    f.L = rows[a] * Wg, f.Lr = round_up(f.L, 32);
    f.out.assign(static_cast<size_t>(g.C * f.Lr + 64), 0.0f);
    if (f.T == 0 || f.L == 0) {
      f.T = 0;
      continue;
    }
    f.packed = pack_weights(g.K, g.C, f.T, [&](int64_t c, int64_t k, int t) {
      return w[(k * g.C + c) * g.R * g.S + tap[t]];
    });
  }
  int64_t Lr_max = 0;
  for (const Phase& f : phases) Lr_max = std::max(Lr_max, f.Lr);
  thread_local std::vector<float> gyb_buf;
  float* gyb = zeroed(gyb_buf, g.K * plane + Lr_max + Wg + 64);  // borders stay 0

  for (int64_t n = n0; n < n1; ++n) {
    const float* gyn = gy + n * g.K * PQ;
    for (int64_t k = 0; k < g.K; ++k) copy_rows(gyn + k * PQ, g.P, g.Q, gyb + k * plane + tr * Wg + ts, Wg);
    for (Phase& f : phases) {
      if (f.T > 0) taps_conv(gyb, f.off.data(), f.T, f.packed.data(), nullptr, f.out.data(), f.Lr, g.K, g.C, plane,
                             f.L);
    }
    // Pixel (ih, iw): padded (ih + pad_h, iw + pad_w) is phase a = its row's parity, row (ih +
    // pad_h) / 2 - i0[a]; an even iw reads phase b = pad_w's parity, an odd one the other, both
    // from column 0 of the phase's rows (iw = 2 m + parity reads column m).
    const int64_t b_even = g.pad_w & 1, b_odd = 1 - b_even;
    float* gxn = gx + n * g.C * HW;
    for (int64_t c = 0; c < g.C; ++c) {
      for (int64_t ih = 0; ih < g.H; ++ih) {
        const int64_t a = (ih + g.pad_h) & 1, row = (ih + g.pad_h) / 2 - i0[a];
        const Phase& E = phases[a * 2 + b_even];
        const Phase& O = phases[a * 2 + b_odd];
        interleave(E.out.data() + c * E.Lr + row * Wg, O.out.data() + c * O.Lr + row * Wg, g.W,
                   gxn + c * HW + ih * g.W);
      }
    }
  }
}

namespace {

// The output gradient a weight gradient reads: image i's channel k at gy + i * image + k * channel, its
// positions [0, valid) (vectors past them read as 0: masked loads, so gy may be read in place).
struct GradRows {
  const float* gy;
  int64_t image, channel, valid;
};

// Weight gradient of output channels [k, k + KB) and input channels [c, c + CB), all T taps, over
// a group of gn images, flat positions [0, Lw) (a whole number of vectors): gy as `g` says, xp [gn][image]
// input planes (tap t of channel c of image i at xp + i * image + c * plane + off[t]). part:
// [K][C][T][16] per lane partial sums, loaded and stored back.
template <int KB, int CB, int T>
void weight_grad_block(const GradRows& g, const float* xp, const int64_t* off, float* part, int64_t gn, int64_t Lw,
                       int64_t image, int64_t plane, int64_t C, int64_t k, int64_t c) {
  __m512 acc[KB][CB * T];
#pragma GCC unroll 4
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 9
    for (int u = 0; u < CB * T; ++u) acc[j][u] = _mm512_loadu_ps(part + (((k + j) * C + c) * T + u) * 16);
  }
  // A 3x3's vectors wholly below g.valid with plain loads, the rest masked (a 1x1's block, with a
  // third of the multiply-adds a step, measured faster with every vector masked).
  const int64_t full = T > 1 ? std::min(Lw, g.valid / 16 * 16) : 0;
  for (int64_t i = 0; i < gn; ++i) {
    const float* gi = g.gy + i * g.image + k * g.channel;
    const float* xi = xp + i * image + c * plane;
    const auto step = [&](int64_t j0, __mmask16 m) {
      __m512 gv[KB];
#pragma GCC unroll 4
      for (int j = 0; j < KB; ++j) gv[j] = _mm512_maskz_loadu_ps(m, gi + j * g.channel + j0);
#pragma GCC unroll 9
      for (int u = 0; u < CB * T; ++u) {
        const __m512 xv = simd::in_register(_mm512_loadu_ps(xi + (u / T) * plane + off[u % T] + j0));
#pragma GCC unroll 4
        for (int j = 0; j < KB; ++j) acc[j][u] = _mm512_fmadd_ps(gv[j], xv, acc[j][u]);
      }
    };
    for (int64_t j0 = 0; j0 < full; j0 += 16) step(j0, __mmask16(0xFFFF));
    for (int64_t j0 = full; j0 < Lw; j0 += 16) step(j0, simd::lane_mask(g.valid - j0));
  }
#pragma GCC unroll 4
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 9
    for (int u = 0; u < CB * T; ++u) _mm512_storeu_ps(part + (((k + j) * C + c) * T + u) * 16, acc[j][u]);
  }
}

// Every (k, c) pair of the group: blocks of KB x CB, then the remainders one at a time.
template <int KB, int CB, int T>
void weight_grad_group(const GradRows& g, const float* xp, const int64_t* off, float* part, int64_t gn, int64_t Lw,
                       int64_t image, int64_t plane, int64_t C, int64_t K) {
  const int64_t kb_end = K / KB * KB, cb_end = C / CB * CB;
  for (int64_t c = 0; c < C;) {
    const bool c_block = c < cb_end;
    for (int64_t k = 0; k < K;) {
      const bool k_block = k < kb_end;
      if (k_block && c_block) {
        weight_grad_block<KB, CB, T>(g, xp, off, part, gn, Lw, image, plane, C, k, c);
      } else if (k_block) {
        weight_grad_block<KB, 1, T>(g, xp, off, part, gn, Lw, image, plane, C, k, c);
      } else if (c_block) {
        weight_grad_block<1, CB, T>(g, xp, off, part, gn, Lw, image, plane, C, k, c);
      } else {
        weight_grad_block<1, 1, T>(g, xp, off, part, gn, Lw, image, plane, C, k, c);
      }
      k += k_block ? KB : 1;
    }
    c += c_block ? CB : 1;
  }
}

// Images a weight-gradient group: enough that the accumulators' load and store are amortised on
// small maps (at least 512 positions), few enough that the group's input stays in the L2 cache.
int64_t group_images(int64_t Lw, int64_t image_floats, int64_t n) {
  const int64_t by_cache = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, image_floats));
  return std::clamp<int64_t>(std::max<int64_t>(512 / Lw, 1), 1, std::max<int64_t>(1, std::min(n, by_cache)));
}

// The projections' weight gradient: the gathered even pixels of a group of images ([gn][C][ld],
// 0 from L to ld) against gy read in place.
void projection_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                            const StridedConvShape& g) {
  const int64_t L = g.P * g.Q, ld = round_up(L, 16), image = g.C * ld;
  const int64_t G = group_images(ld, image, n1 - n0);
  thread_local std::vector<float> xs_buf, part_buf;
  float* xs = zeroed(xs_buf, G * image);
  float* part = zeroed(part_buf, g.K * g.C * 16);
  const int64_t off[1] = {0};
  for (int64_t n = n0; n < n1; n += G) {
    const int64_t gn = std::min(G, n1 - n);
    for (int64_t i = 0; i < gn; ++i) gather_even_pixels(x + (n + i) * g.C * g.H * g.W, g, xs + i * image, ld);
    const GradRows rows{gy + n * g.K * L, g.K * L, L, L};
    weight_grad_group<4, 4, 1>(rows, xs, off, part, gn, ld, image, ld, g.C, g.K);
  }
  for (int64_t i = 0; i < g.K * g.C; ++i) dw[i] += simd::hsum(_mm512_loadu_ps(part + i * 16));
}

}  // namespace

void conv_strided_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                              const StridedConvShape& g) {
  if (plain_projection(g)) return projection_weight_grad(gy, x, dw, n0, n1, g);
  // A 3x3 (the only other kernel supported): its planes of pitch Q against gy read in place.
  const Phases ph(g);
  const int64_t PQ = g.P * g.Q, Lw = round_up(PQ, 16);
  const int64_t image = ph.image_floats(g) + Lw + 64;  // reads past the planes stay in the image's slack
  const int64_t G = group_images(Lw, image + g.K * Lw, n1 - n0);
  thread_local std::vector<float> xp_buf, part_buf;
  float* xp = zeroed(xp_buf, G * image);  // borders and slack stay 0
  float* part = zeroed(part_buf, g.K * g.C * ph.T * 16);
  for (int64_t n = n0; n < n1; n += G) {
    const int64_t gn = std::min(G, n1 - n);
    for (int64_t i = 0; i < gn; ++i) ph.fill(x + (n + i) * g.C * g.H * g.W, g, xp + i * image);
    const GradRows rows{gy + n * g.K * PQ, g.K * PQ, PQ, PQ};
    weight_grad_group<3, 1, 9>(rows, xp, ph.off.data(), part, gn, Lw, image, ph.plane, g.C, g.K);
  }
  for (int64_t i = 0; i < g.K * g.C * ph.T; ++i) dw[i] += simd::hsum(_mm512_loadu_ps(part + i * 16));
}

#else  // no AVX-512: the im2col + GEMM path is used instead

bool conv_strided_supported(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
void conv_strided_forward(const float*, const float*, const float*, float*, int64_t, int64_t,
                          const StridedConvShape&) {}
void conv_strided_input_grad(const float*, const float*, float*, int64_t, int64_t, const StridedConvShape&) {}
void conv_strided_weight_grad(const float*, const float*, float*, int64_t, int64_t, const StridedConvShape&) {}

#endif

}  // namespace tandem::kernels::cpu::detail
