// AVX-512 single-precision GEMM for narrow Linear products (kernels/cpu/small_gemm.h); other
// levels (kernels/cpu/simd.h) have a stub that small_gemm_available() keeps unused.
// Assumes: the caller checked small_gemm_available(); B was packed by pack_b_*.
// Guarantees: each C element is one FMA chain over k = 0..K-1 in order (K is cut into blocks of
// kKc, carried through C between blocks, which does not change the chain), so results are the
// same for every thread count and every split of [m0, m1). Register tile: 6 rows x 64 columns
// (24 zmm accumulators + 4 for B + 1 broadcast of the 32 registers).
#include "kernels/cpu/small_gemm.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

void pack_b_rows(const float* src, int64_t ld, int64_t K, int64_t J, float* dst) {
  for (int64_t j0 = 0; j0 < J; j0 += kPanel) {
    const int64_t jw = std::min(kPanel, J - j0);
    float* panel = dst + j0 * K;
    for (int64_t k = 0; k < K; ++k) {
      std::memcpy(panel + k * kPanel, src + k * ld + j0, sizeof(float) * jw);
      if (jw < kPanel) std::memset(panel + k * kPanel + jw, 0, sizeof(float) * (kPanel - jw));
    }
  }
}

void pack_b_transposed(const float* src, int64_t ld, int64_t K, int64_t J, float* dst) {
  for (int64_t j0 = 0; j0 < J; j0 += kPanel) {
    const int64_t jw = std::min(kPanel, J - j0);
    float* panel = dst + j0 * K;
    if (jw < kPanel) std::memset(panel, 0, sizeof(float) * kPanel * K);
    // Blocks of 16 source rows x 64 k: reads stay in a few cache lines per row.
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
      const int64_t k1 = std::min(K, k0 + 64);
      for (int64_t jj = 0; jj < jw; ++jj) {
        const float* s = src + (j0 + jj) * ld;
        for (int64_t k = k0; k < k1; ++k) panel[k * kPanel + jj] = s[k];
      }
    }
  }
}

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

bool small_gemm_available() { return true; }

namespace {

constexpr int kRows = 6;
constexpr int64_t kKc = 512;  // k block: a 512 x 64 B panel is 128 KiB (L2)

using Micro = void (*)(int64_t kc, const float* a, int64_t a_rs, int64_t a_ks, const float* b, float* c,
                       int64_t ldc, __mmask16 tail, bool load_c);

template <int R, int NV>
void micro(int64_t kc, const float* a, int64_t a_rs, int64_t a_ks, const float* b, float* c, int64_t ldc,
           __mmask16 tail, bool load_c) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? tail : __mmask16(0xFFFF);
      acc[r][v] = load_c ? _mm512_maskz_loadu_ps(m, c + r * ldc + v * 16) : _mm512_setzero_ps();
    }
  }
  const float* ap[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) ap[r] = a + r * a_rs;
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + k * kPanel + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(ap[r][k * a_ks]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? tail : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + v * 16, m, acc[r][v]);
    }
  }
}

template <int R>
constexpr Micro pick(int nv) {
  return nv == 1 ? &micro<R, 1> : nv == 2 ? &micro<R, 2> : nv == 3 ? &micro<R, 3> : &micro<R, 4>;
}

Micro micro_for(int rows, int nv) {
  switch (rows) {
    case 1: return pick<1>(nv);
    case 2: return pick<2>(nv);
    case 3: return pick<3>(nv);
    case 4: return pick<4>(nv);
    case 5: return pick<5>(nv);
    default: return pick<6>(nv);
  }
}

}  // namespace

void small_gemm(int64_t m0, int64_t m1, int64_t J, int64_t K, const float* a, int64_t a_rs, int64_t a_ks,
                const float* b_packed, float* c, int64_t ldc) {
  if (m1 <= m0 || J <= 0) return;
  if (K == 0) {
    for (int64_t m = m0; m < m1; ++m) std::memset(c + m * ldc, 0, sizeof(float) * J);
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
    for (int64_t j0 = 0; j0 < J; j0 += kPanel) {
      const int64_t jw = std::min(kPanel, J - j0);
      const int nv = static_cast<int>((jw + 15) / 16);
      const int64_t last = jw - (nv - 1) * 16;
      const __mmask16 tail = simd::lane_mask(last);
      const float* panel = b_packed + j0 * K + k0 * kPanel;
      const Micro full = micro_for(kRows, nv);
      for (int64_t m = m0; m < m1; m += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m1 - m));
        const Micro fn = rows == kRows ? full : micro_for(rows, nv);
        fn(kc, a + m * a_rs + k0 * a_ks, a_rs, a_ks, panel, c + m * ldc + j0, ldc, tail, k0 > 0);
      }
    }
  }
}

#else

bool small_gemm_available() { return false; }

void small_gemm(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, float*,
                int64_t) {
  TANDEM_FAIL("small_gemm: this build has no AVX-512 (check small_gemm_available() first)");
}

#endif

}  // namespace tandem::kernels::cpu::detail
