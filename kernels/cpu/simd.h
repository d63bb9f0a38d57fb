// The one SIMD layer of the CPU kernels (kernels/cpu/*.cpp); internal, not part of the public API.
// Owns: the instruction-set level the kernels are compiled at, decided once here from the
// compiler's macros (TANDEM_SIMD for the preprocessor, kSimdLevel for C++; no kernel tests
// __AVX512F__ or __AVX2__ itself), the <immintrin.h> include, the pieces the vector rows share
// (lane counts, masks of a row's ragged end, masked loads and stores, horizontal sums, float lanes
// summed into doubles, even/odd lane splits, max_pool2d's comparison, bfloat16 lanes widened on load
// and rounded on store) and the record of which path
// each kernel call took (simd_path_count, counted in kernels/cpu/simd.cpp).
// Guarantees: load_first/store_first touch nothing at or past p + n. AVX-512: a masked load; a
// plain store of a full vector, a masked one of the ragged end (rows that are mostly a ragged end,
// such as MnistNet's pooled rows of 13 and 5, store with _mm512_mask_storeu_ps and one lane_mask
// instead). AVX2: full vectors plainly; the ragged end a masked load, and a store through the stack
// (AMD's masked store is microcoded). The helpers compute what the code they replace did, so the
// rows' bits do not depend on the layer. A kernel's vector rows are float32; double and builds
// without AVX2+FMA run its portable rows (scalar or Eigen code that compiles for any target).
#pragma once

// GCC 12 reports a false "may be used uninitialized" inside its own AVX-512 intrinsic headers when
// Eigen's reductions are inlined; silenced for the intrinsics only (the state is attached to the
// headers' locations, so this must be their first inclusion: kernels/cpu/common.h includes this
// header before Eigen).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <cstdint>
#include <cstring>
#include <type_traits>

#define TANDEM_SIMD_PORTABLE 0
#define TANDEM_SIMD_AVX2 1
#define TANDEM_SIMD_AVX512 2
#if defined(__AVX512F__)
#define TANDEM_SIMD TANDEM_SIMD_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define TANDEM_SIMD TANDEM_SIMD_AVX2
#else
#define TANDEM_SIMD TANDEM_SIMD_PORTABLE
#endif

namespace tandem::kernels::cpu {

enum class SimdLevel : int { portable = TANDEM_SIMD_PORTABLE, avx2 = TANDEM_SIMD_AVX2, avx512 = TANDEM_SIMD_AVX512 };
inline constexpr int kSimdLevels = 3;

// The level of the translation unit that includes this header.
inline constexpr SimdLevel kSimdLevel = static_cast<SimdLevel>(TANDEM_SIMD);

// The level the library's kernels were compiled at (kSimdLevel of kernels/cpu/simd.cpp).
SimdLevel compiled_simd_level();

// "portable", "avx2", "avx512".
const char* simd_level_name(SimdLevel level);

// The kernels with vector rows, each counted once per call with the level of the path it took.
enum class SimdKernel : int {
  bn_relu_forward,       // batch_norm_relu_forward (AVX-512 rows)
  bn_relu_backward,      // batch_norm_relu_backward (AVX-512 rows)
  bn_relu_pool_forward,  // batch_norm_relu_max_pool2d_forward (AVX-512 and AVX2 rows)
  bn_relu_pool_backward, // batch_norm_relu_max_pool2d_backward (AVX-512 and AVX2 rows)
  conv2d_forward,        // conv2d_forward, stride-1 width or the one-channel 3x3 (AVX-512 rows)
  conv2d_backward,       // conv2d_backward, likewise (AVX-512 rows)
  max_pool2d_forward,    // max_pool2d_forward, 2x2 windows of stride 2 (AVX-512 rows)
  linear_forward,        // linear_forward on the small GEMM (AVX-512)
  linear_backward,       // linear_backward on the small GEMM (AVX-512)
  attention_forward,     // attention_forward (kernels/attention.h), any shape (AVX-512 rows)
  attention_backward,    // attention_backward, any shape (AVX-512 rows)
  conv2d_pair_forward,   // conv2d_pair_forward (kernels/conv_pair.h), fused where fused_here (AVX-512 rows)
  conv2d_pair_backward,  // conv2d_pair_backward, likewise (AVX-512 rows)
};
inline constexpr int kSimdKernels = 13;

// How many calls of `kernel` took the path of `level` in this process so far.
uint64_t simd_path_count(SimdKernel kernel, SimdLevel level);

namespace detail {
// Records one call of `kernel` on the path of `level` (one relaxed atomic increment).
void count_simd_path(SimdKernel kernel, SimdLevel level);

// The path of a call with element type T: kSimdLevel when T is float and the kernel has vector rows
// at this level that the call's arguments qualify for (vector_rows), else portable.
template <typename T>
constexpr SimdLevel simd_path(bool vector_rows) {
  return std::is_same_v<T, float> && vector_rows ? kSimdLevel : SimdLevel::portable;
}
}  // namespace detail

namespace simd {

// Whether the target has FMA, so that std::fma is one instruction (else a slow library call).
#if defined(__FMA__)
inline constexpr bool kFma = true;
#else
inline constexpr bool kFma = false;
#endif

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

inline constexpr int64_t kFloatLanes = 16;

// The first n lanes, n clamped to 0..16.
inline __mmask16 lane_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}
// The first n (clamped to 0..16) floats at p, 0 in the other lanes.
inline __m512 load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(lane_mask(n), p); }
// The first n (clamped to 0..16) lanes of v to p: a plain store when n >= 16, else a masked one.
inline void store_first(float* p, __m512 v, int64_t n) {
  if (n >= 16) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, lane_mask(n), v);
  }
}

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
inline double hsum(__m512d v) { return _mm512_reduce_add_pd(v); }
// v, held in a register: GCC otherwise folds a load used by several multiply-adds into each of them
// as a memory operand, and a row of unaligned loads read KB times is bound by the load ports.
inline __m512 in_register(__m512 v) {
  asm("" : "+v"(v));
  return v;
}

// r[i] holds row i of a 16x16 tile; on return r[j] holds column j.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // per 128-bit lane: a0 b0 a1 b1
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + k], lane L: rows 4i..4i+3 at column 4L + k
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // gather lane L of u[k], u[4 + k], u[8 + k], u[12 + k] into r[4L + k]
    const __m512 v = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 w2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(v, v2, 0x88);
    r[4 + k] = _mm512_shuffle_f32x4(w, w2, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(v, v2, 0xDD);
    r[12 + k] = _mm512_shuffle_f32x4(w, w2, 0xDD);
  }
}

// v[i] holds row i of an 8x8 tile of 64-bit elements (float pairs); on return v[j] holds column j.
inline void transpose8x8_64(__m512 v[8]) {
  __m512d t[8], u[8];
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: a_k b_k (k even, odd)
    t[2 * i] = _mm512_unpacklo_pd(_mm512_castps_pd(v[2 * i]), _mm512_castps_pd(v[2 * i + 1]));
    t[2 * i + 1] = _mm512_unpackhi_pd(_mm512_castps_pd(v[2 * i]), _mm512_castps_pd(v[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {  // 128-bit blocks 0 and 2, 1 and 3, of rows 4 i .. 4 i + 3
    for (int k = 0; k < 2; ++k) {
      u[4 * i + k] = _mm512_shuffle_f64x2(t[4 * i + k], t[4 * i + 2 + k], 0x88);
      u[4 * i + 2 + k] = _mm512_shuffle_f64x2(t[4 * i + k], t[4 * i + 2 + k], 0xDD);
    }
  }
  for (int k = 0; k < 4; ++k) {
    v[(k & 1) + 2 * (k >> 1)] = _mm512_castpd_ps(_mm512_shuffle_f64x2(u[k], u[4 + k], 0x88));
    v[(k & 1) + 2 * (k >> 1) + 4] = _mm512_castpd_ps(_mm512_shuffle_f64x2(u[k], u[4 + k], 0xDD));
  }
}

// bfloat16 lanes (the upper 16 bits of a float32; uint16_t storage). Widening is exact; narrowing
// rounds to nearest even and keeps a NaN a quiet NaN, bit for bit as kernels/cpu/bf16.h's scalar
// conversion (integer arithmetic, not vcvtneps2bf16, so that every CPU gives the same bits). The
// overloads of load_first / store_first, so that a row template reads and writes float and bfloat16
// rows with the same calls.
// The first n (clamped to 0..16) bf16 values at p widened, 0.0f in the other lanes.
inline __m512 load_first(const uint16_t* p, int64_t n) {
  __m256i h;
  if (n >= 16) {
    h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    h = _mm256_maskz_loadu_epi16(lane_mask(n), p);  // a masked load: no register-hungry tail loop
#else
    alignas(32) uint16_t tail[16] = {};
    for (int64_t i = 0; i < n; ++i) tail[i] = p[i];
    h = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
#endif
  }
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// The first n (clamped to 0..16) lanes of v rounded to bf16 and stored at p. Where the build has
// AVX512_BF16, the CPU's own conversion (vcvtneps2bf16): it gives these bits for every float but the
// denormals, which it flushes to zero (compared over all 2^32 floats on Zen 4), so a vector holding a
// denormal takes the integer rounding below.
inline void store_first(uint16_t* p, __m512 v, int64_t n) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  if (_mm512_fpclass_ps_mask(v, 0x20) == 0) {  // 0x20: denormal
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);  // NOLINT: the bf16 lanes as integers
    if (n >= 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    } else {
      _mm256_mask_storeu_epi16(p, lane_mask(n), h);
    }
    return;
  }
#endif
  const __m512i u = _mm512_castps_si512(v), high = _mm512_srli_epi32(u, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  const __m512i bits = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, quiet);
  _mm512_mask_cvtepi32_storeu_epi16(p, lane_mask(n), bits);
}

// Lanes 0-7 and 8-15 of v widened (exactly) to doubles.
inline void widen(__m512 v, __m512d& lo, __m512d& hi) {
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// Float lanes summed into per-lane doubles (lanes 0-7 and 8-15), reduced once at the end.
struct WideSum {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  void add(__m512 v) {
    __m512d l, h;
    widen(v, l, h);
    lo = _mm512_add_pd(lo, l);
    hi = _mm512_add_pd(hi, h);
  }
  double total() const { return hsum(_mm512_add_pd(lo, hi)); }
};

// Lane indices 0, 2, ..., 30 and 1, 3, ..., 31 of a pair of vectors (_mm512_permutex2var_ps).
inline __m512i even_lanes() { return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30); }
inline __m512i odd_lanes() { return _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31); }

// The lanes where v replaces best under max_pool2d's rule: v greater, or v NaN.
inline __mmask16 greater_or_nan(__m512 v, __m512 best) {
  return _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}


// c[i * ldc + 16 v ...] += sum_{t0 <= t < t1} a[t * at + i * ai] * b[t * ldb + 16 v ...], i < R, over n
// columns (16 (NV - 1) < n <= 16 NV): a register tile of R x NV accumulators, each step NV loads of b and R
// broadcasts of a (the attention rows' products, the 1x1 projections' channels-last weight gradient). With
// kPairs, a's values go in pairs: a[t * at + i * ai] in the even lanes and the value after it in the odd ones
// (one 64-bit broadcast; the 1x1 projections' position pairs).
template <int R, int NV, bool kPairs = false>
inline void axpy_tile(const float* a, int64_t at, int64_t ai, int64_t t0, int64_t t1, const float* b, int64_t ldb,
                      int64_t n, float* c, int64_t ldc) {
  const __mmask16 last = lane_mask(n - 16 * (NV - 1));
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (auto& row : acc)
#pragma GCC unroll 16
    for (auto& x : row) x = _mm512_setzero_ps();
  for (int64_t t = t0; t < t1; ++t) {
    __m512 bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v + 1 < NV; ++v) bv[v] = _mm512_loadu_ps(b + t * ldb + 16 * v);
    bv[NV - 1] = _mm512_maskz_loadu_ps(last, b + t * ldb + 16 * (NV - 1));
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      __m512 x;
      if constexpr (kPairs) {
        double pair;
        std::memcpy(&pair, a + t * at + i * ai, sizeof pair);
        x = _mm512_castpd_ps(_mm512_set1_pd(pair));
      } else {
        x = _mm512_set1_ps(a[t * at + i * ai]);
      }
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(x, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const __m512 sum = acc[i][v];
      float* p = c + i * ldc + 16 * v;
      const __mmask16 m = v + 1 < NV ? __mmask16(0xFFFF) : last;
      _mm512_mask_storeu_ps(p, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), sum));
    }
  }
}

#elif TANDEM_SIMD == TANDEM_SIMD_AVX2

inline constexpr int64_t kFloatLanes = 8;

// A lane mask (all ones) of the first n lanes, n clamped to 0..8.
inline __m256i lane_mask(int64_t n) {
  const int32_t c = int32_t(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// The first n (clamped to 0..8) floats at p, 0 in the other lanes: the ragged end a masked load.
inline __m256 load_first(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(n));
}
// The first n (clamped to 0..8) lanes of v to p: the ragged end through the stack.
inline void store_first(float* p, __m256 v, int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int64_t i = 0; i < n; ++i) p[i] = tmp[i];
  }
}

inline double hsum(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// Float lanes summed into per-lane doubles (lanes 0-3 and 4-7), reduced once at the end.
struct WideSum {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  void add(__m256 v) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  double total() const { return hsum(_mm256_add_pd(lo, hi)); }
};

// Elements 0, 2, ..., 14 (kOdd: 1, 3, ..., 15) of the 16 floats in a, b.
template <bool kOdd>
inline __m256 deinterleave(__m256 a, __m256 b) {
  const __m256 s = _mm256_shuffle_ps(a, b, kOdd ? _MM_SHUFFLE(3, 1, 3, 1) : _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

// The lanes (all ones) where v replaces best under max_pool2d's rule: v greater, or v NaN.
inline __m256 greater_or_nan(__m256 v, __m256 best) {
  return _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// bfloat16 lanes (uint16_t bits): the first n (clamped to 0..8) values at p widened to float
// (exact), 0 in the other lanes; the ragged end through the stack.
inline __m256 load_first(const uint16_t* p, int64_t n) {
  __m128i h;
  if (n >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    alignas(16) uint16_t tmp[8] = {};
    for (int64_t i = 0; i < n; ++i) tmp[i] = p[i];
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// v rounded to bfloat16 as kernels/cpu/bf16.h's f32_to_bf16_bits (nearest even, a NaN a quiet NaN),
// the first n (clamped to 0..8) lanes stored to p; the ragged end through the stack.
inline void store_first(uint16_t* p, __m256 v, int64_t n) {
  const __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
  const __m256i rounding = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, rounding), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  // packus (values fit 16 bits) gives lanes 0-3 in quadword 0 and 4-7 in quadword 2.
  const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  if (n >= 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  } else {
    alignas(16) uint16_t tmp[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), h);
    for (int64_t i = 0; i < n; ++i) p[i] = tmp[i];
  }
}

#endif

}  // namespace simd
}  // namespace tandem::kernels::cpu
