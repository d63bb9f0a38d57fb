// CPU linear forward/backward and matmul (kernels/linear.h) under
// tandem::kernels::cpu, on Eigen GEMM.
// Assumes: validated by kernels/linear.cpp; inputs may be non-contiguous
// (copied to contiguous, except that matmul reads a plain transpose of a
// contiguous matrix in place).
// Guarantees: fresh contiguous outputs; each output element is computed by
// exactly one thread in an order fixed by the shapes and the thread count.
// Linear in float32 with a narrow batch (<= 256) on an AVX-512 build runs on
// kernels/cpu/small_gemm (weight read in place, never packed; the batch side packed
// only where it must be transposed, by 16 x 16 register transposes over the pool;
// the products without a transpose split over input features, each thread reading
// only its columns; bits that do not depend on the thread count either, bench/PERF_NOTES.md
// section 25); each linear_forward/backward call is
// counted in simd_path_count (kernels/cpu/simd.h): avx512 when it used it, and in gemm_path_count
// (kernels/cpu/dnnl.h): small_gemm or eigen. Float32 stays off oneDNN: measured at 1 thread on Zen 4
// its f32 matmul gained 0-25% over these paths on MnistNet's shapes, with bits that change with
// the thread count (bench/PERF_NOTES.md section 14). Otherwise Eigen GEMMs, one per block of
// the output: Linear splits along the weight's dimension (output features for
// forward and the weight gradient, input features for the input gradient) in
// blocks of at most kMaxBlock, so every thread packs only its share of the
// weight. Numbers: bench/PERF_NOTES.md section 6.
#include "kernels/ops.h"

#include "kernels/cpu/common.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/small_gemm.h"

#include <type_traits>

namespace tandem::kernels::cpu {
namespace {

using detail::CMatMap;
using detail::MatMap;

template <typename T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <typename T>
using CColMap = Eigen::Map<const ColMat<T>, Eigen::Unaligned>;
template <typename T>
using CRowVecMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>, Eigen::Unaligned>;
template <typename T>
using RowVecMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>, Eigen::Unaligned>;

// Chunks of output rows so that each holds >= ~256K multiply-adds.
int64_t row_chunks(int64_t rows, int64_t work_per_row) {
  return detail::num_chunks(rows,
                            std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, work_per_row)));
}

constexpr int64_t kMaxBlock = 256;

// Calls fn(begin, end) in parallel over blocks of [0, n): width at most
// kMaxBlock and about n / threads, a multiple of 16 (SIMD width); one block
// when the whole product (n * work_per_item multiply-adds) is small.
template <typename Fn>
void for_each_block(int64_t n, int64_t work_per_item, Fn&& fn) {
  if (n <= 0) return;
  if (n * std::max<int64_t>(1, work_per_item) < (int64_t{1} << 18)) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t threads = num_threads();
  int64_t width = std::min<int64_t>(kMaxBlock, (n + threads - 1) / threads);
  width = std::min<int64_t>(n, (width + 15) / 16 * 16);
  detail::for_each_chunk(n, (n + width - 1) / width, [&](int64_t, int64_t b, int64_t e) { fn(b, e); });
}

// ---- float32 products on the AVX-512 small GEMM (kernels/cpu/small_gemm.h) ----
// Used when the batch is narrow (N <= kSmallMaxBatch) and the product is big enough to matter:
// the weight is read in place (never packed), only the batch-sized operand is packed. Batch-64
// MLP layers 2048x2048, 1 thread: ~150-175 GFLOP/s vs Eigen's ~90-110 (bench/PERF_NOTES.md).
constexpr int64_t kSmallMaxBatch = 256;

bool use_small(int64_t N, int64_t other1, int64_t other2) {
  return N <= kSmallMaxBatch && N * other1 * other2 >= (int64_t{1} << 18) && detail::small_gemm_available();
}

// Runs small_gemm over rows [0, M) of C, split across threads on multiples of the 6-row tile.
void small_gemm_parallel(int64_t M, int64_t J, int64_t K, const float* a, int64_t a_rs, int64_t a_ks,
                         const detail::BOperand& b, float* c, int64_t ldc) {
  const int64_t tiles = (M + 5) / 6;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / (6 * J * K + 1));  // tiles per chunk
  detail::for_each_chunk(tiles, detail::num_chunks(tiles, grain), [&](int64_t, int64_t t0, int64_t t1) {
    detail::small_gemm(t0 * 6, std::min(M, t1 * 6), J, K, a, a_rs, a_ks, b, c, ldc);
  });
}

// Runs small_gemm over columns [0, J) of C, split across threads on whole panels: each thread reads
// only its columns of B (read in place) and writes only its columns of C.
void small_gemm_columns(int64_t M, int64_t J, int64_t K, const float* a, int64_t a_rs, int64_t a_ks,
                        const detail::BOperand& b, float* c, int64_t ldc) {
  const int64_t panels = (J + detail::kPanel - 1) / detail::kPanel;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / (M * K * detail::kPanel + 1));  // panels
  detail::for_each_chunk(panels, detail::num_chunks(panels, grain), [&](int64_t, int64_t p0, int64_t p1) {
    const int64_t j0 = p0 * detail::kPanel, j1 = std::min(J, p1 * detail::kPanel);
    detail::small_gemm(0, M, j1 - j0, K, a, a_rs, a_ks, b.from_column(j0), c + j0, ldc);
  });
}

// Packs B = src^T (src row-major [J, K]) for small_gemm, rows of B in slices of 16 over the pool.
Tensor packed_transpose(const float* src, int64_t J, int64_t K) {
  Tensor packed = Tensor::empty({detail::packed_b_size(K, J)}, kFloat32);
  float* dst = packed.data<float>();
  const int64_t tiles = (K + 15) / 16, per_tile = 16 * ((J + detail::kPanel - 1) / detail::kPanel * detail::kPanel);
  detail::parallel_range(tiles, std::max<int64_t>(1, (int64_t{1} << 15) / per_tile), [&](int64_t t0, int64_t t1) {
    detail::pack_b_transposed(src, K, K, J, dst, t0 * 16, std::min(K, t1 * 16));
  });
  return packed;
}

// dst[n, m] = src[m, n] (+ bias[m]) for src [M, N] row-major, dst [N, M] row-major.
void transpose_into(const float* src, int64_t M, int64_t N, const float* bias, float* dst) {
  detail::parallel_range(N, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, M)),
                         [&](int64_t n0, int64_t n1) {
                           for (int64_t n = n0; n < n1; ++n) {
                             float* row = dst + n * M;
                             for (int64_t m = 0; m < M; ++m) row[m] = src[m * N + n] + (bias ? bias[m] : 0.0f);
                           }
                         });
}

// y [N, O] = x [N, I] * w [O, I]^T + b: y^T = w * x^T, x^T packed, w read in place.
Tensor small_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  const Tensor packed = packed_transpose(x.data<float>(), N, I);
  Tensor yt = Tensor::empty({O, N}, kFloat32);
  Tensor y = Tensor::empty({N, O}, kFloat32);
  small_gemm_parallel(O, N, I, w.data<float>(), I, 1, detail::BOperand::packed(packed.data<float>(), I),
                      yt.data<float>(), N);
  transpose_into(yt.data<float>(), O, N, b.defined() ? b.data<float>() : nullptr, y.data<float>());
  return y;
}

// gx [N, I] = gy [N, O] * w [O, I]. A long reduction (O >= 256): gx^T = w^T * gy^T, gy^T packed, w read
// in place (transposed). A short one: gy read in place as A and w as B, split over the input features.
Tensor small_input_grad(const Tensor& gy, const Tensor& w) {
  const int64_t N = gy.size(0), O = gy.size(1), I = w.size(1);
  Tensor gx = Tensor::empty({N, I}, kFloat32);
  if (O < 256) {
    small_gemm_columns(N, I, O, gy.data<float>(), O, 1, detail::BOperand::rows(w.data<float>(), I),
                       gx.data<float>(), I);
    return gx;
  }
  const Tensor packed = packed_transpose(gy.data<float>(), N, O);
  Tensor gxt = Tensor::empty({I, N}, kFloat32);
  small_gemm_parallel(I, N, O, w.data<float>(), 1, I, detail::BOperand::packed(packed.data<float>(), O),
                      gxt.data<float>(), N);
  transpose_into(gxt.data<float>(), I, N, nullptr, gx.data<float>());
  return gx;
}

// gw [O, I] = gy [N, O]^T * x [N, I]: gy read in place (transposed) as A, x in place as B, split over
// the input features.
Tensor small_weight_grad(const Tensor& gy, const Tensor& x) {
  const int64_t N = gy.size(0), O = gy.size(1), I = x.size(1);
  Tensor gw = Tensor::empty({O, I}, kFloat32);
  small_gemm_columns(O, I, N, gy.data<float>(), 1, O, detail::BOperand::rows(x.data<float>(), I),
                     gw.data<float>(), I);
  return gw;
}

template <typename T>
Tensor forward_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  const bool small = std::is_same_v<T, float> && I > 0 && use_small(N, I, O);
  detail::count_simd_path(SimdKernel::linear_forward, detail::simd_path<T>(small));
  detail::count_gemm_path(GemmKernel::linear_forward, small ? GemmPath::small_gemm : GemmPath::eigen);
  if constexpr (std::is_same_v<T, float>) {
    if (small) return small_forward(x, w, b);
  }
  Tensor y = Tensor::empty({N, O}, x.dtype());
  const CMatMap<T> X(x.data<T>(), N, I), Wm(w.data<T>(), O, I);
  MatMap<T> Y(y.data<T>(), N, O);
  const T* bp = b.defined() ? b.data<T>() : nullptr;
  if (O >= N) {  // split the output features: each block packs only its rows of the weight
    for_each_block(O, N * I, [&](int64_t c0, int64_t c1) {
      auto cols = Y.middleCols(c0, c1 - c0);
      if (I == 0) {
        cols.setZero();
      } else {
        cols.noalias() = X * Wm.middleRows(c0, c1 - c0).transpose();
      }
      if (bp) cols.rowwise() += CRowVecMap<T>(bp + c0, c1 - c0);
    });
    return y;
  }
  detail::for_each_chunk(N, row_chunks(N, I * O), [&](int64_t, int64_t r0, int64_t r1) {
    auto rows = Y.middleRows(r0, r1 - r0);
    if (I == 0) {
      rows.setZero();
    } else {
      rows.noalias() = X.middleRows(r0, r1 - r0) * Wm.transpose();
    }
    if (bp) rows.rowwise() += CRowVecMap<T>(bp, O);
  });
  return y;
}

template <typename T>
LinearGrads backward_impl(const Tensor& gy_in, const Tensor& x_in, const Tensor& w_in, bool need_input,
                          bool need_weight, bool need_bias) {
  LinearGrads g;
  if (!need_input && !need_weight && !need_bias) return g;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  const CMatMap<T> GY(gy.data<T>(), N, O), X(x.data<T>(), N, I), Wm(w.data<T>(), O, I);
  const bool small_input = std::is_same_v<T, float> && need_input && use_small(N, I, O);
  const bool small_weight = std::is_same_v<T, float> && need_weight && N > 0 && use_small(N, I, O);
  detail::count_simd_path(SimdKernel::linear_backward, detail::simd_path<T>(small_input || small_weight));
  detail::count_gemm_path(GemmKernel::linear_backward,
                          small_input || small_weight ? GemmPath::small_gemm : GemmPath::eigen);
  if (need_input) {
    bool done = false;
    if constexpr (std::is_same_v<T, float>) {
      if (small_input) {
        g.input = small_input_grad(gy, w);
        done = true;
      }
    }
    if (!done) g.input = Tensor::empty({N, I}, x.dtype());
    MatMap<T> GX(g.input.data<T>(), N, I);
    if (!done && I >= N) {  // split the input features: each block packs only its columns of the weight
      for_each_block(I, N * O, [&](int64_t c0, int64_t c1) {
        auto cols = GX.middleCols(c0, c1 - c0);
        if (O == 0) {
          cols.setZero();
        } else {
          cols.noalias() = GY * Wm.middleCols(c0, c1 - c0);
        }
      });
    } else if (!done) {
      detail::for_each_chunk(N, row_chunks(N, I * O), [&](int64_t, int64_t r0, int64_t r1) {
        auto rows = GX.middleRows(r0, r1 - r0);
        if (O == 0) {
          rows.setZero();
        } else {
          rows.noalias() = GY.middleRows(r0, r1 - r0) * Wm;
        }
      });
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (small_weight) {
      g.weight = small_weight_grad(gy, x);
      need_weight = false;
    }
  }
  if (need_weight) {
    g.weight = Tensor::empty({O, I}, w.dtype());
    MatMap<T> GW(g.weight.data<T>(), O, I);
    for_each_block(O, N * I, [&](int64_t r0, int64_t r1) {
      auto rows = GW.middleRows(r0, r1 - r0);
      if (N == 0) {
        rows.setZero();
      } else {
        rows.noalias() = GY.middleCols(r0, r1 - r0).transpose() * X;
      }
    });
  }
  if (need_bias) {
    g.bias = Tensor::empty({O}, w.dtype());
    RowVecMap<T> GB(g.bias.data<T>(), O);
    if (N == 0) {
      GB.setZero();
    } else {
      GB = GY.colwise().sum();
    }
  }
  return g;
}

// Calls fn(matrix) with an Eigen map of the 2-D tensor t: row-major when t is
// contiguous, column-major when t is the transpose of a contiguous matrix.
template <typename T, typename Fn>
void with_matrix(const Tensor& t, Fn&& fn) {
  const int64_t r = t.size(0), c = t.size(1);
  if (t.is_contiguous()) {
    fn(CMatMap<T>(t.data<T>(), r, c));
  } else if (t.transpose(0, 1).is_contiguous()) {
    fn(CColMap<T>(t.data<T>(), r, c));
  } else {
    const Tensor tc = t.contiguous();
    fn(CMatMap<T>(tc.data<T>(), r, c));
  }
}

template <typename T>
Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  Tensor out = Tensor::empty({M, N}, a.dtype());
  MatMap<T> C(out.data<T>(), M, N);
  if (K == 0) {
    C.setZero();
    return out;
  }
  with_matrix<T>(a, [&](const auto& A) {
    with_matrix<T>(b, [&](const auto& B) {
      detail::for_each_chunk(M, row_chunks(M, K * N), [&](int64_t, int64_t r0, int64_t r1) {
        C.middleRows(r0, r1 - r0).noalias() = A.middleRows(r0, r1 - r0) * B;
      });
    });
  });
  return out;
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_cpu("linear_forward", x);
  return detail::dispatch_float(x.dtype(), "linear_forward",
                                [&](auto t) { return forward_impl<decltype(t)>(x, weight, bias); });
}

LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input,
                            bool need_weight, bool need_bias) {
  detail::check_cpu("linear_backward", x);
  return detail::dispatch_float(x.dtype(), "linear_backward", [&](auto t) {
    return backward_impl<decltype(t)>(grad_out, x, weight, need_input, need_weight, need_bias);
  });
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  detail::check_cpu("matmul", a);
  return detail::dispatch_float(a.dtype(), "matmul", [&](auto t) { return matmul_impl<decltype(t)>(a, b); });
}

}  // namespace tandem::kernels::cpu
