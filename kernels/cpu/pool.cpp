// CPU max_pool2d forward/backward (kernels/pool.h) under tandem::kernels::cpu.
// Assumes: validated by kernels/pool.cpp (4-D input, padding <= kernel/2, so
// every window holds at least one real element); inputs may be
// non-contiguous. Guarantees PyTorch's semantics: the windows of MaxPoolAxis
// (dilation, ceil_mode, adaptive windows); indices are
// int64 flat positions h*W + w within the input plane; the first maximum in
// scan order wins, a NaN counts as a maximum (as PyTorch's CPU kernel), and
// padding never wins. Planes (n, c) are split across the thread pool; the
// backward scatters each plane's gradients into its own input plane, so no
// two threads write the same memory and the result is deterministic.
// The float 2x2/stride-2 forward has AVX-512 rows where compiled in
// (kernels/cpu/simd.h); each forward call is counted in simd_path_count with
// the level of the rows it ran.
#include "kernels/ops.h"

#include <algorithm>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu {
namespace {

// Replaces (best, bi) by (v, i) where PyTorch's CPU kernel would:
// v > best or v is NaN. Branch-free, so random data costs no mispredictions
// and the 2x2 row loop vectorises.
template <typename T>
inline void take_max(T v, int64_t i, T& best, int64_t& bi) {
  const bool take = (v > best) | (v != v);
  best = take ? v : best;
  bi = take ? i : bi;
}

// 2x2 window, stride 2, no padding, in blocks of kBlock outputs of one
// output row: a fixed trip count the compiler turns into straight vector
// code (even/odd lanes of two input rows), so the data-dependent choices cost
// no branches. Scan order (0,0) (0,1) (1,0) (1,1); starting from the first
// element equals the general path's start from -inf.
constexpr int64_t kBlock = 16;

template <typename T>
inline void pool_block_2x2(const T* __restrict r0, const T* __restrict r1, int64_t base, int64_t W,
                           T* __restrict y, int64_t* __restrict idx) {
  for (int64_t q = 0; q < kBlock; ++q) {
    T best = r0[2 * q];
    int64_t bi = base + 2 * q;
    take_max(r0[2 * q + 1], base + 2 * q + 1, best, bi);
    take_max(r1[2 * q], base + W + 2 * q, best, bi);
    take_max(r1[2 * q + 1], base + W + 2 * q + 1, best, bi);
    y[q] = best;
    idx[q] = bi;
  }
}

// One output row: full blocks read and write in place; a partial block goes
// through small local buffers (so nothing past the row is read or written).
template <typename T>
void pool_row_2x2(const T* r0, int64_t W, int64_t base, int64_t Q, T* y, int64_t* idx) {
  const T* r1 = r0 + W;
  int64_t q0 = 0;
  for (; q0 + kBlock <= Q; q0 += kBlock) {
    pool_block_2x2(r0 + 2 * q0, r1 + 2 * q0, base + 2 * q0, W, y + q0, idx + q0);
  }
  if (q0 == Q) return;
  const int64_t n = Q - q0;
  alignas(64) T a[2 * kBlock] = {}, b[2 * kBlock] = {}, ty[kBlock];
  alignas(64) int64_t ti[kBlock];
  std::copy(r0 + 2 * q0, r0 + 2 * q0 + 2 * n, a);
  std::copy(r1 + 2 * q0, r1 + 2 * q0 + 2 * n, b);
  // Indices computed from the local copies are relative to the block start.
  pool_block_2x2(a, b, 0, 2 * kBlock, ty, ti);
  const int64_t block_base = base + 2 * q0;
  for (int64_t j = 0; j < n; ++j) {
    y[q0 + j] = ty[j];
    const int64_t rel = ti[j];  // in the local layout: row 0 or 1 of width 2*kBlock
    idx[q0 + j] = block_base + (rel >= 2 * kBlock ? W + rel - 2 * kBlock : rel);
  }
}

// The vector rows: the float 2x2 row, AVX-512 only; other levels run the template above.
constexpr bool kVectorRows = kSimdLevel == SimdLevel::avx512;

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// The float row with AVX-512: 16 outputs per step from 32 + 32 input values
// (masked loads at the row's end, nothing past it is read), even/odd lanes
// split by permutes, the same take_max rule on lane masks, and masked stores
// of the values and the int64 indices. Needs W + 32 < 2^31 (int32 offsets).
inline void pool_row_2x2(const float* r0, int64_t W, int64_t base, int64_t Q, float* y, int64_t* idx) {
  const float* r1 = r0 + W;
  const __m512i even = simd::even_lanes(), odd = simd::odd_lanes();
  const __m512i off_01 = _mm512_set1_epi32(1), off_10 = _mm512_set1_epi32(int32_t(W)),
                off_11 = _mm512_set1_epi32(int32_t(W + 1));
  for (int64_t q0 = 0; q0 < Q; q0 += simd::kFloatLanes) {
    const int64_t n = std::min<int64_t>(simd::kFloatLanes, Q - q0), n2 = 2 * n;
    const __mmask16 m = simd::lane_mask(n), m_lo = simd::lane_mask(n2), m_hi = simd::lane_mask(n2 - 16);
    const float* a = r0 + 2 * q0;
    const float* b = r1 + 2 * q0;
    const __m512 a0 = _mm512_maskz_loadu_ps(m_lo, a), a1 = _mm512_maskz_loadu_ps(m_hi, a + 16);
    const __m512 b0 = _mm512_maskz_loadu_ps(m_lo, b), b1 = _mm512_maskz_loadu_ps(m_hi, b + 16);
    __m512 best = _mm512_permutex2var_ps(a0, even, a1);
    __m512i off = _mm512_setzero_si512();  // 0, 1, W or W + 1 within the window
    auto take = [&](__m512 v, __m512i o) {
      const __mmask16 t = simd::greater_or_nan(v, best);
      best = _mm512_mask_mov_ps(best, t, v);
      off = _mm512_mask_mov_epi32(off, t, o);
    };
    take(_mm512_permutex2var_ps(a0, odd, a1), off_01);
    take(_mm512_permutex2var_ps(b0, even, b1), off_10);
    take(_mm512_permutex2var_ps(b0, odd, b1), off_11);
    _mm512_mask_storeu_ps(y + q0, m, best);
    const __m512i rel = _mm512_add_epi32(even, off);  // 2*lane + window offset
    const __m512i start = _mm512_set1_epi64(base + 2 * q0);
    const __m512i lo = _mm512_add_epi64(start, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(rel)));
    _mm512_mask_storeu_epi64(idx + q0, __mmask8(m & 0xFF), lo);
    if (n > 8) {
      const __m512i hi = _mm512_add_epi64(start, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(rel, 1)));
      _mm512_mask_storeu_epi64(idx + q0 + 8, __mmask8(m >> 8), hi);
    }
  }
}
#endif

template <typename T>
MaxPool2dForward forward_impl(const Tensor& x_in, const MaxPool2dArgs& a) {
  const Tensor x = x_in.contiguous();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const MaxPoolAxis ah = max_pool_axis_h(x.shape(), a), aw = max_pool_axis_w(x.shape(), a);
  const int64_t P = ah.out, Q = aw.out;
  MaxPool2dForward r;
  r.output = Tensor::empty({N, C, P, Q}, x.dtype());
  r.indices = Tensor::empty({N, C, P, Q}, kInt64);
  const T* xp = x.data<T>();
  T* yp = r.output.data<T>();
  int64_t* ip = r.indices.data<int64_t>();
  const int64_t planes = N * C;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, P * Q * a.kernel_h * a.kernel_w));
  const bool fast_2x2 = !ah.adaptive && a.kernel_h == 2 && a.kernel_w == 2 && a.stride_h == 2 && a.stride_w == 2 &&
                        a.pad_h == 0 && a.pad_w == 0 && a.dilation_h == 1 && a.dilation_w == 1 &&
                        P == H / 2 && Q == W / 2 && W < (int64_t{1} << 30);
  detail::count_simd_path(SimdKernel::max_pool2d_forward, detail::simd_path<T>(kVectorRows && fast_2x2));

  detail::parallel_range(planes, grain, [&](int64_t pl0, int64_t pl1) {
    for (int64_t pl = pl0; pl < pl1; ++pl) {
      const T* xs = xp + pl * H * W;
      T* ys = yp + pl * P * Q;
      int64_t* is = ip + pl * P * Q;
      if (fast_2x2) {
        for (int64_t p = 0; p < P; ++p) {
          pool_row_2x2(xs + 2 * p * W, W, 2 * p * W, Q, ys + p * Q, is + p * Q);
        }
        continue;
      }
      for (int64_t p = 0; p < P; ++p) {
        int64_t h0 = 0, hs = 1, hn = 0;
        ah.window(p, h0, hs, hn);
        for (int64_t q = 0; q < Q; ++q) {
          int64_t w0 = 0, ws = 1, wn = 0;
          aw.window(q, w0, ws, wn);
          T best = -std::numeric_limits<T>::infinity();
          int64_t bi = h0 * W + w0;
          for (int64_t i = 0, h = h0; i < hn; ++i, h += hs) {
            for (int64_t j = 0, w = w0; j < wn; ++j, w += ws) {
              take_max(xs[h * W + w], h * W + w, best, bi);
            }
          }
          ys[p * Q + q] = best;
          is[p * Q + q] = bi;
        }
      }
    }
  });
  return r;
}

template <typename T>
Tensor backward_impl(const Tensor& gy_in, const Tensor& idx_in, const Shape& input_shape) {
  const Tensor gy = gy_in.contiguous(), idx = idx_in.contiguous();
  const int64_t N = input_shape[0], C = input_shape[1], H = input_shape[2], W = input_shape[3];
  const int64_t PQ = gy.size(2) * gy.size(3), HW = H * W;
  Tensor gx = Tensor::empty(input_shape, gy.dtype());
  const T* gp = gy.data<T>();
  const int64_t* ip = idx.data<int64_t>();
  T* xp = gx.data<T>();
  if (HW == 0) return gx;  // nothing to scatter into (and no valid index)
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, HW + PQ));
  detail::parallel_range(N * C, grain, [&](int64_t pl0, int64_t pl1) {
    for (int64_t pl = pl0; pl < pl1; ++pl) {
      T* xs = xp + pl * HW;
      std::fill(xs, xs + HW, T(0));
      const T* gs = gp + pl * PQ;
      const int64_t* is = ip + pl * PQ;
      bool bad = false;
      for (int64_t i = 0; i < PQ; ++i) {
        const int64_t k = is[i];
        const bool out = static_cast<uint64_t>(k) >= static_cast<uint64_t>(HW);
        bad |= out;
        xs[out ? 0 : k] += out ? T(0) : gs[i];
      }
      if (bad) {
        for (int64_t i = 0; i < PQ; ++i) {
          TANDEM_CHECK(is[i] >= 0 && is[i] < HW, "max_pool2d_backward: index ", is[i], " in plane ", pl,
                       " is outside the input plane of ", HW, " elements");
        }
      }
    }
  });
  return gx;
}

}  // namespace

MaxPool2dForward max_pool2d_forward(const Tensor& x, const MaxPool2dArgs& args) {
  detail::check_cpu("max_pool2d_forward", x);
  return detail::dispatch_float(x.dtype(), "max_pool2d_forward",
                                [&](auto t) { return forward_impl<decltype(t)>(x, args); });
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape) {
  detail::check_cpu("max_pool2d_backward", grad_out);
  return detail::dispatch_float(grad_out.dtype(), "max_pool2d_backward", [&](auto t) {
    return backward_impl<decltype(t)>(grad_out, indices, input_shape);
  });
}

}  // namespace tandem::kernels::cpu
