// CPU conv2d (NCHW), as im2col + Eigen GEMM. Owns the forward and backward
// kernels declared in kernels/conv.h under tandem::kernels::cpu. Float32
// fast paths (AVX-512, kernels/cpu/simd.h): one-channel 3x3 convs use the
// direct kernels of conv_c1.h, 3x3 convs with stride 1 and padding 1 those of
// conv3x3.h (forward, input and weight gradients); stride-1 geometries build the column matrix
// with permutes (Im2colPermute; with padding, from a zero-bordered copy of
// the image) and scatter it back with a gather
// (Col2imGather, the same additions in the same order as col2im), else copy
// and add rows with masked loads. bench/PERF_NOTES.md has the numbers. Each
// call is counted in simd_path_count with the level of the rows it ran. Float32 convs with >= 16
// input and output channels run on oneDNN instead where the build has it (kernels/cpu/dnnl.h,
// f32_conv2d_*; counted in gemm_path_count as onednn_f32, the others as eigen).
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
#include "kernels/cpu/simd.h"

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
  // One input channel, 3x3, stride 1, no padding: the direct kernels of conv_c1.h (float32).
  bool direct_c1() const { return detail::conv_c1_supported(C, R, S, sh, sw, ph, pw); }
  // 3x3, stride 1, padding 1, up to 64 channels: the direct kernels of conv3x3.h (float32).
  bool direct_3x3() const { return detail::conv3x3_supported(C, K, R, S, sh, sw, ph, pw); }
  // A float32 column matrix is built and scattered with vector rows (copy_spill, add_spill,
  // Im2colPermute, Col2imGather) where they are compiled in: rows of stride 1. The direct kernels'
  // geometry is one of these.
  bool vector_rows() const { return !identity_col() && sw == 1; }
};

// The vector rows are written for AVX-512 only; other levels run im2col/col2im and Eigen.
constexpr bool kVectorRows = kSimdLevel == SimdLevel::avx512;

Geometry make_geometry(const Tensor& x, const Tensor& w, const Conv2dArgs& a) {
  Geometry g{};
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.K = w.size(0), g.R = w.size(2), g.S = w.size(3);
  g.sh = a.stride_h, g.sw = a.stride_w, g.ph = a.pad_h, g.pw = a.pad_w;
  g.P = (g.H + 2 * g.ph - g.R) / g.sh + 1;
  g.Q = (g.W + 2 * g.pw - g.S) / g.sw + 1;
  return g;
}

// Row copy and add for the short rows of im2col/col2im, for float with AVX-512:
// masked loads (never reading past the source row) and full-width stores, which
// may spill up to kSpill elements past dst + n. Callers own that slack and
// write it properly afterwards (or pad their buffers). Masked stores are
// avoided on purpose: they are slow on some cores and defeat store forwarding.
// Double and other levels copy and add plainly (the compiler vectorises them).
template <typename T>
constexpr int64_t kSpill = 64 / sizeof(T);

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

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// im2col for float, stride 1, no padding, when each output vector of 16
// column-matrix elements comes from a source span of at most 32 floats (true
// for the MNIST conv2: Q = 11, W = 13). A row (c, r, s) of the column matrix
// is the P x Q window of channel c at (r, s) read with pitch W; output vector
// j is one permute (vpermt2ps) of two masked loads at a fixed offset from the
// window start, then one full store. This replaces Q-float row copies whose
// overlapping, line-splitting stores dominated the general im2col. Spill
// past the end of a row: as im2col (kSpill slack, overwritten by the next row).
class Im2colPermute {
 public:
  static constexpr int64_t kMaxVectors = 64;

  // False when the geometry does not qualify (then use im2col).
  bool plan(const Geometry& g) {
    if (g.sh != 1 || g.sw != 1 || g.ph != 0 || g.pw != 0 || g.Q <= 0 || g.P <= 0) return false;
    const int64_t PQ = g.pq();
    nvec_ = (PQ + 15) / 16;
    if (nvec_ > kMaxVectors) return false;
    for (int64_t j = 0; j < nvec_; ++j) {
      const int64_t first = 16 * j, lanes = std::min<int64_t>(16, PQ - first);
      auto src = [&](int64_t i) { return (i / g.Q) * g.W + i % g.Q; };
      lo_[j] = src(first);
      alignas(64) int32_t idx[16] = {};
      int64_t span = 0;
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t rel = src(first + l) - lo_[j];
        if (rel >= 32) return false;
        idx[l] = static_cast<int32_t>(rel);
        span = std::max(span, rel + 1);
      }
      idx_[j] = _mm512_load_si512(idx);
      ma_[j] = simd::lane_mask(span);
      mb_[j] = simd::lane_mask(span - 16);
    }
    return true;
  }

  void run(const float* x, const Geometry& g, float* col) const {
    const int64_t PQ = g.pq();
    for (int64_t c = 0; c < g.C; ++c) {
      for (int64_t r = 0; r < g.R; ++r) {
        for (int64_t s = 0; s < g.S; ++s) {
          float* dst = col + ((c * g.R + r) * g.S + s) * PQ;
          const float* base = x + (c * g.H + r) * g.W + s;
          for (int64_t j = 0; j < nvec_; ++j) {
            const float* p = base + lo_[j];
            const __m512 a = _mm512_maskz_loadu_ps(ma_[j], p), b = _mm512_maskz_loadu_ps(mb_[j], p + 16);
            _mm512_storeu_ps(dst + 16 * j, _mm512_permutex2var_ps(a, idx_[j], b));
          }
        }
      }
    }
  }

 private:
  int64_t nvec_ = 0;
  int64_t lo_[kMaxVectors];
  __m512i idx_[kMaxVectors];
  __mmask16 ma_[kMaxVectors], mb_[kMaxVectors];
};

// col2im for float and stride 1 (any padding) as a gather: each output
// vector of 16 image pixels of channel c sums, over (r, s) in the same order
// as col2im, one permute of two masked loads from column-matrix row (c, r, s),
// with lanes that kernel tap does not reach zeroed; then one store. No
// zero-fill, no read-modify-write of the image, nothing written past it, and
// per pixel the same additions in the same order as col2im (so the same bits).
// Applies when, for every (r, s, vector), the reached source elements span at
// most 32 floats.
class Col2imGather {
 public:
  bool plan(const Geometry& g) {
    if (g.sh != 1 || g.sw != 1 || g.P <= 0 || g.Q <= 0) return false;
    const int64_t HW = g.H * g.W;
    nvec_ = (HW + 15) / 16;
    if (nvec_ * g.R * g.S > 4096) return false;
    taps_.assign(static_cast<size_t>(g.R * g.S * nvec_), Tap{});
    for (int64_t r = 0; r < g.R; ++r) {
      for (int64_t s = 0; s < g.S; ++s) {
        for (int64_t j = 0; j < nvec_; ++j) {
          Tap& t = taps_[(r * g.S + s) * nvec_ + j];
          int64_t src[16], lo = -1, hi = -1;
          for (int64_t l = 0; l < 16; ++l) {
            src[l] = -1;
            const int64_t i = 16 * j + l;
            if (i >= HW) continue;
            const int64_t p = i / g.W + g.ph - r, q = i % g.W + g.pw - s;
            if (p < 0 || p >= g.P || q < 0 || q >= g.Q) continue;
            src[l] = p * g.Q + q;
            lo = lo < 0 ? src[l] : std::min(lo, src[l]);
            hi = std::max(hi, src[l]);
          }
          if (lo < 0) continue;  // this tap reaches no pixel of the vector: lanes stays 0
          const int64_t span = hi - lo + 1;
          if (span > 32) return false;
          alignas(64) int32_t idx[16] = {};
          unsigned lanes = 0;
          for (int l = 0; l < 16; ++l) {
            if (src[l] < 0) continue;
            idx[l] = static_cast<int32_t>(src[l] - lo);
            lanes |= 1u << l;
          }
          t.lo = lo;
          t.idx = _mm512_load_si512(idx);
          t.lanes = __mmask16(lanes);
          t.ma = simd::lane_mask(span);
          t.mb = simd::lane_mask(span - 16);
        }
      }
    }
    return true;
  }

  // dx[c] = sum over (r, s) of the reached dcol elements, for all channels.
  void run(const float* dcol, const Geometry& g, float* dx) const {
    const int64_t PQ = g.pq(), HW = g.H * g.W, RS = g.R * g.S;
    for (int64_t c = 0; c < g.C; ++c) {
      const float* rows = dcol + c * RS * PQ;
      float* out = dx + c * HW;
      for (int64_t j = 0; j < nvec_; ++j) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t rs = 0; rs < RS; ++rs) {
          const Tap& t = taps_[rs * nvec_ + j];
          if (!t.lanes) continue;
          const float* p = rows + rs * PQ + t.lo;
          const __m512 a = _mm512_maskz_loadu_ps(t.ma, p), b = _mm512_maskz_loadu_ps(t.mb, p + 16);
          acc = _mm512_add_ps(acc, _mm512_maskz_permutex2var_ps(t.lanes, a, t.idx, b));
        }
        simd::store_first(out + 16 * j, acc, HW - 16 * j);
      }
    }
  }

 private:
  struct Tap {
    __m512i idx;
    int64_t lo = 0;
    __mmask16 lanes = 0, ma = 0, mb = 0;
  };
  int64_t nvec_ = 0;
  std::vector<Tap> taps_;
};

#else  // no AVX-512: the plans never apply, im2col and col2im run instead

struct Im2colPermute {
  bool plan(const Geometry&) { return false; }
  void run(const float*, const Geometry&, float*) const {}
};
struct Col2imGather {
  bool plan(const Geometry&) { return false; }
  void run(const float*, const Geometry&, float*) const {}
};

#endif

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

template <typename T>
Tensor forward_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dArgs& args) {
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const Geometry g = make_geometry(x, w, args);
  if constexpr (std::is_same_v<T, float>) {
    Tensor y;
    if (f32_conv2d_forward(x, w, b, args, y)) return y;  // oneDNN (kernels/cpu/dnnl.h)
  }
  Tensor y = Tensor::empty({g.N, g.K, g.P, g.Q}, x.dtype());
  detail::count_gemm_path(GemmKernel::conv2d_forward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_forward, detail::simd_path<T>(kVectorRows && g.vector_rows()));
  if (y.numel() == 0) return y;

  const int64_t CRS = g.crs(), PQ = g.pq();
  const bool direct = g.identity_col();
  const int64_t chunks = batch_chunks(g);
  if constexpr (std::is_same_v<T, float>) {
    const float* bp = b.defined() ? b.data<float>() : nullptr;
    if (g.direct_c1()) {
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv_c1_forward(x.data<float>(), w.data<float>(), bp, y.data<float>(), n0, n1, g.H, g.W, g.K);
      });
      return y;
    }
    if (g.direct_3x3()) {
      detail::for_each_chunk(g.N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv3x3_forward(x.data<float>(), w.data<float>(), bp, y.data<float>(), n0, n1, g.C, g.H, g.W, g.K);
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
  const bool rows = c1 || ((need_input || need_weight) && g.vector_rows());
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
  }
  // Per-chunk buffers: column matrix (weight grad, with im2col's slack),
  // column gradient and a padded image for col2im to accumulate into (input
  // grad), partial weight and bias gradients for chunks after the first
  // (chunk 0 accumulates straight into the outputs).
  // 3x3, stride 1, padding 1: the weight gradient from the direct kernel too (the bias below).
  const bool w3 = std::is_same_v<T, float> && need_weight && !need_input && g.direct_3x3();
  const int64_t col_sz = (need_weight && !direct && !c1 && !w3) ? CRS * PQ + kSpill<T> : 0;
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
        detail::conv_c1_weight_grad(gyp, xp, need_weight ? dw : nullptr, need_bias ? db : nullptr, n0, n1, g.H,
                                    g.W, g.K);
        return;
      }
      if (w3) detail::conv3x3_weight_grad(gyp, xp, dw, n0, n1, g.C, g.H, g.W, g.K);
    }
    const CMatMap<T> wm(wp, g.K, CRS);
    for (int64_t n = n0; n < n1; ++n) {
      const CMatMap<T> gyn(gyp + n * g.K * PQ, g.K, PQ);
      const T* xn = xp + n * CHW;
      if (need_bias) {
        for (int64_t k = 0; k < g.K; ++k) db[k] += gyn.row(k).sum();
      }
      if (need_weight && !w3) {
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
