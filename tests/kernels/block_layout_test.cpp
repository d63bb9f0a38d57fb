// The NCHW <-> nChw16c copies the oneDNN layer uses in place of oneDNN's reorders
// (kernels/cpu/block_layout.h), against an element-by-element reference: every pair of f32/bf16
// types, planes that are not a multiple of 16 long (MnistNet's 11x11 and 13x13), one position, and a
// NaN. AVX-512 builds must take them for C a multiple of 16; other builds and other C must decline,
// writing nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/block_layout.h"

using namespace tandem;
using kernels::cpu::detail::bf16_bits_to_f32;
using kernels::cpu::detail::f32_to_bf16_bits;
using kernels::cpu::detail::from_channel_blocked16;
using kernels::cpu::detail::to_channel_blocked16;

namespace {

#if defined(__AVX512F__)
constexpr bool kHasKernel = true;
#else
constexpr bool kHasKernel = false;
#endif

struct Shape4 {
  int64_t N, C, HW;
  int64_t numel() const { return N * C * HW; }
  // Offset of (n, c, s) in NCHW and in nChw16c.
  int64_t plain(int64_t n, int64_t c, int64_t s) const { return (n * C + c) * HW + s; }
  int64_t blocked(int64_t n, int64_t c, int64_t s) const { return ((n * (C / 16) + c / 16) * HW + s) * 16 + c % 16; }
};

// Values whose bf16 rounding is not exact (so a wrong rounding shows), with a NaN at element 5.
std::vector<float> values(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 1.0f + float(i % 977) * 0.0013f - float(i % 13) * 0.37f;
  if (n > 5) v[5] = std::numeric_limits<float>::quiet_NaN();
  return v;
}

// A buffer of `n` elements of `t` holding f (rounded when t is bf16), and element i read back as float.
struct Buf {
  DType t;
  std::vector<float> f;
  std::vector<uint16_t> h;
  Buf(DType type, int64_t n) : t(type), f(type == kFloat32 ? n : 0, -7.0f), h(type == kBFloat16 ? n : 0, 0x1234) {}
  void fill(const std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) (t == kFloat32 ? void(f[i] = v[i]) : void(h[i] = f32_to_bf16_bits(v[i])));
  }
  void* data() { return t == kFloat32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  uint32_t bits(int64_t i) const {
    if (t == kBFloat16) return h[i];
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    return u;
  }
  float at(int64_t i) const { return t == kFloat32 ? f[i] : bf16_bits_to_f32(h[i]); }
};

// The bits element i of a buffer of type `to` must hold after a copy of value x stored as `from`.
uint32_t expected_bits(float x, DType to) {
  if (to == kBFloat16) return f32_to_bf16_bits(x);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

void check_pair(DType st, DType dt, const Shape4& s) {
  SCOPED_TRACE(::testing::Message() << "from " << dtype_name(st) << " to " << dtype_name(dt) << ", N " << s.N
                                    << " C " << s.C << " HW " << s.HW);
  Buf plain(st, s.numel()), blocked(dt, s.numel());
  plain.fill(values(s.numel()));
  ASSERT_EQ(to_channel_blocked16(plain.data(), st, blocked.data(), dt, s.N, s.C, s.HW), kHasKernel);
  if (!kHasKernel) return;
  // Back from the blocked buffer into a plain one of the source's type.
  Buf back(st, s.numel());
  ASSERT_TRUE(from_channel_blocked16(blocked.data(), dt, back.data(), st, s.N, s.C, s.HW));
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t c = 0; c < s.C; ++c) {
      for (int64_t i = 0; i < s.HW; ++i) {
        const int64_t p = s.plain(n, c, i), b = s.blocked(n, c, i);
        ASSERT_EQ(blocked.bits(b), expected_bits(plain.at(p), dt)) << "to blocked, n " << n << " c " << c << " s " << i;
        ASSERT_EQ(back.bits(p), expected_bits(blocked.at(b), st)) << "to plain, n " << n << " c " << c << " s " << i;
      }
    }
  }
}

TEST(BlockLayout, EveryTypePairMatchesTheElementwiseReference) {
  const Shape4 shapes[] = {{2, 32, 121}, {1, 16, 169}, {3, 16, 1}, {1, 48, 16}, {2, 16, 33}};
  for (const Shape4& s : shapes) {
    for (DType st : {kFloat32, kBFloat16}) {
      for (DType dt : {kFloat32, kBFloat16}) check_pair(st, dt, s);
    }
  }
}

TEST(BlockLayout, ChannelsNotAMultipleOf16AreDeclinedUntouched) {
  const Shape4 s{1, 8, 49};
  Buf plain(kFloat32, s.numel()), blocked(kFloat32, s.numel());
  plain.fill(values(s.numel()));
  EXPECT_FALSE(to_channel_blocked16(plain.data(), kFloat32, blocked.data(), kFloat32, s.N, s.C, s.HW));
  EXPECT_FALSE(from_channel_blocked16(plain.data(), kFloat32, blocked.data(), kFloat32, s.N, s.C, s.HW));
  for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(blocked.f[i], -7.0f);
  EXPECT_FALSE(to_channel_blocked16(plain.data(), kFloat64, blocked.data(), kFloat32, 1, 16, 1));
}

}  // namespace
