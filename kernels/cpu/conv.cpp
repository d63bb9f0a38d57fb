// CPU conv2d (NCHW), as im2col + Eigen GEMM. Owns the forward and backward
// kernels declared in kernels/conv.h under tandem::kernels::cpu. Float32
// fast paths (AVX-512, kernels/cpu/simd.h): one-channel 3x3 convs with stride 1
// and padding 0 or 1 use the direct kernels of conv_c1.h (the forward, and the
// weight and bias gradients when no input gradient is asked for), other 3x3 convs
// with stride 1 and padding 1 those of conv3x3.h (forward, input and weight
// gradients), 1x1 and 3x3 convs with stride 2 those of conv_strided.h (the same
// three), the bias gradient beside those two weight gradients in vector lanes
// (conv_taps.h); stride-1 geometries build the column matrix with permutes
// (Im2colPermute; with padding, from a zero-bordered copy of the image) and
// scatter it back with a gather
// (Col2imGather, the same additions in the same order as col2im), else copy
// and add rows with masked loads. bench/PERF_NOTES.md has the numbers. Each
// call is counted in simd_path_count with the level of the rows it ran. Float32 convs with >= 16
// input and output channels run on oneDNN instead where the build has it (kernels/cpu/dnnl.h,
// f32_conv2d_*; counted in gemm_path_count as onednn_f32, the others as eigen), except the stride-2
// 1x1 projections, which the direct kernel runs faster. The geometry and
// the permute plans live in kernels/cpu/conv_plan.h. Autocast's f32 route for a one-channel conv
// (conv2d_c1_*_bf16, kernels/cpu/conv_c1.h) stores its output in bf16 and reads a bf16 output
// gradient through the same forward and backward.
// Assumes: arguments were validated by kernels/conv.cpp (shapes, devices,
// dtypes); inputs may be non-contiguous (made contiguous here).
// Guarantees: outputs are fresh contiguous tensors; the batch is cut into at
// most num_threads() chunks, each doing single-threaded GEMMs into its own
// buffers; weight/bias gradients are summed per chunk and then reduced in
// chunk order, so results are deterministic for a given thread count.
// Gradients that were not asked for are not computed (and cost nothing).
#include "kernels/ops.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/conv3x3.h"
#include "kernels/cpu/conv_c1.h"
#include "kernels/cpu/conv_plan.h"
#include "kernels/cpu/conv_taps.h"
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu {
namespace {

using detail::CMatMap;
using detail::MatMap;
using detail::conv_plan::Col2imGather;
using detail::conv_plan::Geometry;
using detail::conv_plan::Im2colPermute;
using detail::conv_plan::kSpill;
using detail::conv_plan::kVectorRows;
using detail::conv_plan::make_geometry;

// Row copy and add for the short rows of im2col/col2im, for float with AVX-512:
// masked loads (never reading past the source row) and full-width stores, which
// may spill up to kSpill elements past dst + n. Callers own that slack and
// write it properly afterwards (or pad their buffers). Masked stores are
// avoided on purpose: they are slow on some cores and defeat store forwarding.
// Double and other levels copy and add plainly (the compiler vectorises them).

template <typename T>
inline void copy_spill(T* __restrict dst, const T* __restrict src, int64_t n) {
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; i += simd::kFloatLanes) _mm512_storeu_ps(dst + i, simd::load_first(src + i, n - i));
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

// dst[0, n) += src[0, n); dst[n, n + kSpill) is read and written back unchanged.
template <typename T>
inline void add_spill(T* __restrict dst, const T* __restrict src, int64_t n) {
#if TANDEM_SIMD == TANDEM_SIMD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; i += simd::kFloatLanes) {
      _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), simd::load_first(src + i, n - i)));
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
          if (g.vector_rows()) {
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


// im2col through Im2colPermute when it applies, else the general loop.
template <typename T>
struct Im2col {
  explicit Im2col(const Geometry& g) : padded_(g) {
    if constexpr (std::is_same_v<T, float>) {
      fast_ = perm_.plan(g);
      // Stride 1 with padding: the image copied into a zero border, then the permutes of the
      // unpadded geometry (3x3 convolutions with padding 1).
      if (!fast_ && g.sh == 1 && g.sw == 1) {
        padded_.H += 2 * g.ph, padded_.W += 2 * g.pw, padded_.ph = padded_.pw = 0;
        pad_ = perm_.plan(padded_);
      }
    }
  }
  void operator()(const T* x, const Geometry& g, T* col) const {
    if constexpr (std::is_same_v<T, float>) {
      if (fast_) {
        perm_.run(x, g, col);
        return;
      }
      if (pad_) {
        thread_local std::vector<float> image;
        const int64_t HW = padded_.H * padded_.W;
        image.assign(static_cast<size_t>(g.C * HW), 0.0f);
        for (int64_t c = 0; c < g.C; ++c)
          for (int64_t h = 0; h < g.H; ++h)
            std::memcpy(image.data() + c * HW + (h + g.ph) * padded_.W + g.pw, x + (c * g.H + h) * g.W,
                        g.W * sizeof(float));
        perm_.run(image.data(), padded_, col);
        return;
      }
    }
    im2col(x, g, col);
  }

 private:
  bool fast_ = false, pad_ = false;
  Geometry padded_;
  Im2colPermute perm_;
};

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
            if (g.vector_rows()) {
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

// out_dtype: x's, or bf16 for autocast's one-channel conv (conv2d_c1_forward_bf16).
template <typename T>
Tensor forward_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dArgs& args,
                    DType out_dtype) {
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const Geometry g = make_geometry(x, w, args);
  if constexpr (std::is_same_v<T, float>) {
    Tensor y;
    if (out_dtype == x.dtype() && f32_conv2d_forward(x, w, b, args, y)) return y;  // oneDNN (kernels/cpu/dnnl.h)
  }
  Tensor y = Tensor::empty({g.N, g.K, g.P, g.Q}, out_dtype);
  detail::count_gemm_path(GemmKernel::conv2d_forward, GemmPath::eigen);
  const bool strided = std::is_same_v<T, float> && g.direct_strided();  // conv_strided.h's vector kernels
  detail::count_simd_path(SimdKernel::conv2d_forward,
                          detail::simd_path<T>(kVectorRows && (g.vector_rows() || strided)));
  if (y.numel() == 0) return y;

  const int64_t CRS = g.crs(), PQ = g.pq();
  const bool direct = g.identity_col();
  const int64_t chunks = batch_chunks(g);
  if constexpr (std::is_same_v<T, float>) {
    const float* bp = b.defined() ? b.data<float>() : nullptr;
    if (g.direct_c1()) {
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        if (out_dtype == kBFloat16) {
          detail::conv_c1_forward(x.data<float>(), w.data<float>(), bp, static_cast<uint16_t*>(y.raw_data()), n0, n1,
                                  g.H, g.W, g.K, g.ph);
        } else {
          detail::conv_c1_forward(x.data<float>(), w.data<float>(), bp, y.data<float>(), n0, n1, g.H, g.W, g.K, g.ph);
        }
      });
      return y;
    }
    if (g.direct_3x3()) {
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv3x3_forward(x.data<float>(), w.data<float>(), bp, y.data<float>(), n0, n1, g.C, g.H, g.W, g.K);
      });
      return y;
    }
    if (strided) {
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv_strided_forward(x.data<float>(), w.data<float>(), bp, y.data<float>(), n0, n1, g.strided());
      });
      return y;
    }
  }
  const int64_t col_stride = CRS * PQ + kSpill<T>;  // im2col spills past its end
  Tensor workspace = direct ? Tensor() : Tensor::empty({chunks * col_stride}, x.dtype());

  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = b.defined() ? b.data<T>() : nullptr;
  T* yp = y.data<T>();
  T* ws = direct ? nullptr : workspace.data<T>();

  const Im2col<T> to_columns(g);
  detail::for_each_chunk(g.N, chunks, [&](int64_t chunk, int64_t n0, int64_t n1) {
    const CMatMap<T> wm(wp, g.K, CRS);
    T* col = direct ? nullptr : ws + chunk * col_stride;
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = xp + n * g.C * g.H * g.W;
      if (!direct) to_columns(xn, g, col);
      MatMap<T> out(yp + n * g.K * PQ, g.K, PQ);
      // Eigen's "=" zero-fills the destination and then accumulates into it;
      // starting from the bias instead saves a separate pass for the bias.
      if (bp) {
        for (int64_t k = 0; k < g.K; ++k) out.row(k).setConstant(bp[k]);
      } else {
        out.setZero();
      }
      out.noalias() += wm * CMatMap<T>(direct ? xn : col, CRS, PQ);
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
  if constexpr (std::is_same_v<T, float>) {
    if (f32_conv2d_backward(gy, x, w, args, need_input, need_weight, need_bias, out)) return out;
  }
  detail::count_gemm_path(GemmKernel::conv2d_backward, GemmPath::eigen);
  const int64_t CRS = g.crs(), PQ = g.pq(), CHW = g.C * g.H * g.W;
  const bool direct = g.identity_col();
  // Weight and bias gradients of a one-channel 3x3 conv: direct kernels, no column matrix.
  const bool c1 = std::is_same_v<T, float> && !need_input && g.direct_c1();
  const bool strided = std::is_same_v<T, float> && g.direct_strided();  // conv_strided.h's vector kernels
  const bool rows = c1 || ((need_input || need_weight) && (g.vector_rows() || strided));
  detail::count_simd_path(SimdKernel::conv2d_backward, detail::simd_path<T>(kVectorRows && rows));

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
  if constexpr (std::is_same_v<T, float>) {
    if (need_input && g.direct_3x3()) {  // the input gradient here, the weight and bias below
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv3x3_input_grad(gy.data<float>(), w.data<float>(), out.input.data<float>(), n0, n1, g.C, g.H, g.W,
                                   g.K);
      });
      need_input = false;
    }
    if (need_input && strided) {
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv_strided_input_grad(gy.data<float>(), w.data<float>(), out.input.data<float>(), n0, n1,
                                        g.strided());
      });
      need_input = false;
    }
  }
  // Per-chunk buffers: column matrix (weight grad, with im2col's slack),
  // column gradient and a padded image for col2im to accumulate into (input
  // grad), partial weight and bias gradients for chunks after the first
  // (chunk 0 accumulates straight into the outputs).
  // 3x3, stride 1, padding 1: the weight gradient from the direct kernel too (the bias below).
  // Stride 2 (conv_strided.h): the weight gradient from its direct kernel likewise.
  const bool w3 = std::is_same_v<T, float> && need_weight && !need_input && g.direct_3x3();
  const bool ws2 = need_weight && !need_input && strided;
  // With either, the bias gradient in vector lanes over gy in place (kernels/cpu/conv_taps.h).
  const bool direct_bias = need_bias && (w3 || ws2);
  const int64_t col_sz = (need_weight && !direct && !c1 && !w3 && !ws2) ? CRS * PQ + kSpill<T> : 0;
  const int64_t dcol_sz = (need_input && !direct) ? CRS * PQ : 0;
  const int64_t img_sz = (need_input && !direct) ? CHW + kSpill<T> : 0;
  const int64_t dw_sz = need_weight ? g.K * CRS : 0;
  const int64_t db_sz = need_bias ? g.K : 0;
  const int64_t partial_off = col_sz + dcol_sz + img_sz;
  const int64_t per_chunk = partial_off + dw_sz + db_sz;
  Tensor workspace = per_chunk > 0 ? Tensor::empty({chunks * per_chunk}, x.dtype()) : Tensor();
  T* ws = per_chunk > 0 ? workspace.data<T>() : nullptr;

  // A bf16 gy only reaches the one-channel weight gradient (conv2d_c1_backward_bf16).
  const bool gy_bf16 = gy.dtype() == kBFloat16;
  const T* gyp = gy_bf16 ? nullptr : gy.data<T>();
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  T* gxp = need_input ? out.input.data<T>() : nullptr;
  T* gwp = need_weight ? out.weight.data<T>() : nullptr;
  T* gbp = need_bias ? out.bias.data<T>() : nullptr;

  const Im2col<T> to_columns(g);
  Col2imGather gather;
  const bool gather_ok = std::is_same_v<T, float> && need_input && !direct && gather.plan(g);
  detail::for_each_chunk(g.N, chunks, [&](int64_t chunk, int64_t n0, int64_t n1) {
    T* base = ws + chunk * per_chunk;
    T* col = base;
    T* dcol = col + col_sz;
    T* img = dcol + dcol_sz;
    T* dw = chunk == 0 ? gwp : base + partial_off;
    T* db = chunk == 0 ? gbp : base + partial_off + dw_sz;
    if (need_weight) std::fill(dw, dw + g.K * CRS, T(0));
    if (need_bias) std::fill(db, db + g.K, T(0));
    if constexpr (std::is_same_v<T, float>) {
      if (c1) {
        float* dwp = need_weight ? dw : nullptr;
        float* dbp = need_bias ? db : nullptr;
        if (gy_bf16) {
          detail::conv_c1_weight_grad(static_cast<const uint16_t*>(gy.raw_data()), xp, dwp, dbp, n0, n1, g.H, g.W,
                                      g.K, g.ph);
        } else {
          detail::conv_c1_weight_grad(gyp, xp, dwp, dbp, n0, n1, g.H, g.W, g.K, g.ph);
        }
        return;
      }
      if (w3) detail::conv3x3_weight_grad(gyp, xp, dw, n0, n1, g.C, g.H, g.W, g.K);
      if (ws2) detail::conv_strided_weight_grad(gyp, xp, dw, n0, n1, g.strided());
      if (direct_bias) detail::bias_grad(gyp, n0, n1, g.K, PQ, db);
    }
    const CMatMap<T> wm(wp, g.K, CRS);
    for (int64_t n = n0; n < n1; ++n) {
      const CMatMap<T> gyn(gyp + n * g.K * PQ, g.K, PQ);
      const T* xn = xp + n * CHW;
      if (need_bias && !direct_bias) {
        for (int64_t k = 0; k < g.K; ++k) db[k] += gyn.row(k).sum();
      }
      if (need_weight && !w3 && !ws2) {
        if (!direct) to_columns(xn, g, col);
        MatMap<T> dwm(dw, g.K, CRS);
        dwm.noalias() += gyn * CMatMap<T>(direct ? xn : col, CRS, PQ).transpose();
      }
      if (need_input) {
        T* gxn = gxp + n * CHW;
        if (direct) {
          MatMap<T>(gxn, CRS, PQ).noalias() = wm.transpose() * gyn;
        } else {
          MatMap<T>(dcol, CRS, PQ).noalias() = wm.transpose() * gyn;
          bool gathered = false;
          if constexpr (std::is_same_v<T, float>) {
            if (gather_ok) {
              gather.run(dcol, g, gxn);
              gathered = true;
            }
          }
          if (!gathered) {
            std::fill(img, img + img_sz, T(0));
            col2im(dcol, g, img);
            std::memcpy(gxn, img, CHW * sizeof(T));
          }
        }
      }
    }
  });

  // Reduce the partial weight/bias gradients in chunk order.
  const int64_t used = detail::used_chunks(g.N, chunks);
  if (need_weight) detail::add_chunk_partials(gwp, ws + partial_off, per_chunk, g.K * CRS, used);
  if (need_bias) detail::add_chunk_partials(gbp, ws + partial_off + dw_sz, per_chunk, g.K, used);
  return out;
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  detail::check_cpu("conv2d_forward", x);
  return detail::dispatch_float(x.dtype(), "conv2d_forward",
                                [&](auto t) { return forward_impl<decltype(t)>(x, weight, bias, args, x.dtype()); });
}

bool conv2d_c1_bf16_applies(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& a) {
  const auto f32_cpu = [](const Tensor& t) { return t.defined() && t.device().is_cpu() && t.dtype() == kFloat32; };
  return f32_cpu(x) && f32_cpu(w) && (!b.defined() || (f32_cpu(b) && b.dim() == 1 && b.size(0) == w.size(0))) &&
         x.dim() == 4 && w.dim() == 4 && x.size(1) == 1 && w.size(1) == 1 && x.size(2) + 2 * a.pad_h >= 3 &&
         x.size(3) + 2 * a.pad_w >= 3 &&
         detail::conv_c1_supported(1, w.size(2), w.size(3), a.stride_h, a.stride_w, a.pad_h, a.pad_w);
}

bool conv2d_c1_bf16_backward_applies(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& a) {
  return gy.defined() && gy.device().is_cpu() && gy.dtype() == kBFloat16 && conv2d_c1_bf16_applies(x, w, Tensor(), a) &&
         gy.shape() == Shape{x.size(0), w.size(0), x.size(2) + 2 * a.pad_h - 2, x.size(3) + 2 * a.pad_w - 2};
}

Tensor conv2d_c1_forward_bf16(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args) {
  return forward_impl<float>(x, w, b, args, kBFloat16);
}

Conv2dGrads conv2d_c1_backward_bf16(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& args,
                                    bool need_weight, bool need_bias) {
  return backward_impl<float>(gy, x, w, args, false, need_weight, need_bias);
}

Conv2dGrads conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                            const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias) {
  detail::check_cpu("conv2d_backward", x);
  return detail::dispatch_float(x.dtype(), "conv2d_backward", [&](auto t) {
    return backward_impl<decltype(t)>(grad_out, x, weight, args, need_input, need_weight, need_bias);
  });
}

}  // namespace tandem::kernels::cpu
