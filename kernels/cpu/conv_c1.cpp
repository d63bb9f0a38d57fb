// Direct 3x3 convolution of a single-channel image (kernels/cpu/conv_c1.h).
// Forward: per block of 16 output positions, the 9 shifted input vectors are
// loaded once and reused by every output channel, 8 channels at a time (8
// independent FMA chains hide the FMA latency). Weight gradient: per pair of
// output channels, 9 + 1 vector accumulators each run over all images and
// positions of the range, then are reduced once. Without padding the blocks are
// 16 columns of one output row (row tails masked); with padding 1 the output has
// the image's size and the blocks are 16 consecutive positions of the flat image,
// spanning row ends: each tap's lanes that would read the border (row -1 or H,
// column -1 or W) are masked off and read as 0, so nothing is copied into a
// bordered buffer and every lane is stored straight into y. Masked loads and
// stores (kernels/cpu/simd.h) touch nothing outside the given images. The output may be
// stored in bf16 and the output gradient read from bf16 (autocast's f32 route, kernels/amp.h).
// AVX-512 only; other levels have stubs (conv_c1_supported() is false).
#include "kernels/cpu/conv_c1.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cpu/conv_taps.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

bool conv_c1_supported(int64_t C, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w) {
  return C == 1 && R == 3 && S == 3 && stride_h == 1 && stride_w == 1 && pad_h == pad_w && (pad_h == 0 || pad_h == 1);
}

using simd::lane_mask;

namespace {

// The 9 tap vectors t (shared by every channel) times w's channels [k, k + KB), plus b, to out
// (channel stride `plane`): KB independent multiply-add chains.
template <int KB, typename Out>
inline void forward_channels(const __m512 (&t)[9], const float* w, const float* b, Out* out, int64_t plane,
                             int64_t lanes, int64_t k) {
  __m512 acc[KB];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) acc[j] = b ? _mm512_set1_ps(b[k + j]) : _mm512_setzero_ps();
#pragma GCC unroll 9
  for (int i = 0; i < 9; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j) acc[j] = _mm512_fmadd_ps(t[i], _mm512_set1_ps(w[(k + j) * 9 + i]), acc[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) simd::store_first(out + (k + j) * plane, acc[j], lanes);
}

template <typename Out>
inline void forward_all_channels(const __m512 (&t)[9], const float* w, const float* b, Out* out, int64_t plane,
                                 int64_t lanes, int64_t K) {
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) forward_channels<8>(t, w, b, out, plane, lanes, k);
  for (; k < K; ++k) forward_channels<1>(t, w, b, out, plane, lanes, k);
}

// Calls f(t, o, lanes) for every block of output positions of image xi: t its 9 tap vectors (shared by
// every channel), o its offset in the output map, lanes its width. Without padding (same null) a
// block is 16 columns of one output row, the row's tail masked; with padding 1 (same: its masked
// taps) 16 consecutive positions of the flat map.
template <typename F>
inline void for_each_block(const float* xi, int64_t H, int64_t W, const SameTaps* same, F&& f) {
  if (same) {
    for (int64_t v = 0; v < same->vectors(); ++v) {
      __m512 t[9];
      same->load(xi, v, t);
      f(t, 16 * v, same->lanes(v));
    }
    return;
  }
  const int64_t P = H - 2, Q = W - 2;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t q0 = 0; q0 < Q; q0 += 16) {
      const __mmask16 m = lane_mask(Q - q0);
      __m512 t[9];
#pragma GCC unroll 9
      for (int i = 0; i < 9; ++i) t[i] = _mm512_maskz_loadu_ps(m, xi + (p + i / 3) * W + q0 + i % 3);
      f(t, p * Q + q0, Q - q0);
    }
  }
}

// The padding-1 layout for `pad` (none for padding 0), and the output map's size.
std::optional<SameTaps> same_taps(int64_t pad, int64_t H, int64_t W) {
  return pad == 1 ? std::optional<SameTaps>(std::in_place, H, W) : std::nullopt;
}
int64_t map_size(int64_t pad, int64_t H, int64_t W) { return pad == 1 ? H * W : (H - 2) * (W - 2); }

}  // namespace


template <typename Out>
void conv_c1_forward(const float* x, const float* w, const float* b, Out* y, int64_t n0, int64_t n1, int64_t H,
                     int64_t W, int64_t K, int64_t pad) {
  const std::optional<SameTaps> same = same_taps(pad, H, W);
  const int64_t PQ = map_size(pad, H, W);
  for (int64_t n = n0; n < n1; ++n) {
    Out* yo = y + n * K * PQ;
    for_each_block(x + n * H * W, H, W, same ? &*same : nullptr,
                   [&](const __m512(&t)[9], int64_t o, int64_t lanes) __attribute__((always_inline)) {
                     forward_all_channels(t, w, b, yo + o, PQ, lanes, K);
                   });
  }
}
template void conv_c1_forward<float>(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                     int64_t, int64_t, int64_t);
template void conv_c1_forward<uint16_t>(const float*, const float*, const float*, uint16_t*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t, int64_t);

// Adds one image's contribution for channels k .. k+KB-1 to their 10 vector
// accumulators each (9 taps + bias) kept in `part` ([K][10][16] floats); g is
// the image's gradient of channel k (channel stride PQ), `same` the padding-1
// layout or null for none. KB = 2: 2 x 10 accumulators and 9 shared input
// vectors fill the 32 vector registers. Loops are fully unrolled (constant
// indices) so the accumulators stay in registers.
template <int KB, typename G>
void weight_grad_channels(const G* g, const float* xi, float* part, int64_t H, int64_t W, int64_t k,
                          const SameTaps* same) {
  const int64_t PQ = map_size(same ? 1 : 0, H, W);
  __m512 acc[KB][10];
#pragma GCC unroll 2
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 10
    for (int i = 0; i < 10; ++i) acc[j][i] = _mm512_loadu_ps(part + ((k + j) * 10 + i) * 16);
  }
  // The taps t times gy's `lanes` positions at offset o of each channel.
  const auto add = [&](const __m512(&t)[9], int64_t o, int64_t lanes) __attribute__((always_inline)) {
#pragma GCC unroll 2
    for (int j = 0; j < KB; ++j) {
      const __m512 gv = simd::load_first(g + j * PQ + o, lanes);  // float or bf16 lanes
      acc[j][9] = _mm512_add_ps(acc[j][9], gv);
#pragma GCC unroll 9
      for (int i = 0; i < 9; ++i) acc[j][i] = _mm512_fmadd_ps(gv, t[i], acc[j][i]);
    }
  };
  for_each_block(xi, H, W, same, add);
#pragma GCC unroll 2
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 10
    for (int i = 0; i < 10; ++i) _mm512_storeu_ps(part + ((k + j) * 10 + i) * 16, acc[j][i]);
  }
}

template <typename G>
void weight_grad_image(const G* gy, const float* xi, float* part, int64_t H, int64_t W, int64_t K,
                       const SameTaps* same) {
  const int64_t PQ = map_size(same ? 1 : 0, H, W);
  int64_t k = 0;
  for (; k + 2 <= K; k += 2) weight_grad_channels<2, G>(gy + k * PQ, xi, part, H, W, k, same);
  for (; k < K; ++k) weight_grad_channels<1, G>(gy + k * PQ, xi, part, H, W, k, same);
}

int64_t conv_c1_part_size(int64_t K) { return K * 10 * 16; }

template <typename G>
void conv_c1_weight_grad_image(const G* gy, const float* xi, float* part, int64_t H, int64_t W, int64_t K) {
  weight_grad_image(gy, xi, part, H, W, K, nullptr);
}
template void conv_c1_weight_grad_image<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);

void conv_c1_weight_grad_finish(const float* part, float* dw, float* db, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    const float* a = part + k * 10 * 16;
    if (dw) {
      for (int i = 0; i < 9; ++i) dw[k * 9 + i] += simd::hsum(_mm512_loadu_ps(a + i * 16));
    }
    if (db) db[k] += simd::hsum(_mm512_loadu_ps(a + 9 * 16));
  }
}

template <typename G>
void conv_c1_weight_grad(const G* gy, const float* x, float* dw, float* db, int64_t n0, int64_t n1, int64_t H,
                         int64_t W, int64_t K, int64_t pad) {
  // Images outer, so gy and x are read once, in address order.
  std::vector<float> part(static_cast<size_t>(conv_c1_part_size(K)), 0.0f);
  const std::optional<SameTaps> same = same_taps(pad, H, W);
  const int64_t image = K * map_size(pad, H, W);
  for (int64_t n = n0; n < n1; ++n) {
    weight_grad_image(gy + n * image, x + n * H * W, part.data(), H, W, K, same ? &*same : nullptr);
  }
  conv_c1_weight_grad_finish(part.data(), dw, db, K);
}
template void conv_c1_weight_grad<float>(const float*, const float*, float*, float*, int64_t, int64_t, int64_t,
                                         int64_t, int64_t, int64_t);
template void conv_c1_weight_grad<uint16_t>(const uint16_t*, const float*, float*, float*, int64_t, int64_t,
                                            int64_t, int64_t, int64_t, int64_t);

#else  // no AVX-512: the im2col + GEMM path is used instead

bool conv_c1_supported(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
int64_t conv_c1_part_size(int64_t) { return 0; }
template <typename G>
void conv_c1_weight_grad_image(const G*, const float*, float*, int64_t, int64_t, int64_t) {}
template void conv_c1_weight_grad_image<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);
void conv_c1_weight_grad_finish(const float*, float*, float*, int64_t) {}
template <typename Out>
void conv_c1_forward(const float*, const float*, const float*, Out*, int64_t, int64_t, int64_t, int64_t, int64_t,
                     int64_t) {}
template <typename G>
void conv_c1_weight_grad(const G*, const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t) {}
template void conv_c1_forward<float>(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                     int64_t, int64_t, int64_t);
template void conv_c1_forward<uint16_t>(const float*, const float*, const float*, uint16_t*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t, int64_t);
template void conv_c1_weight_grad<float>(const float*, const float*, float*, float*, int64_t, int64_t, int64_t,
                                         int64_t, int64_t, int64_t);
template void conv_c1_weight_grad<uint16_t>(const uint16_t*, const float*, float*, float*, int64_t, int64_t,
                                            int64_t, int64_t, int64_t, int64_t);

#endif

}  // namespace tandem::kernels::cpu::detail
