// The weight gradient of the stride-2 direct convolutions (kernels/cpu/conv_strided.h): per block of
// output and input channels (3 x 1 for 3x3, 4 x 4 for 1x1), per lane accumulators over the output
// gradient (its last vector masked), each input vector held in a register for the block's output
// channels (simd::in_register), over groups of images whose input planes (conv_strided_layout.h) stay
// in the L2 cache. The 1x1 projections read their gathered even pixels; where a map's P Q leaves lanes
// idle, a group of images end to end with a copy of gy. Projections of 16 or 32 input channels on maps
// at most 16 wide (the 16->32 projection's 14 x 14) instead lay their even pixels channels last: an
// accumulator per output channel, its lanes the input channels, each gy value broadcast from gy in place;
// those of at most 8 input channels with an even Q (8->16) the same over pairs of positions.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv_strided.h"
#include "kernels/cpu/conv_strided_layout.h"
#include "kernels/cpu/conv_taps.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

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

// The weight gradient of the projections whose even pixels go channels last (even_pixels_channels_last,
// conv_strided_layout.h: 16 or 32 input channels, maps at most 16 wide), one image: dw[k][c] += sum over
// positions of gy[k][pos] xt[pos][c], blocks of 16 / CV output channels, each an accumulator per 16 input
// channels (its lanes the channels, so no per lane partial sums to add up), a step one vector of x a group
// of 16 channels and each output channel's gy value broadcast, gy read in place (simd::axpy_tile).
template <int CV>
void channels_last_image(const float* gyn, const float* xt, int64_t L, int64_t K, float* part) {
  constexpr int KB = 16 / CV;
  constexpr int64_t C = 16 * CV;
  int64_t k = 0;
  for (; k + KB <= K; k += KB) simd::axpy_tile<KB, CV>(gyn + k * L, 1, L, 0, L, xt, C, C, part + k * C, C);
  for (; k < K; ++k) simd::axpy_tile<1, CV>(gyn + k * L, 1, L, 0, L, xt, C, C, part + k * C, C);
}

// Image by image: its channels-last even pixels (a few KiB, in the L1 cache with gy's rows), then its
// products.
void projection_weight_grad_channels_last(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                                          const StridedConvShape& g) {
  const int64_t L = g.P * g.Q;
  thread_local std::vector<float> xt_buf, part_buf;
  if (xt_buf.size() < static_cast<size_t>(L * g.C)) xt_buf.resize(static_cast<size_t>(L * g.C));
  float* xt = xt_buf.data();
  float* part = zeroed(part_buf, g.K * g.C);
  for (int64_t n = n0; n < n1; ++n) {
    gather_even_pixels_channels_last(x + n * g.C * g.H * g.W, g, xt);
    if (g.C == 16) {
      channels_last_image<1>(gy + n * g.K * L, xt, L, g.K, part);
    } else {
      channels_last_image<2>(gy + n * g.K * L, xt, L, g.K, part);
    }
  }
  for (int64_t i = 0; i < g.K * g.C; ++i) dw[i] += part[i];
}

// Projections of at most 8 input channels with an even Q (even_pixel_pairs, conv_strided_layout.h: the
// 8->16 projection): the even pixels in pairs of positions, an accumulator per output channel whose lanes
// are (input channel, position parity), each of gy's pairs one 64-bit broadcast (simd::axpy_tile's
// pairs), image by image; dw[k][c] then adds the two lanes of c.
void projection_weight_grad_pairs(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                                  const StridedConvShape& g) {
  const int64_t L = g.P * g.Q, pairs = L / 2;
  thread_local std::vector<float> xt_buf, part_buf;
  if (xt_buf.size() < static_cast<size_t>(pairs * 16)) xt_buf.resize(static_cast<size_t>(pairs * 16));
  float* xt = xt_buf.data();
  float* part = zeroed(part_buf, g.K * 16);
  for (int64_t n = n0; n < n1; ++n) {
    gather_even_pixel_pairs(x + n * g.C * g.H * g.W, g, xt);
    const float* gyn = gy + n * g.K * L;
    // Output channels k .. k + R - 1 over every pair.
    const auto rows = [&](auto r, int64_t k) {
      simd::axpy_tile<decltype(r)::value, 1, true>(gyn + k * L, 2, L, 0, pairs, xt, 16, 16, part + k * 16, 16);
    };
    int64_t k = 0;
    for (; k + 16 <= g.K; k += 16) rows(std::integral_constant<int, 16>{}, k);
    for (; k + 4 <= g.K; k += 4) rows(std::integral_constant<int, 4>{}, k);
    for (; k < g.K; ++k) rows(std::integral_constant<int, 1>{}, k);
  }
  for (int64_t k = 0; k < g.K; ++k) {
    for (int64_t c = 0; c < g.C; ++c) dw[k * g.C + c] += part[k * 16 + 2 * c] + part[k * 16 + 2 * c + 1];
  }
}

// The projections' weight gradient: the gathered even pixels against gy. Maps whose P Q fills its
// vectors (flat_group 1): a group of images ([gn][C][ld], 0 from L to ld) against gy read in place.
// Others (the 16->32 projection's 49 positions, 64 lanes): flat_group's images end to end, x gathered
// and gy copied into [C][ld] and [K][ld], so every lane but the group's last vector's works.
void projection_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                            const StridedConvShape& g) {
  const int64_t L = g.P * g.Q, flat = flat_group(L, g.C, n1 - n0);
  const int64_t ld = round_up(flat > 1 ? flat * L : L, 16), image = g.C * ld;
  const int64_t G = flat > 1 ? flat : group_images(ld, image, n1 - n0);
  thread_local std::vector<float> xs_buf, gyf_buf, part_buf;
  float* xs = zeroed(xs_buf, flat > 1 ? image : G * image);
  float* gyf = flat > 1 ? zeroed(gyf_buf, g.K * ld) : nullptr;
  float* part = zeroed(part_buf, g.K * g.C * 16);
  const int64_t off[1] = {0};
  for (int64_t n = n0; n < n1; n += G) {
    const int64_t gn = std::min(G, n1 - n);
    if (flat == 1) {
      for (int64_t i = 0; i < gn; ++i) gather_even_pixels(x + (n + i) * g.C * g.H * g.W, g, xs + i * image, ld);
      const GradRows rows{gy + n * g.K * L, g.K * L, L, L};
      weight_grad_group<4, 4, 1>(rows, xs, off, part, gn, ld, image, ld, g.C, g.K);
      continue;
    }
    const int64_t F = gn * L;
    for (int64_t i = 0; i < gn; ++i) {
      gather_even_pixels(x + (n + i) * g.C * g.H * g.W, g, xs + i * L, ld);
      copy_rows(gy + (n + i) * g.K * L, g.K, L, gyf + i * L, ld);
    }
    // A short last group: its tail of x zero (gy's is masked off; a stale x there could be an inf).
    if (gn < G) {
      for (int64_t c = 0; c < g.C; ++c) std::fill(xs + c * ld + F, xs + (c + 1) * ld, 0.0f);
    }
    const GradRows rows{gyf, 0, ld, F};
    weight_grad_group<4, 4, 1>(rows, xs, off, part, 1, round_up(F, 16), 0, ld, g.C, g.K);
  }
  for (int64_t i = 0; i < g.K * g.C; ++i) dw[i] += simd::hsum(_mm512_loadu_ps(part + i * 16));
}

}  // namespace

namespace {

// A 3x3's weight gradient from its planes of pitch Q against gy read in place; with gy1 the pair's
// projection's too (conv_strided_pair_weight_grad), from the plane of the 3x3's tap (1, 1).
void planes_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1, const StridedConvShape& g,
                        const float* gy1 = nullptr, float* dw1 = nullptr, int64_t K1 = 0) {
  const Phases ph(g);
  const int64_t PQ = g.P * g.Q, Lw = round_up(PQ, 16);
  const int64_t image = ph.image_floats(g) + Lw + 64;  // reads past the planes stay in the image's slack
  const int64_t G = group_images(Lw, image + (g.K + K1) * Lw, n1 - n0);
  thread_local std::vector<float> xp_buf, part_buf, part1_buf;
  float* xp = zeroed(xp_buf, G * image);  // borders and slack stay 0
  float* part = zeroed(part_buf, g.K * g.C * ph.T * 16);
  float* part1 = gy1 ? zeroed(part1_buf, K1 * g.C * 16) : nullptr;
  for (int64_t n = n0; n < n1; n += G) {
    const int64_t gn = std::min(G, n1 - n);
    for (int64_t i = 0; i < gn; ++i) ph.fill(x + (n + i) * g.C * g.H * g.W, g, xp + i * image);
    const GradRows rows{gy + n * g.K * PQ, g.K * PQ, PQ, PQ};
    weight_grad_group<3, 1, 9>(rows, xp, ph.off.data(), part, gn, Lw, image, ph.plane, g.C, g.K);
    if (gy1) {
      const GradRows rows1{gy1 + n * K1 * PQ, K1 * PQ, PQ, PQ};
      weight_grad_group<4, 4, 1>(rows1, xp, &ph.off[4], part1, gn, Lw, image, ph.plane, g.C, K1);
    }
  }
  for (int64_t i = 0; i < g.K * g.C * ph.T; ++i) dw[i] += simd::hsum(_mm512_loadu_ps(part + i * 16));
  for (int64_t i = 0; gy1 && i < K1 * g.C; ++i) dw1[i] += simd::hsum(_mm512_loadu_ps(part1 + i * 16));
}

}  // namespace

void conv_strided_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                              const StridedConvShape& g) {
  if (even_pixels_channels_last(g)) return projection_weight_grad_channels_last(gy, x, dw, n0, n1, g);
  if (even_pixel_pairs(g)) return projection_weight_grad_pairs(gy, x, dw, n0, n1, g);
  if (plain_projection(g)) return projection_weight_grad(gy, x, dw, n0, n1, g);
  planes_weight_grad(gy, x, dw, n0, n1, g);  // a 3x3, the only other kernel supported
}

void conv_strided_pair_weight_grad(const float* gy3, const float* gy1, const float* x, float* dw3, float* dw1,
                                   int64_t n0, int64_t n1, const StridedConvShape& g, int64_t K1) {
  planes_weight_grad(gy3, x, dw3, n0, n1, g, gy1, dw1, K1);
}

#else  // no AVX-512: the im2col + GEMM path is used instead

void conv_strided_weight_grad(const float*, const float*, float*, int64_t, int64_t, const StridedConvShape&) {}
void conv_strided_pair_weight_grad(const float*, const float*, const float*, float*, float*, int64_t, int64_t,
                                   const StridedConvShape&, int64_t) {}

#endif

}  // namespace tandem::kernels::cpu::detail
