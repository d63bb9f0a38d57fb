// CPU mixed-precision helpers: contiguous f32 <-> f16/bf16 casts (round to nearest even, NaN kept
// NaN, as PyTorch) parallel over the shared pool, and the GradScaler's unscale + non-finite check.
// Assumes host tensors; anything other than a contiguous f32 <-> f16/bf16 cast falls back to the
// generic (slower) Tensor::to.
#include <atomic>
#include <cmath>
#include <cstring>

#include "kernels/ops.h"
#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;

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

}  // namespace

Tensor cast(const Tensor& x, DType to) {
  detail::check_cpu("cast", x);
  if (x.dtype() == to) return x;
  const DType from = x.dtype();
  const bool fast = x.is_contiguous() && ((from == kFloat32 && is_low_precision(to)) ||
                                          (is_low_precision(from) && to == kFloat32));
  if (!fast) return x.to(to);
  Tensor out = Tensor::empty(x.shape(), to, x.device());
  const int64_t n = x.numel();
  if (from == kFloat32 && to == kBFloat16) {
    const float* s = x.data<float>();
    uint16_t* d = static_cast<uint16_t*>(out.raw_data());
    detail::parallel_range(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = f32_to_bf16_bits(s[i]);
    });
  } else if (from == kBFloat16 && to == kFloat32) {
    const uint16_t* s = static_cast<const uint16_t*>(x.raw_data());
    float* d = out.data<float>();
    detail::parallel_range(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = bf16_bits_to_f32(s[i]);
    });
  } else if (from == kFloat32 && to == kFloat16) {
    const float* s = x.data<float>();
    Eigen::half* d = static_cast<Eigen::half*>(out.raw_data());
    detail::parallel_range(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = Eigen::half(s[i]);
    });
  } else {  // f16 -> f32
    const Eigen::half* s = static_cast<const Eigen::half*>(x.raw_data());
    float* d = out.data<float>();
    detail::parallel_range(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = static_cast<float>(s[i]);
    });
  }
  return out;
}

void unscale_and_check_(const Tensor& grad, const Tensor& found_inf, double inv_scale) {
  const char* op = "unscale_and_check_";
  detail::check_cpu(op, grad);
  detail::check_cpu(op, found_inf);
  TANDEM_CHECK(grad.dtype() == kFloat32 && grad.is_contiguous(), op,
               ": expected a contiguous float32 gradient, got ", grad.str());
  TANDEM_CHECK(found_inf.dtype() == kFloat32 && found_inf.numel() == 1, op,
               ": found_inf must be a 1-element float32 tensor, got ", found_inf.str());
  Tensor handle = grad;  // handles share data: writing through a copy writes grad
  float* g = handle.data<float>();
  const int64_t n = grad.numel();
  const float s = static_cast<float>(inv_scale);
  std::atomic<bool> bad{false};
  detail::parallel_range(n, kGrain, [&](int64_t b, int64_t e) {
    bool local = false;
    for (int64_t i = b; i < e; ++i) {
      local |= !std::isfinite(g[i]);
      g[i] *= s;
    }
    if (local) bad.store(true, std::memory_order_relaxed);
  });
  if (bad.load()) {
    Tensor flag = found_inf;
    *flag.data<float>() = 1.0f;
  }
}

}  // namespace tandem::kernels::cpu
