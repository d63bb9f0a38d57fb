// bfloat16 <-> float32 conversions of the CPU kernels (internal, not part of the public API): a bf16
// value is the upper 16 bits of a float32, so widening is exact; narrowing rounds to nearest even and
// keeps a NaN a (quiet) NaN, as PyTorch.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::kernels::cpu::detail {

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace tandem::kernels::cpu::detail
