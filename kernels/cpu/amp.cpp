// CPU mixed-precision helpers: f32 <-> f16/bf16 casts of any strides into contiguous results
// (round to nearest even, NaN kept NaN, as PyTorch) parallel over the shared pool, and the
// GradScaler's unscale + non-finite check. Assumes host tensors; other dtype pairs (and 0-d or
// empty tensors) take the generic (slower) Tensor::to.
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

using detail::bf16_bits_to_f32;
using detail::f32_to_bf16_bits;

constexpr int64_t kGrain = 1 << 15;
// Casts are memory-bound: a second thread gains nothing below ~2^18 elements (Zen 4, 2 cores:
// [1024, 64] f32 -> bf16 takes 5.9 us on one thread, 10.9 us cut in two), so only larger casts
// are cut.
constexpr int64_t kCastGrain = 1 << 18;

// Converts x (any strides) into the contiguous out element by element: rows (all dimensions but
// the last) in parallel, each row's walk through x kept as an odometer over the outer dimensions;
// a row of unit stride is a plain (vectorisable) loop.
template <typename S, typename D, typename Conv>
void convert(const Tensor& x, Tensor& out, Conv conv) {
  const S* src = static_cast<const S*>(x.raw_data());
  D* dst = static_cast<D*>(out.raw_data());
  const int64_t n = x.numel();
  if (x.is_contiguous()) {
    detail::parallel_range(n, kCastGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = conv(src[i]);
    });
    return;
  }
  const Shape& shape = x.shape();
  const Shape& strides = x.strides();
  const int64_t dims = x.dim(), cols = shape[dims - 1], col_stride = strides[dims - 1];
  const int64_t rows = n / cols;
  detail::parallel_range(rows, std::max<int64_t>(1, kCastGrain / cols), [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> index(static_cast<size_t>(dims), 0);
    int64_t at = 0;
    for (int64_t d = dims - 2, r = r0; d >= 0; --d) {
      index[d] = r % shape[d];
      r /= shape[d];
      at += index[d] * strides[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      const S* row = src + at;
      D* o = dst + r * cols;
      if (col_stride == 1) {
        for (int64_t j = 0; j < cols; ++j) o[j] = conv(row[j]);
      } else {
        for (int64_t j = 0; j < cols; ++j) o[j] = conv(row[j * col_stride]);
      }
      for (int64_t d = dims - 2; d >= 0; --d) {  // next row
        at += strides[d];
        if (++index[d] < shape[d]) break;
        at -= index[d] * strides[d];
        index[d] = 0;
      }
    }
  });
}

}  // namespace

Tensor cast(const Tensor& x, DType to) {
  detail::check_cpu("cast", x);
  if (x.dtype() == to) return x;
  const DType from = x.dtype();
  const bool fast = x.dim() > 0 && x.numel() > 0 &&
                    ((from == kFloat32 && is_low_precision(to)) || (is_low_precision(from) && to == kFloat32));
  if (!fast) return x.to(to);
  Tensor out = Tensor::empty(x.shape(), to, x.device());
  if (from == kFloat32 && to == kBFloat16) {
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
    if (x.is_contiguous()) {  // vector lanes (the CPU's own conversion where the build has AVX512_BF16)
      const float* src = x.data<float>();
      uint16_t* dst = static_cast<uint16_t*>(out.raw_data());
      detail::parallel_range(x.numel(), kCastGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i += 16) simd::store_first(dst + i, simd::load_first(src + i, e - i), e - i);
      });
      return out;
    }
#endif
    convert<float, uint16_t>(x, out, [](float f) { return f32_to_bf16_bits(f); });
  } else if (from == kBFloat16 && to == kFloat32) {
    convert<uint16_t, float>(x, out, [](uint16_t b) { return bf16_bits_to_f32(b); });
  } else if (from == kFloat32 && to == kFloat16) {
    convert<float, Eigen::half>(x, out, [](float f) { return Eigen::half(f); });
  } else {  // f16 -> f32
    convert<Eigen::half, float>(x, out, [](Eigen::half h) { return static_cast<float>(h); });
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
