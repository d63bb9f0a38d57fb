// Direct 3x3 convolution, stride 1, padding 1 (kernels/cpu/conv3x3.h).
// Forward (and the input gradient, the forward with the weights transposed and flipped): the flat
// layout without a border (kernels/cpu/conv_taps.h, SameTaps): output (p, q) is position j = p * W + q
// of the map and reads tap (r, s) at j + (r - 1) * W + s - 1 of each input channel, the lanes that would
// read the border masked off (read as 0, the bits a zero border gives), so vectors span row ends (a 7x7
// map is 4 vectors, 28x28 49 whole ones), the input is read in place and the output stored straight
// into y. Per block of 8 output channels and 32 positions, 16 accumulators take, for every input channel
// and tap, 2 input vectors and 8 broadcast weights (packed [block][C][9][8] first).
// Weight gradient: per image the input is copied into a zero border (one row and column each side, plus
// slack so that full vector loads stay inside the buffer) and read as one flat row, output (p, q) at
// p * (W + 2) + q reading tap (r, s) at that position + r * (W + 2) + s; gy is laid out the same way with
// zeros between rows. Per input channel and three output channels (then a pair, a single), 3 x 9
// accumulators; each of the 9 input vectors is loaded once per step and held in a register for the
// three (simd::in_register: folded into each multiply-add as a memory operand, the unaligned loads had
// bound the loop). Masked loads there (the flat layout's) measured 16% slower: their masks and offsets
// are loads of their own beside 27 multiply-adds a step. AVX-512 only; other levels have stubs.
#include "kernels/cpu/conv3x3.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/conv_taps.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

bool conv3x3_supported(int64_t C, int64_t K, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w,
                       int64_t pad_h, int64_t pad_w) {
  return C <= kConv3x3MaxChannels && K <= kConv3x3MaxChannels && R == 3 && S == 3 && stride_h == 1 &&
         stride_w == 1 && pad_h == 1 && pad_w == 1;
}

namespace {

constexpr int64_t kBlock = 8;  // output channels per block

// Output channels [k0, k0 + KB) of one image xn ([C][H W]; packed weights wk [C][9][KB], biases b or
// null), all positions, stored straight into yk ([KB][H W]): two vectors a block, then one.
template <int KB>
void forward_channels(const SameTaps& taps, const float* xn, const float* wk, const float* b, float* yk, int64_t C,
                      int64_t HW) {
  for (int64_t v0 = 0; v0 < taps.vectors(); v0 += 2) {
    const auto load = [&](int64_t c, int t, int v) { return taps.load(xn + c * HW, v0 + v, t); };
    if (v0 + 2 <= taps.vectors()) {
      taps_block<KB, 2, 9>(load, wk, b, yk, C, HW, HW, 16 * v0);
    } else {
      taps_block<KB, 1, 9>(load, wk, b, yk, C, HW, HW, 16 * v0);
    }
  }
}

}  // namespace

void conv3x3_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1, int64_t C,
                     int64_t H, int64_t W, int64_t K) {
  // Weights per block of output channels: packed[k0 * C * 9 + (c * 9 + t) * KB + j] = w[k0 + j][c][t].
  std::vector<float> packed(static_cast<size_t>(K * C * 9));
  // Blocks of kBlock channels, then single channels (as the loop below computes them).
  for (int64_t k0 = 0; k0 < K;) {
    const int64_t kb = k0 + kBlock <= K ? kBlock : 1;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < 9; ++t)
        for (int64_t j = 0; j < kb; ++j) packed[k0 * C * 9 + (c * 9 + t) * kb + j] = w[((k0 + j) * C + c) * 9 + t];
    k0 += kb;
  }
  const int64_t HW = H * W;
  const SameTaps taps(H, W);
  for (int64_t n = n0; n < n1; ++n) {
    const float* xn = x + n * C * HW;
    float* yn = y + n * K * HW;
    int64_t k0 = 0;
    for (; k0 + kBlock <= K; k0 += kBlock) {
      forward_channels<kBlock>(taps, xn, packed.data() + k0 * C * 9, b ? b + k0 : nullptr, yn + k0 * HW, C, HW);
    }
    for (; k0 < K; ++k0) {
      forward_channels<1>(taps, xn, packed.data() + k0 * C * 9, b ? b + k0 : nullptr, yn + k0 * HW, C, HW);
    }
  }
}

void conv3x3_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1, int64_t C, int64_t H,
                        int64_t W, int64_t K) {
  // The input gradient is the convolution of gy with the weights transposed ([C, K]) and flipped.
  std::vector<float> wt(static_cast<size_t>(C * K * 9));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t t = 0; t < 9; ++t) wt[(c * K + k) * 9 + t] = w[(k * C + c) * 9 + 8 - t];
  conv3x3_forward(gy, wt.data(), nullptr, gx, n0, n1, K, H, W, C);
}

namespace {

// Weight gradient of channels [k, k + KB) and input channel c over a group of gn images, in the
// flat padded layout: output position (p, q) is j = p * (W + 2) + q, where the padded input of
// tap (r, s) is at j + r * (W + 2) + s; gyp holds gy there with zeros at q >= W (so the columns
// between rows add nothing). Image i: gy at gyp + (i * K + k) * L, input channel c at
// xp + (i * C + c) * plane. part: [K][C][9][16] per lane partial sums, loaded and stored back.
template <int KB>
void weight_grad_block(const float* gyp, const float* xp, float* part, int64_t gn, int64_t L, int64_t Wp,
                       int64_t plane, int64_t C, int64_t K, int64_t k, int64_t c) {
  __m512 acc[KB][9];
#pragma GCC unroll 3
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 9
    for (int t = 0; t < 9; ++t) acc[j][t] = _mm512_loadu_ps(part + (((k + j) * C + c) * 9 + t) * 16);
  }
  for (int64_t i = 0; i < gn; ++i) {
    const float* g = gyp + (i * K + k) * L;
    const float* xc = xp + (i * C + c) * plane;
    for (int64_t j0 = 0; j0 < L; j0 += 16) {
      __m512 gv[KB];
#pragma GCC unroll 3
      for (int j = 0; j < KB; ++j) gv[j] = _mm512_loadu_ps(g + j * L + j0);
#pragma GCC unroll 9
      for (int t = 0; t < 9; ++t) {
        const __m512 xv = simd::in_register(_mm512_loadu_ps(xc + j0 + (t / 3) * Wp + t % 3));
#pragma GCC unroll 3
        for (int j = 0; j < KB; ++j) acc[j][t] = _mm512_fmadd_ps(gv[j], xv, acc[j][t]);
      }
    }
  }
#pragma GCC unroll 3
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 9
    for (int t = 0; t < 9; ++t) _mm512_storeu_ps(part + (((k + j) * C + c) * 9 + t) * 16, acc[j][t]);
  }
}

}  // namespace

void conv3x3_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1, int64_t C, int64_t H,
                         int64_t W, int64_t K) {
  const int64_t Wp = W + 2, plane = (H + 2) * Wp, HW = H * W;
  const int64_t L = (H * Wp + 15) / 16 * 16;  // flat output positions, whole vectors
  // Images a group: enough that the accumulators' load and store are amortised on small maps.
  const int64_t G = std::clamp<int64_t>(512 / L, 1, std::max<int64_t>(1, n1 - n0));
  std::vector<float> xp(static_cast<size_t>(G * C * plane + L + 64), 0.0f);  // borders and slack stay 0
  std::vector<float> gyp(static_cast<size_t>(G * K * L), 0.0f);              // columns q >= W stay 0
  std::vector<float> part(static_cast<size_t>(K * C * 9 * 16), 0.0f);
  for (int64_t n = n0; n < n1; n += G) {
    const int64_t gn = std::min(G, n1 - n);
    for (int64_t i = 0; i < gn; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        copy_rows(x + ((n + i) * C + c) * HW, H, W, xp.data() + (i * C + c) * plane + Wp + 1, Wp);
      }
      for (int64_t k = 0; k < K; ++k) copy_rows(gy + ((n + i) * K + k) * HW, H, W, gyp.data() + (i * K + k) * L, Wp);
    }
    for (int64_t c = 0; c < C; ++c) {
      int64_t k = 0;
      for (; k + 3 <= K; k += 3) weight_grad_block<3>(gyp.data(), xp.data(), part.data(), gn, L, Wp, plane, C, K, k, c);
      for (; k + 2 <= K; k += 2) weight_grad_block<2>(gyp.data(), xp.data(), part.data(), gn, L, Wp, plane, C, K, k, c);
      for (; k < K; ++k) weight_grad_block<1>(gyp.data(), xp.data(), part.data(), gn, L, Wp, plane, C, K, k, c);
    }
  }
  for (int64_t i = 0; i < K * C * 9; ++i) dw[i] += simd::hsum(_mm512_loadu_ps(part.data() + i * 16));
}

#else  // no AVX-512: the im2col + GEMM path is used instead

bool conv3x3_supported(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
void conv3x3_forward(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                     int64_t) {}
void conv3x3_input_grad(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {}
void conv3x3_weight_grad(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {}

#endif

}  // namespace tandem::kernels::cpu::detail
