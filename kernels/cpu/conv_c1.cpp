// Direct 3x3 convolution of a single-channel image (kernels/cpu/conv_c1.h).
// Forward: per output row and block of 16 output columns, the 9 shifted input
// vectors are loaded once and reused by every output channel, 8 channels at a
// time (8 independent FMA chains hide the FMA latency). Weight gradient: per
// output channel, 9 + 1 vector accumulators run over all images and rows of
// the range, then are reduced once. Row tails use masked loads and stores
// (kernels/cpu/simd.h), so nothing outside the given images is read or written. The output may be
// stored in bf16 and the output gradient read from bf16 (autocast's f32 route, kernels/amp.h).
// AVX-512 only; other levels have stubs (conv_c1_supported() is false).
#include "kernels/cpu/conv_c1.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

bool conv_c1_supported(int64_t C, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w) {
  return C == 1 && R == 3 && S == 3 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0;
}

using simd::lane_mask;


template <typename Out>
void conv_c1_forward(const float* x, const float* w, const float* b, Out* y, int64_t n0, int64_t n1, int64_t H,
                     int64_t W, int64_t K) {
  const int64_t P = H - 2, Q = W - 2, PQ = P * Q;
  for (int64_t n = n0; n < n1; ++n) {
    const float* xi = x + n * H * W;
    Out* yo = y + n * K * PQ;
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t q0 = 0; q0 < Q; q0 += 16) {
        const __mmask16 m = lane_mask(Q - q0);
        __m512 t[9];
#pragma GCC unroll 9
        for (int i = 0; i < 9; ++i) t[i] = _mm512_maskz_loadu_ps(m, xi + (p + i / 3) * W + q0 + i % 3);
        Out* out = yo + p * Q + q0;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
          __m512 acc[8];
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) acc[j] = b ? _mm512_set1_ps(b[k + j]) : _mm512_setzero_ps();
#pragma GCC unroll 9
          for (int i = 0; i < 9; ++i) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(t[i], _mm512_set1_ps(w[(k + j) * 9 + i]), acc[j]);
          }
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) simd::store_first(out + (k + j) * PQ, acc[j], Q - q0);
        }
        for (; k < K; ++k) {
          __m512 acc = b ? _mm512_set1_ps(b[k]) : _mm512_setzero_ps();
#pragma GCC unroll 9
          for (int i = 0; i < 9; ++i) acc = _mm512_fmadd_ps(t[i], _mm512_set1_ps(w[k * 9 + i]), acc);
          simd::store_first(out + k * PQ, acc, Q - q0);
        }
      }
    }
  }
}
template void conv_c1_forward<float>(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                     int64_t, int64_t);
template void conv_c1_forward<uint16_t>(const float*, const float*, const float*, uint16_t*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t);

// Adds image n's contribution for channels k .. k+KB-1 to their 10 vector
// accumulators each (9 taps + bias) kept in `part` ([K][10][16] floats).
// KB = 2: 2 x 10 accumulators and 9 shared input vectors fill the 32 vector
// registers. Loops are fully unrolled (constant indices) so the accumulators
// stay in registers.
template <int KB, typename G>
void weight_grad_channels(const G* gy, const float* xi, float* part, int64_t n, int64_t H, int64_t W,
                          int64_t K, int64_t k) {
  const int64_t P = H - 2, Q = W - 2, PQ = P * Q;
  __m512 acc[KB][10];
#pragma GCC unroll 2
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 10
    for (int i = 0; i < 10; ++i) acc[j][i] = _mm512_loadu_ps(part + ((k + j) * 10 + i) * 16);
  }
  const G* g = gy + (n * K + k) * PQ;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t q0 = 0; q0 < Q; q0 += 16) {
      const __mmask16 m = lane_mask(Q - q0);
      __m512 t[9];
#pragma GCC unroll 9
      for (int i = 0; i < 9; ++i) t[i] = _mm512_maskz_loadu_ps(m, xi + (p + i / 3) * W + q0 + i % 3);
#pragma GCC unroll 2
      for (int j = 0; j < KB; ++j) {
        const __m512 gv = simd::load_first(g + j * PQ + p * Q + q0, Q - q0);  // float or bf16 lanes
        acc[j][9] = _mm512_add_ps(acc[j][9], gv);
#pragma GCC unroll 9
        for (int i = 0; i < 9; ++i) acc[j][i] = _mm512_fmadd_ps(gv, t[i], acc[j][i]);
      }
    }
  }
#pragma GCC unroll 2
  for (int j = 0; j < KB; ++j) {
#pragma GCC unroll 10
    for (int i = 0; i < 10; ++i) _mm512_storeu_ps(part + ((k + j) * 10 + i) * 16, acc[j][i]);
  }
}

int64_t conv_c1_part_size(int64_t K) { return K * 10 * 16; }

template <typename G>
void conv_c1_weight_grad_image(const G* gy, const float* xi, float* part, int64_t H, int64_t W, int64_t K) {
  int64_t k = 0;
  for (; k + 2 <= K; k += 2) weight_grad_channels<2, G>(gy, xi, part, 0, H, W, K, k);
  for (; k < K; ++k) weight_grad_channels<1, G>(gy, xi, part, 0, H, W, K, k);
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
                         int64_t W, int64_t K) {
  // Images outer, so gy and x are read once, in address order.
  std::vector<float> part(static_cast<size_t>(conv_c1_part_size(K)), 0.0f);
  const int64_t image = K * (H - 2) * (W - 2);
  for (int64_t n = n0; n < n1; ++n) conv_c1_weight_grad_image(gy + n * image, x + n * H * W, part.data(), H, W, K);
  conv_c1_weight_grad_finish(part.data(), dw, db, K);
}
template void conv_c1_weight_grad<float>(const float*, const float*, float*, float*, int64_t, int64_t, int64_t,
                                         int64_t, int64_t);
template void conv_c1_weight_grad<uint16_t>(const uint16_t*, const float*, float*, float*, int64_t, int64_t,
                                            int64_t, int64_t, int64_t);

#else  // no AVX-512: the im2col + GEMM path is used instead

bool conv_c1_supported(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
int64_t conv_c1_part_size(int64_t) { return 0; }
template <typename G>
void conv_c1_weight_grad_image(const G*, const float*, float*, int64_t, int64_t, int64_t) {}
template void conv_c1_weight_grad_image<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);
void conv_c1_weight_grad_finish(const float*, float*, float*, int64_t) {}
template <typename Out>
void conv_c1_forward(const float*, const float*, const float*, Out*, int64_t, int64_t, int64_t, int64_t, int64_t) {}
template <typename G>
void conv_c1_weight_grad(const G*, const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t) {}
template void conv_c1_forward<float>(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                     int64_t, int64_t);
template void conv_c1_forward<uint16_t>(const float*, const float*, const float*, uint16_t*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t);
template void conv_c1_weight_grad<float>(const float*, const float*, float*, float*, int64_t, int64_t, int64_t,
                                         int64_t, int64_t);
template void conv_c1_weight_grad<uint16_t>(const uint16_t*, const float*, float*, float*, int64_t, int64_t,
                                            int64_t, int64_t, int64_t);

#endif

}  // namespace tandem::kernels::cpu::detail
