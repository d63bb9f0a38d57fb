// Direct convolutions with stride 2 (kernels/cpu/conv_strided.h): the forward and the input gradient (the
// weight gradient: conv_strided_wgrad.cpp; the input side's layouts: conv_strided_layout.h). Layout
// (forward and weight gradient): the zero-padded input is split into planes of pitch Q, plane (a, b, d)
// holding padded pixel (2 i + a, 2 (j + d) + b) at (i, j) for i < Hf = P + (R - 1) / 2 and j < Q; output
// (p, q) is flat position p * Q + q and reads tap (r, s) at that position plus (r / 2) * Q in plane (r %
// 2, s % 2, s / 2). With the output's own pitch, y is written and gy read in place (no dead columns
// between rows). Splitting a source row into its planes is one permute of two loads a plane. Forward: per
// block of 8 output channels and 32 positions, 16 accumulators take, for every input channel and tap, 2
// input vectors and 8 broadcast weights (taps_block, kernels/cpu/conv_taps.h, with a table of tap
// offsets). Weight gradient: per block of output and input channels (3 x 1 for 3x3, 4 x 4 for 1x1), per
// lane accumulators over the output gradient (its last vector masked), each input vector held in a
// register for the block's output channels (simd::in_register). Input gradient: per phase (a, b) of the
// padded input, the taps of that phase read the output gradient, copied into a zero border of (R - 1) / 2
// rows and (S - 1) / 2 columns, at fixed offsets (the same forward kernel with the output and input
// channels swapped); the phases' rows are then interleaved into the image's rows (one permute per 16 pixel
// pairs). The 1x1 projections without padding skip the phases: the forward and the weight gradient gather
// the even pixels of the even rows (one permute a row), and the input gradient is W^T gy scattered to
// those pixels, gy read in place. Where a map's P Q leaves lanes idle (the 16->32 projection's 7 x 7), the
// forward and the weight gradient lay a group of images end to end (flat_gemm, and a copy of gy for the
// weight gradient). Projections whose channels fit one or two vectors take channels in the lanes instead
// (kernels/cpu/conv_projection_lanes.h: the ResNet's forwards and the 16->32 input gradient; the weight
// gradient of 16 or 32 input channels: conv_strided_wgrad.cpp).
#include "kernels/cpu/conv_strided.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv3x3.h"
#include "kernels/cpu/conv_projection_lanes.h"
#include "kernels/cpu/conv_strided_layout.h"
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

// packed[k0 * Cin * T + (c * T + t) * kb + j] = weight(k0 + j, c, t), in blocks of `block` output
// channels (taps_conv's kBlock, flat_gemm's kFlatRows), then single ones.
template <typename F>
std::vector<float> pack_weights(int64_t Cin, int64_t Cout, int T, F weight, int64_t block = kBlock) {
  std::vector<float> packed(static_cast<size_t>(Cout * Cin * T));
  for (int64_t k0 = 0; k0 < Cout;) {
    const int64_t kb = k0 + block <= Cout ? block : 1;
    for (int64_t c = 0; c < Cin; ++c)
      for (int t = 0; t < T; ++t)
        for (int64_t j = 0; j < kb; ++j) packed[k0 * Cin * T + (c * T + t) * kb + j] = weight(k0 + j, c, t);
    k0 += kb;
  }
  return packed;
}

inline int64_t floor_div2(int64_t v) { return v >= 0 ? v / 2 : -((1 - v) / 2); }

// ---- The projections as one small GEMM over a group of images ----
// Out[k][f] = b[k] + sum_c W[k][c] In[c][f] over flat positions f of G images laid end to end (image i's
// position pos at f = i * PQ + pos), so that a map whose P Q is not a whole number of vectors (the
// 16->32 projection's 49) fills every lane but the group's last vector (49 of 64 a map otherwise).
// Blocks of kFlatRows output rows by NV vectors, 24 accumulators: a step per input channel is NV loads,
// kFlatRows broadcasts and kFlatRows x NV multiply-adds.
constexpr int kFlatRows = 4, kFlatVectors = 6;

// Where Out goes: row k of image i at base + i * image + k * PQ, its map's positions 0 .. PQ - 1 (y:
// image K P Q).
struct FlatOut {
  float* base;
  int64_t image, PQ;
};

// The flat positions [f0, f0 + 16 NV) of a block: vector v's lanes lie in image first[v] from position
// pos[v] on, and spill into the next image(s) where a map ends inside the vector (split[v]); its lanes at
// or past F read as 0 and are not stored (mask[v]).
template <int NV>
struct FlatSpan {
  int64_t first[NV], pos[NV];
  bool split[NV];
  __mmask16 mask[NV];
  FlatSpan(int64_t f0, int64_t F, int64_t PQ) {
    for (int v = 0; v < NV; ++v) {
      const int64_t f = f0 + 16 * v;
      first[v] = f / PQ, pos[v] = f % PQ;
      split[v] = pos[v] + 16 > PQ || f + 16 > F;
      mask[v] = simd::lane_mask(F - f);
    }
  }
};

// Lanes [0, n) of vector u (flat positions from image i's position pos on) into row k's maps: a piece
// per image it covers, each a masked store.
inline void store_across(const FlatOut& o, int64_t k, int64_t i, int64_t pos, __m512 u, int64_t n) {
  for (int64_t done = 0; done < n; pos = 0, ++i) {
    const int64_t here = std::min(n - done, o.PQ - pos);
    const __mmask16 m = simd::lane_mask(done + here) & __mmask16(~simd::lane_mask(done));
    // Lane l lands at the map's position pos - done + l; the masked-off lanes below `done` are not
    // written (their addresses are formed in integers).
    const auto at = reinterpret_cast<uintptr_t>(o.base + i * o.image + k * o.PQ + pos) -
                    uintptr_t(done * int64_t(sizeof(float)));
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(at), m, u);
    done += here;
  }
}

// Rows [k0, k0 + KB) at flat vectors [f0, f0 + 16 NV): in: [C][ld] flat (read below F only), wk: the
// rows' packed weights [C][KB], b: the biases or null.
template <int KB, int NV>
void flat_block(const float* in, int64_t ld, const float* wk, const float* b, int64_t C, const FlatOut& o,
                int64_t F, int64_t k0, int64_t f0, const FlatSpan<NV>& span) {
  __m512 acc[KB][NV];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[j][v] = b ? _mm512_set1_ps(b[k0 + j]) : _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < C; ++c) {
    __m512 xv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      xv[v] = simd::in_register(_mm512_maskz_loadu_ps(span.mask[v], in + c * ld + f0 + 16 * v));
    }
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j) {
      const __m512 wv = _mm512_set1_ps(wk[c * KB + j]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_fmadd_ps(wv, xv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if (!span.split[v]) {
        _mm512_storeu_ps(o.base + span.first[v] * o.image + (k0 + j) * o.PQ + span.pos[v], acc[j][v]);
      } else {
        store_across(o, k0 + j, span.first[v], span.pos[v], acc[j][v], std::min<int64_t>(16, F - f0 - 16 * v));
      }
    }
  }
}

// Every row of Out over the F flat positions: position blocks outermost (their inputs stay in the L1
// cache across the row blocks), kFlatVectors vectors a block, the last block shorter.
void flat_gemm(const float* in, int64_t ld, const float* packed, const float* b, int64_t C, int64_t K,
               const FlatOut& o, int64_t F) {
  const auto rows = [&](auto nv_tag, int64_t f0) {
    constexpr int NV = decltype(nv_tag)::value;
    const FlatSpan<NV> span(f0, F, o.PQ);
    int64_t k0 = 0;
    for (; k0 + kFlatRows <= K; k0 += kFlatRows) {
      flat_block<kFlatRows, NV>(in, ld, packed + k0 * C, b, C, o, F, k0, f0, span);
    }
    for (; k0 < K; ++k0) flat_block<1, NV>(in, ld, packed + k0 * C, b, C, o, F, k0, f0, span);
  };
  const int64_t vectors = (F + 15) / 16;
  int64_t v0 = 0;
  for (; v0 + kFlatVectors <= vectors; v0 += kFlatVectors) rows(std::integral_constant<int, kFlatVectors>{}, 16 * v0);
  switch (vectors - v0) {
    case 5: return rows(std::integral_constant<int, 5>{}, 16 * v0);
    case 4: return rows(std::integral_constant<int, 4>{}, 16 * v0);
    case 3: return rows(std::integral_constant<int, 3>{}, 16 * v0);
    case 2: return rows(std::integral_constant<int, 2>{}, 16 * v0);
    case 1: return rows(std::integral_constant<int, 1>{}, 16 * v0);
    default: return;
  }
}

void projection_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                        const StridedConvShape& g) {
  const int64_t PQ = g.P * g.Q, G = flat_group(PQ, g.C, n1 - n0), ld = round_up(G * PQ, 16);
  const std::vector<float> packed =
      pack_weights(g.C, g.K, 1, [&](int64_t k, int64_t c, int) { return w[k * g.C + c]; }, kFlatRows);
  thread_local std::vector<float> xs_buf;
  float* xs = zeroed(xs_buf, g.C * ld);
  for (int64_t n = n0; n < n1; n += G) {
    const int64_t gn = std::min(G, n1 - n);
    for (int64_t i = 0; i < gn; ++i) gather_even_pixels(x + (n + i) * g.C * g.H * g.W, g, xs + i * PQ, ld);
    flat_gemm(xs, ld, packed.data(), b, g.C, g.K, FlatOut{y + n * g.K * PQ, g.K * PQ, PQ}, gn * PQ);
  }
}

// ---- The projections' input gradient, read straight from gy ----
// Output (p, q) reads input pixel (2 p, 2 q) alone, so the input gradient is the product
// W^T gy [C][P Q] scattered to the even pixels of the even rows (everything else 0), and the
// weight gradient (conv_strided_wgrad.cpp) the products of gy with those pixels. Neither needs the
// phase planes, gy's bordered copies or the three empty phases of the general path.

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

// prod[c * ld + pos] = sum_k w[k][c] gy[k][pos], every input channel c of one image's W^T gy (gyn).
void projection_product(const float* gyn, const float* w, const StridedConvShape& g, float* prod, int64_t ld) {
  const int64_t L = g.P * g.Q;
  int64_t c = 0;
  for (; c + kBlock <= g.C; c += kBlock) projection_transposed<kBlock>(gyn, L, w, g.C, g.K, c, prod, ld);
  for (; c < g.C; ++c) projection_transposed<1>(gyn, L, w, g.C, g.K, c, prod, ld);
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
    projection_product(gyn, w, g, prod, ld);
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

// gx += the projection's input gradient: the product W^T gy added to the even pixels of the even rows in
// place (a row at most 32 wide: its even columns' values expanded by one zero-masking permute a vector and
// added to the row's vectors; wider, element by element), nothing else read or written.
}  // namespace

void conv_strided_projection_input_grad_add(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                                            const StridedConvShape& g) {
  if (projection_lanes_input_grad_supported(g)) return projection_lanes_input_grad(gy, w, gx, n0, n1, g, true);
  const int64_t L = g.P * g.Q, ld = round_up(L, 32) + 16, HW = g.H * g.W, W = g.W;
  thread_local std::vector<float> prod_buf;
  float* prod = zeroed(prod_buf, g.C * ld);  // [C][ld]: slack read by the expanding loads
  const bool narrow = W <= 32;
  __m512i idx[2] = {};
  __mmask16 keep[2] = {};
  for (int u = 0; u < 2; ++u) {
    alignas(64) int32_t t[16] = {};
    for (int l = 0; l < 16; ++l) {
      const int64_t col = 16 * u + l;
      if (col < W && col % 2 == 0) t[l] = int32_t(col / 2), keep[u] |= __mmask16(1u << l);
    }
    idx[u] = _mm512_load_si512(t);
  }
  for (int64_t n = n0; n < n1; ++n) {
    const float* gyn = gy + n * g.K * L;
    projection_product(gyn, w, g, prod, ld);
    float* gxn = gx + n * g.C * HW;
    for (int64_t ci = 0; ci < g.C; ++ci) {
      for (int64_t p = 0; p < g.P; ++p) {
        const float* v = prod + ci * ld + p * g.Q;
        float* row = gxn + ci * HW + 2 * p * W;
        if (!narrow) {
          for (int64_t q = 0; q < g.Q; ++q) row[2 * q] += v[q];
          continue;
        }
        const __m512 pv = _mm512_loadu_ps(v);  // Q <= 16 values (the slack past them unused)
        for (int u = 0; u < 2 && 16 * u < W; ++u) {
          const __mmask16 m = simd::lane_mask(W - 16 * u);
          const __m512 r = _mm512_maskz_loadu_ps(m, row + 16 * u);
          _mm512_mask_storeu_ps(row + 16 * u, m, _mm512_add_ps(r, _mm512_maskz_permutexvar_ps(keep[u], idx[u], pv)));
        }
      }
    }
  }
}

namespace {

// The forward from the phase planes (a 3x3, or a projection of flat_group 1 from its one plane); with w1
// the pair's projection too (conv_strided_pair_forward), from the plane of the 3x3's tap (1, 1).
void planes_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                    const StridedConvShape& g, const float* w1 = nullptr, float* y1 = nullptr, int64_t K1 = 0) {
  const Phases ph(g);
  const int64_t Lr = round_up(ph.L, 32), PQ = g.P * g.Q;
  const std::vector<float> packed =
      pack_weights(g.C, g.K, ph.T, [&](int64_t k, int64_t c, int t) { return w[(k * g.C + c) * ph.T + t]; });
  const std::vector<float> packed1 =
      w1 ? pack_weights(g.C, K1, 1, [&](int64_t k, int64_t c, int) { return w1[k * g.C + c]; }) : std::vector<float>();
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
    // Tap (1, 1) of a 3x3 with padding 1 reads pixel (2 p, 2 q): the projection's input.
    if (w1) taps_conv(xp, &ph.off[4], 1, packed1.data(), nullptr, y1 + n * K1 * PQ, PQ, g.C, K1, ph.plane, PQ);
  }
}

}  // namespace

void conv_strided_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                          const StridedConvShape& g) {
  if (projection_lanes_forward_supported(g)) return projection_lanes_forward(x, w, b, y, n0, n1, g);
  if (plain_projection(g) && flat_group(g.P * g.Q, g.C, n1 - n0) > 1) {
    return projection_forward(x, w, b, y, n0, n1, g);
  }
  planes_forward(x, w, b, y, n0, n1, g);
}

bool conv_strided_pair_supported(const StridedConvShape& g, int64_t K1) {
  return g.R == 3 && g.S == 3 && g.pad_h == 1 && g.pad_w == 1 &&
         conv_strided_supported(g.C, g.K, 3, 3, 2, 2, 1, 1) && conv_strided_supported(g.C, K1, 1, 1, 2, 2, 0, 0);
}

void conv_strided_pair_forward(const float* x, const float* w3, const float* w1, float* y3, float* y1, int64_t n0,
                               int64_t n1, const StridedConvShape& g, int64_t K1) {
  planes_forward(x, w3, nullptr, y3, n0, n1, g, w1, y1, K1);
}

namespace {

// The input gradient through the four phases of the padded input; with gy1 the pair's projection too
// (conv_strided_pair_input_grad): its K1 channels of gy after the 3x3's in the bordered copy, read by phase
// (1, 1), the even pixels, as more inputs of its one tap.
void phases_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1, const StridedConvShape& g,
                       const float* gy1 = nullptr, const float* w1 = nullptr, int64_t K1 = 0) {
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
    int64_t Cin = 0;  // gy channels read: K, or K + K1 for the pair's phase (1, 1)
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
    const bool with_projection = gy1 && a == 1 && b == 1;  // tap (1, 1) alone: pixel (2 p, 2 q)
    f.Cin = with_projection ? g.K + K1 : g.K;
    f.packed = pack_weights(f.Cin, g.C, f.T, [&](int64_t c, int64_t k, int t) {
      return k < g.K ? w[(k * g.C + c) * g.R * g.S + tap[t]] : w1[(k - g.K) * g.C + c];
    });
  }
  int64_t Lr_max = 0;
  for (const Phase& f : phases) Lr_max = std::max(Lr_max, f.Lr);
  thread_local std::vector<float> gyb_buf;
  float* gyb = zeroed(gyb_buf, (g.K + K1) * plane + Lr_max + Wg + 64);  // borders stay 0

  for (int64_t n = n0; n < n1; ++n) {
    const float* gyn = gy + n * g.K * PQ;
    for (int64_t k = 0; k < g.K; ++k) copy_rows(gyn + k * PQ, g.P, g.Q, gyb + k * plane + tr * Wg + ts, Wg);
    for (int64_t k = 0; k < K1; ++k) {
      copy_rows(gy1 + (n * K1 + k) * PQ, g.P, g.Q, gyb + (g.K + k) * plane + tr * Wg + ts, Wg);
    }
    for (Phase& f : phases) {
      if (f.T > 0) taps_conv(gyb, f.off.data(), f.T, f.packed.data(), nullptr, f.out.data(), f.Lr, f.Cin, g.C, plane,
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

}  // namespace

void conv_strided_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                             const StridedConvShape& g) {
  if (projection_lanes_input_grad_supported(g)) return projection_lanes_input_grad(gy, w, gx, n0, n1, g, false);
  if (plain_projection(g)) return projection_input_grad(gy, w, gx, n0, n1, g);
  phases_input_grad(gy, w, gx, n0, n1, g);
}

void conv_strided_pair_input_grad(const float* gy3, const float* gy1, const float* w3, const float* w1, float* gx,
                                  int64_t n0, int64_t n1, const StridedConvShape& g, int64_t K1) {
  phases_input_grad(gy3, w3, gx, n0, n1, g, gy1, w1, K1);
}

#else  // no AVX-512: the im2col + GEMM path is used instead

bool conv_strided_supported(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
void conv_strided_forward(const float*, const float*, const float*, float*, int64_t, int64_t,
                          const StridedConvShape&) {}
void conv_strided_input_grad(const float*, const float*, float*, int64_t, int64_t, const StridedConvShape&) {}
bool conv_strided_pair_supported(const StridedConvShape&, int64_t) { return false; }
void conv_strided_projection_input_grad_add(const float*, const float*, float*, int64_t, int64_t,
                                            const StridedConvShape&) {}
void conv_strided_pair_forward(const float*, const float*, const float*, float*, float*, int64_t, int64_t,
                               const StridedConvShape&, int64_t) {}
void conv_strided_pair_input_grad(const float*, const float*, const float*, const float*, float*, int64_t, int64_t,
                                  const StridedConvShape&, int64_t) {}

#endif

}  // namespace tandem::kernels::cpu::detail
