// NCHW <-> nChw16c copies (kernels/cpu/block_layout.h): per image and block of 16 channels, tiles of
// 16 channels x 16 positions loaded as 16 rows (bf16 widened on load), transposed in registers and
// stored as 16 rows (f32 to bf16 rounded on store); the ragged last tile of a plane by masked loads
// and stores (kernels/cpu/simd.h's load_first / store_first).
#include "kernels/cpu/block_layout.h"

#include <algorithm>

#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
namespace {

// One block of 16 channels: 16 planes of HW values <-> HW blocked rows of 16 values.
template <typename S, typename D>
void block_to_rows(const S* src, int64_t HW, D* dst) {
  for (int64_t s0 = 0; s0 < HW; s0 += 16) {
    const int64_t m = std::min<int64_t>(16, HW - s0);
    __m512 r[16];
    for (int c = 0; c < 16; ++c) r[c] = simd::load_first(src + c * HW + s0, m);
    simd::transpose16(r);
    for (int64_t j = 0; j < m; ++j) simd::store_first(dst + (s0 + j) * 16, r[j], 16);
  }
}

template <typename S, typename D>
void rows_to_block(const S* src, int64_t HW, D* dst) {
  for (int64_t s0 = 0; s0 < HW; s0 += 16) {
    const int64_t m = std::min<int64_t>(16, HW - s0);
    __m512 r[16];
    for (int64_t j = 0; j < 16; ++j) r[j] = j < m ? simd::load_first(src + (s0 + j) * 16, 16) : _mm512_setzero_ps();
    simd::transpose16(r);
    for (int c = 0; c < 16; ++c) simd::store_first(dst + c * HW + s0, r[c], m);
  }
}

template <bool kToBlocked, typename S, typename D>
void copy_all(const void* src, void* dst, int64_t N, int64_t C, int64_t HW) {
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  for (int64_t b = 0; b < N * (C / 16); ++b) {  // block b: image b / (C/16), channels 16 * (b % (C/16))...
    const int64_t off = b * 16 * HW;             // the same element offset in both layouts
    if constexpr (kToBlocked) {
      block_to_rows(s + off, HW, d + off);
    } else {
      rows_to_block(s + off, HW, d + off);
    }
  }
}

template <bool kToBlocked>
bool copy_any(const void* src, DType st, void* dst, DType dt, int64_t N, int64_t C, int64_t HW) {
  const auto ok = [](DType t) { return t == kFloat32 || t == kBFloat16; };
  if (C % 16 != 0 || !ok(st) || !ok(dt)) return false;
  if (st == kFloat32 && dt == kFloat32) copy_all<kToBlocked, float, float>(src, dst, N, C, HW);
  if (st == kFloat32 && dt == kBFloat16) copy_all<kToBlocked, float, uint16_t>(src, dst, N, C, HW);
  if (st == kBFloat16 && dt == kFloat32) copy_all<kToBlocked, uint16_t, float>(src, dst, N, C, HW);
  if (st == kBFloat16 && dt == kBFloat16) copy_all<kToBlocked, uint16_t, uint16_t>(src, dst, N, C, HW);
  return true;
}

}  // namespace

bool to_channel_blocked16(const void* src, DType st, void* dst, DType dt, int64_t N, int64_t C, int64_t HW) {
  return copy_any<true>(src, st, dst, dt, N, C, HW);
}

bool from_channel_blocked16(const void* src, DType st, void* dst, DType dt, int64_t N, int64_t C, int64_t HW) {
  return copy_any<false>(src, st, dst, dt, N, C, HW);
}

#else  // below AVX-512: oneDNN's reorders

bool to_channel_blocked16(const void*, DType, void*, DType, int64_t, int64_t, int64_t) { return false; }
bool from_channel_blocked16(const void*, DType, void*, DType, int64_t, int64_t, int64_t) { return false; }

#endif

}  // namespace tandem::kernels::cpu::detail
