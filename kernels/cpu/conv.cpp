// CPU conv2d (NCHW), as im2col + Eigen GEMM. Owns the forward and backward
// kernels declared in kernels/conv.h under tandem::kernels::cpu.
// Assumes: arguments were validated by kernels/conv.cpp (shapes, devices,
// dtypes); inputs may be non-contiguous (made contiguous here).
// Guarantees: outputs are fresh contiguous tensors; the batch is cut into at
// most num_threads() chunks, each doing single-threaded GEMMs into its own
// buffers; weight/bias gradients are summed per chunk and then reduced in
// chunk order, so results are deterministic for a given thread count.
// Gradients that were not asked for are not computed (and cost nothing).
#include "kernels/conv.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {
namespace {

using detail::CMatMap;
using detail::MatMap;

struct Geometry {
  int64_t N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw;
  int64_t crs() const { return C * R * S; }
  int64_t pq() const { return P * Q; }
  // The column matrix is the input itself: 1x1 kernel, stride 1, no padding.
  bool identity_col() const { return R == 1 && S == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

Geometry make_geometry(const Tensor& x, const Tensor& w, const Conv2dArgs& a) {
  Geometry g{};
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.K = w.size(0), g.R = w.size(2), g.S = w.size(3);
  g.sh = a.stride_h, g.sw = a.stride_w, g.ph = a.pad_h, g.pw = a.pad_w;
  g.P = (g.H + 2 * g.ph - g.R) / g.sh + 1;
  g.Q = (g.W + 2 * g.pw - g.S) / g.sw + 1;
  return g;
}

// Row copy and add for the short rows of im2col/col2im, with AVX-512: masked
// loads (never reading past the source row) and full-width stores, which may
// spill up to kSpill elements past dst + n. Callers own that slack and
// write it properly afterwards (or pad their buffers). Masked stores are
// avoided on purpose: they are slow on some cores and defeat store forwarding.
template <typename T>
constexpr int64_t kSpill = 64 / sizeof(T);

template <typename T>
inline void copy_spill(T* __restrict dst, const T* __restrict src, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
      _mm512_storeu_ps(dst + i, _mm512_maskz_loadu_ps(m, src + i));
    }
    return;
  } else {
    for (int64_t i = 0; i < n; i += 8) {
      const __mmask8 m = n - i >= 8 ? __mmask8(0xFF) : __mmask8((1u << (n - i)) - 1);
      _mm512_storeu_pd(dst + i, _mm512_maskz_loadu_pd(m, src + i));
    }
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

// dst[0, n) += src[0, n); dst[n, n + kSpill) is read and written back unchanged.
template <typename T>
inline void add_spill(T* __restrict dst, const T* __restrict src, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
      _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), _mm512_maskz_loadu_ps(m, src + i)));
    }
    return;
  } else {
    for (int64_t i = 0; i < n; i += 8) {
      const __mmask8 m = n - i >= 8 ? __mmask8(0xFF) : __mmask8((1u << (n - i)) - 1);
      _mm512_storeu_pd(dst + i, _mm512_add_pd(_mm512_loadu_pd(dst + i), _mm512_maskz_loadu_pd(m, src + i)));
    }
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Smallest q >= 0 with q*stride >= v (v may be negative).
inline int64_t first_at_least(int64_t v, int64_t stride) { return v <= 0 ? 0 : (v + stride - 1) / stride; }

// For kernel column s: output columns [lo, hi) read inside the input row.
inline void valid_q_range(const Geometry& g, int64_t s, int64_t& lo, int64_t& hi) {
  lo = std::min(first_at_least(g.pw - s, g.sw), g.Q);
  hi = std::clamp(first_at_least(g.W + g.pw - s, g.sw), lo, g.Q);
}

// col[(c*R + r)*S + s][p*Q + q] = x[c][p*sh - ph + r][q*sw - pw + s] (0 outside).
// col needs kSpill<T> elements of slack past its end; rows are written in
// increasing address order, so every spill is overwritten by the next row.
template <typename T>
void im2col(const T* x, const Geometry g, T* col) {  // g by value: stays in registers
  const int64_t PQ = g.pq();
  for (int64_t c = 0; c < g.C; ++c) {
    for (int64_t r = 0; r < g.R; ++r) {
      for (int64_t s = 0; s < g.S; ++s) {
        T* dst = col + ((c * g.R + r) * g.S + s) * PQ;
        int64_t lo, hi;
        valid_q_range(g, s, lo, hi);
        for (int64_t p = 0; p < g.P; ++p) {
          T* d = dst + p * g.Q;
          const int64_t ih = p * g.sh - g.ph + r;
          if (ih < 0 || ih >= g.H) {
            std::fill(d, d + g.Q, T(0));
            continue;
          }
          const T* src = x + (c * g.H + ih) * g.W;
          if (lo > 0) std::fill(d, d + lo, T(0));
          if (g.sw == 1) {
            copy_spill(d + lo, src + (lo - g.pw + s), hi - lo);
          } else {
            for (int64_t q = lo; q < hi; ++q) d[q] = src[q * g.sw - g.pw + s];
          }
          if (hi < g.Q) std::fill(d + hi, d + g.Q, T(0));
        }
      }
    }
  }
}

// The adjoint of im2col: dx[c][ih][iw] += col[...]. dx must start zeroed and
// have kSpill<T> elements of slack past its end (see add_spill). Output rows
// are visited even p first, then odd p, so that consecutive read-modify-writes
// of one image row do not overlap while the previous store is in flight.
template <typename T>
void col2im(const T* col, const Geometry g, T* dx) {  // g by value: stays in registers
  const int64_t PQ = g.pq();
  for (int64_t c = 0; c < g.C; ++c) {
    for (int64_t r = 0; r < g.R; ++r) {
      for (int64_t s = 0; s < g.S; ++s) {
        const T* src = col + ((c * g.R + r) * g.S + s) * PQ;
        int64_t lo, hi;
        valid_q_range(g, s, lo, hi);
        if (hi <= lo) continue;
        for (int64_t parity = 0; parity < 2; ++parity) {
          for (int64_t p = parity; p < g.P; p += 2) {
            const int64_t ih = p * g.sh - g.ph + r;
            if (ih < 0 || ih >= g.H) continue;
            const T* sp = src + p * g.Q;
            T* drow = dx + (c * g.H + ih) * g.W;  // column q lands at q*sw - pw + s
            if (g.sw == 1) {
              add_spill(drow + lo - g.pw + s, sp + lo, hi - lo);
            } else {
              for (int64_t q = lo; q < hi; ++q) drow[q * g.sw - g.pw + s] += sp[q];
            }
          }
        }
      }
    }
  }
}

// Images per chunk so that each chunk holds a worthwhile amount of GEMM work.
int64_t batch_chunks(const Geometry& g) {
  const int64_t flops_per_image = std::max<int64_t>(1, g.K * g.crs() * g.pq());
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / flops_per_image);
  return detail::num_chunks(g.N, grain);
}

template <typename T>
Tensor forward_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dArgs& args) {
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const Geometry g = make_geometry(x, w, args);
  Tensor y = Tensor::empty({g.N, g.K, g.P, g.Q}, x.dtype());
  if (y.numel() == 0) return y;

  const int64_t CRS = g.crs(), PQ = g.pq();
  const bool direct = g.identity_col();
  const int64_t chunks = batch_chunks(g);
  const int64_t col_stride = CRS * PQ + kSpill<T>;  // im2col spills past its end
  Tensor workspace = direct ? Tensor() : Tensor::empty({chunks * col_stride}, x.dtype());

  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = b.defined() ? b.data<T>() : nullptr;
  T* yp = y.data<T>();
  T* ws = direct ? nullptr : workspace.data<T>();

  detail::for_each_chunk(g.N, chunks, [&](int64_t chunk, int64_t n0, int64_t n1) {
    const CMatMap<T> wm(wp, g.K, CRS);
    T* col = direct ? nullptr : ws + chunk * col_stride;
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = xp + n * g.C * g.H * g.W;
      if (!direct) im2col(xn, g, col);
      MatMap<T> out(yp + n * g.K * PQ, g.K, PQ);
      out.noalias() = wm * CMatMap<T>(direct ? xn : col, CRS, PQ);
      if (bp) {
        for (int64_t k = 0; k < g.K; ++k) out.row(k).array() += bp[k];
      }
    }
  });
  return y;
}

template <typename T>
Conv2dGrads backward_impl(const Tensor& gy_in, const Tensor& x_in, const Tensor& w_in, const Conv2dArgs& args,
                          bool need_input, bool need_weight, bool need_bias) {
  Conv2dGrads out;
  if (!need_input && !need_weight && !need_bias) return out;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous();
  const Geometry g = make_geometry(x, w, args);
  const int64_t CRS = g.crs(), PQ = g.pq(), CHW = g.C * g.H * g.W;
  const bool direct = g.identity_col();

  if (need_input) out.input = Tensor::empty(x.shape(), x.dtype());
  if (need_weight) out.weight = Tensor::empty(w.shape(), w.dtype());
  if (need_bias) out.bias = Tensor::empty({g.K}, w.dtype());
  if (g.N == 0 || PQ == 0) {
    if (need_input) out.input.zero_();
    if (need_weight) out.weight.zero_();
    if (need_bias) out.bias.zero_();
    return out;
  }

  const int64_t chunks = batch_chunks(g);
  // Per-chunk buffers: column matrix (weight grad, with im2col's slack),
  // column gradient and a padded image for col2im to accumulate into (input
  // grad), partial weight and bias gradients for chunks after the first
  // (chunk 0 accumulates straight into the outputs).
  const int64_t col_sz = (need_weight && !direct) ? CRS * PQ + kSpill<T> : 0;
  const int64_t dcol_sz = (need_input && !direct) ? CRS * PQ : 0;
  const int64_t img_sz = (need_input && !direct) ? CHW + kSpill<T> : 0;
  const int64_t dw_sz = need_weight ? g.K * CRS : 0;
  const int64_t db_sz = need_bias ? g.K : 0;
  const int64_t partial_off = col_sz + dcol_sz + img_sz;
  const int64_t per_chunk = partial_off + dw_sz + db_sz;
  Tensor workspace = per_chunk > 0 ? Tensor::empty({chunks * per_chunk}, x.dtype()) : Tensor();
  T* ws = per_chunk > 0 ? workspace.data<T>() : nullptr;

  const T* gyp = gy.data<T>();
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  T* gxp = need_input ? out.input.data<T>() : nullptr;
  T* gwp = need_weight ? out.weight.data<T>() : nullptr;
  T* gbp = need_bias ? out.bias.data<T>() : nullptr;

  detail::for_each_chunk(g.N, chunks, [&](int64_t chunk, int64_t n0, int64_t n1) {
    T* base = ws + chunk * per_chunk;
    T* col = base;
    T* dcol = col + col_sz;
    T* img = dcol + dcol_sz;
    T* dw = chunk == 0 ? gwp : base + partial_off;
    T* db = chunk == 0 ? gbp : base + partial_off + dw_sz;
    if (need_weight) std::fill(dw, dw + g.K * CRS, T(0));
    if (need_bias) std::fill(db, db + g.K, T(0));
    const CMatMap<T> wm(wp, g.K, CRS);
    for (int64_t n = n0; n < n1; ++n) {
      const CMatMap<T> gyn(gyp + n * g.K * PQ, g.K, PQ);
      const T* xn = xp + n * CHW;
      if (need_bias) {
        for (int64_t k = 0; k < g.K; ++k) db[k] += gyn.row(k).sum();
      }
      if (need_weight) {
        if (!direct) im2col(xn, g, col);
        MatMap<T> dwm(dw, g.K, CRS);
        dwm.noalias() += gyn * CMatMap<T>(direct ? xn : col, CRS, PQ).transpose();
      }
      if (need_input) {
        T* gxn = gxp + n * CHW;
        if (direct) {
          MatMap<T>(gxn, CRS, PQ).noalias() = wm.transpose() * gyn;
        } else {
          MatMap<T>(dcol, CRS, PQ).noalias() = wm.transpose() * gyn;
          std::fill(img, img + img_sz, T(0));
          col2im(dcol, g, img);
          std::memcpy(gxn, img, CHW * sizeof(T));
        }
      }
    }
  });

  // Reduce the partial weight/bias gradients in chunk order.
  const int64_t step = (g.N + chunks - 1) / chunks, used = (g.N + step - 1) / step;
  for (int64_t c = 1; c < used; ++c) {
    const T* base = ws + c * per_chunk + partial_off;
    if (need_weight) {
      for (int64_t i = 0; i < g.K * CRS; ++i) gwp[i] += base[i];
    }
    if (need_bias) {
      for (int64_t k = 0; k < g.K; ++k) gbp[k] += base[dw_sz + k];
    }
  }
  return out;
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  detail::check_cpu("conv2d_forward", x);
  return detail::dispatch_float(x.dtype(), "conv2d_forward",
                                [&](auto t) { return forward_impl<decltype(t)>(x, weight, bias, args); });
}

Conv2dGrads conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                            const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias) {
  detail::check_cpu("conv2d_backward", x);
  return detail::dispatch_float(x.dtype(), "conv2d_backward", [&](auto t) {
    return backward_impl<decltype(t)>(grad_out, x, weight, args, need_input, need_weight, need_bias);
  });
}

}  // namespace tandem::kernels::cpu
