// AVX-512 single-precision GEMM for narrow Linear products (kernels/cpu/small_gemm.h); other
// levels (kernels/cpu/simd.h) have stubs (the pack's too) that small_gemm_available() keeps unused.
// Assumes: the caller checked small_gemm_available(); B was packed by pack_b_transposed or is a row-major matrix
// read in place (BOperand); its last vector of a panel is a masked load, so nothing past column J is read.
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

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

// Per panel, groups of 16 columns (16 source rows) x 16 k: a 16 x 16 tile transposed in registers; the
// columns past J of the last panel are loaded as zero rows (its padding), a short k tile by masked loads.
void pack_b_transposed(const float* src, int64_t ld, int64_t K, int64_t J, float* dst, int64_t k0, int64_t k1) {
  for (int64_t j0 = 0; j0 < J; j0 += kPanel) {
    float* panel = dst + j0 * K;
    for (int64_t g = 0; g < kPanel; g += 16) {
      const int64_t rows = std::clamp<int64_t>(J - j0 - g, 0, 16);
      const float* s = src + (j0 + g) * ld;
      for (int64_t k = k0; k < k1; k += 16) {
        const int64_t m = std::min<int64_t>(16, k1 - k);
        __m512 r[16];
        for (int64_t i = 0; i < 16; ++i) r[i] = i < rows ? simd::load_first(s + i * ld + k, m) : _mm512_setzero_ps();
        simd::transpose16(r);
        for (int64_t t = 0; t < m; ++t) _mm512_storeu_ps(panel + (k + t) * kPanel + g, r[t]);
      }
    }
  }
}

bool small_gemm_available() { return true; }

namespace {

constexpr int kRows = 6;
constexpr int64_t kKc = 512;  // k block: a 512 x 64 B panel is 128 KiB (L2)

using Micro = void (*)(int64_t kc, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t ldb,
                       float* c, int64_t ldc, __mmask16 tail, bool load_c);

template <int R, int NV>
void micro(int64_t kc, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t ldb, float* c,
           int64_t ldc, __mmask16 tail, bool load_c) {
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
    for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, b + k * ldb + v * 16) : _mm512_loadu_ps(b + k * ldb + v * 16);
    }
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
                const BOperand& b, float* c, int64_t ldc) {
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
      const float* panel = b.from_column(j0).p + k0 * b.ld;
      const Micro full = micro_for(kRows, nv);
      for (int64_t m = m0; m < m1; m += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m1 - m));
        const Micro fn = rows == kRows ? full : micro_for(rows, nv);
        fn(kc, a + m * a_rs + k0 * a_ks, a_rs, a_ks, panel, b.ld, c + m * ldc + j0, ldc, tail, k0 > 0);
      }
    }
  }
}

#else

bool small_gemm_available() { return false; }

void pack_b_transposed(const float*, int64_t, int64_t, int64_t, float*, int64_t, int64_t) {
  TANDEM_FAIL("pack_b_transposed: this build has no AVX-512 (check small_gemm_available() first)");
}

void small_gemm(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const BOperand&, float*,
                int64_t) {
  TANDEM_FAIL("small_gemm: this build has no AVX-512 (check small_gemm_available() first)");
}

#endif

}  // namespace tandem::kernels::cpu::detail
