// kernels/cpu/attention_rows.h's vector rows (AVX-512). Blocks of scores live in row-major buffers
// of kCols floats a row; a query block's rows are taken in groups of up to 4, and a group computes
// only the 16-lane vectors that its last (widest, under the causal mask) row needs. Every score
// past a row's visible columns is written as 0, so the products that read a group's full width add
// nothing for it. Three register tiles do all the products:
//   abt:  C[r][j]  = sum_k A[r][k] B[j][k]   (scores Q K^T, dP = dO V^T), from B transposed;
//   ab:   C[r][:] += sum_j A[r][j] B[j][:]   (O += P V, dQ += dS K);
//   atb:  C[j][:] += sum_r A[r][j] B[r][:]   (dV += P^T dO, dK += dS^T Q).
// The online softmax and the row sums go 16 rows at a time: their per-row maxima and sums are one
// 16x16 transpose and vertical operations, and exp / log are Eigen's vector ones.
#include "kernels/cpu/attention_rows.h"

#if TANDEM_SIMD == TANDEM_SIMD_AVX512

#include <cmath>
#include <limits>
#include <type_traits>

#include <Eigen/Core>

namespace tandem::kernels::cpu::attention {
namespace {

using simd::axpy_tile;
using simd::lane_mask;
using simd::load_first;

constexpr int64_t kLd = kCols;  // leading dimension of a score block
constexpr int kTile = 4;        // rows (abt, ab) or key columns (atb) of a register tile
constexpr int kMaxVecs = 4;     // 16-lane vectors of a tile row: 64 columns

int64_t vecs(int64_t n) { return (n + 15) / 16; }

// Which columns of the current key block the rows of the current query block see.
struct Visible {
  int64_t diag;  // i0 - j0: the key column of query row 0 on the diagonal
  int64_t cols;
  bool causal;
  int64_t operator()(int64_t r) const { return causal ? std::clamp<int64_t>(r + diag + 1, 0, cols) : cols; }
  int64_t first_row(int64_t j) const { return causal ? std::max<int64_t>(0, j - diag) : 0; }
};

template <int N>
using Int = std::integral_constant<int, N>;

// fn(Int<R>, Int<NV>) for R = r and NV = nv, each in 1..4.
template <typename Fn>
void with_tile(int64_t r, int64_t nv, Fn&& fn) {
  auto by_nv = [&](auto R) {
    switch (nv) {
      case 1: fn(R, Int<1>{}); break;
      case 2: fn(R, Int<2>{}); break;
      case 3: fn(R, Int<3>{}); break;
      default: fn(R, Int<4>{}); break;
    }
  };
  switch (r) {
    case 1: by_nv(Int<1>{}); break;
    case 2: by_nv(Int<2>{}); break;
    case 3: by_nv(Int<3>{}); break;
    default: by_nv(Int<4>{}); break;
  }
}

// bt[k * kLd + j] = b[j * ldb + k] for j < cols (<= kCols), k < K; 0 for cols <= j < 16 * vecs(cols).
void transpose_block(const float* b, int64_t ldb, int64_t cols, int64_t K, float* bt) {
  for (int64_t j0 = 0; j0 < cols; j0 += 16) {
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = j0 + i < cols ? load_first(b + (j0 + i) * ldb + k0, K - k0) : _mm512_setzero_ps();
      }
      simd::transpose16(r);
      for (int64_t kk = 0; kk < std::min<int64_t>(16, K - k0); ++kk) _mm512_storeu_ps(bt + (k0 + kk) * kLd + j0, r[kk]);
    }
  }
}

// c[i * kLd + 16 v ...] = sum_k a[i * lda + k] * bt[k * kLd + 16 v ...], i < R, v < NV.
template <int R, int NV>
void abt_tile(const float* a, int64_t lda, const float* bt, int64_t K, float* c) {
  __m512 acc[R][NV];
  #pragma GCC unroll 16
  for (auto& row : acc)
    #pragma GCC unroll 16
    for (auto& x : row) x = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(bt + k * kLd + 16 * v);
    #pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const __m512 x = _mm512_set1_ps(a[i * lda + k]);
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(x, b[v], acc[i][v]);
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + i * kLd + 16 * v, acc[i][v]);
}

// c = a b^T over the visible vectors of each group of rows: a [rows][lda], bt as transpose_block's.
void abt(const float* a, int64_t lda, const float* bt, int64_t K, int64_t rows, const Visible& vis, float* c) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t R = std::min<int64_t>(kTile, rows - r0), nv = vecs(vis(r0 + R - 1));
    if (nv == 0) continue;
    with_tile(R, nv, [&](auto r, auto v) {
      abt_tile<decltype(r)::value, decltype(v)::value>(a + r0 * lda, lda, bt, K, c + r0 * kLd);
    });
  }
}

// c [rows][ldc] += a b over the visible columns of a (0 past each row's own), b [cols][ldb], n columns.
void ab(const float* a, int64_t rows, const Visible& vis, const float* b, int64_t ldb, int64_t n, float* c,
        int64_t ldc) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t R = std::min<int64_t>(kTile, rows - r0), jn = vis(r0 + R - 1);
    if (jn == 0) continue;
    for (int64_t c0 = 0; c0 < n; c0 += 16 * kMaxVecs) {
      const int64_t nn = std::min<int64_t>(16 * kMaxVecs, n - c0);
      with_tile(R, vecs(nn), [&](auto r, auto v) {
        axpy_tile<decltype(r)::value, decltype(v)::value>(a + r0 * kLd, 1, kLd, 0, jn, b + c0, ldb, nn,
                                                          c + r0 * ldc + c0, ldc);
      });
    }
  }
}

// c [cols][ldc] += a^T b over the rows that see each group of columns, b [rows][ldb], n columns.
void atb(const float* a, int64_t rows, const Visible& vis, const float* b, int64_t ldb, int64_t n, float* c,
         int64_t ldc) {
  for (int64_t j0 = 0; j0 < vis.cols; j0 += kTile) {
    const int64_t R = std::min<int64_t>(kTile, vis.cols - j0), r0 = vis.first_row(j0);
    if (r0 >= rows) break;
    for (int64_t c0 = 0; c0 < n; c0 += 16 * kMaxVecs) {
      const int64_t nn = std::min<int64_t>(16 * kMaxVecs, n - c0);
      with_tile(R, vecs(nn), [&](auto r, auto v) {
        axpy_tile<decltype(r)::value, decltype(v)::value>(a + j0, kLd, 1, r0, rows, b + c0, ldb, nn,
                                                          c + j0 * ldc + c0, ldc);
      });
    }
  }
}

__m512 exp16(__m512 x) { return Eigen::internal::pexp<Eigen::internal::Packet16f>(x); }
__m512 log16(__m512 x) { return Eigen::internal::plog<Eigen::internal::Packet16f>(x); }

// Lane i of the result: the sum (max) of the lanes of v[i]; v is overwritten. One 16x16 transpose and 15
// vertical operations instead of 16 horizontal reductions.
__m512 row_sums(__m512 v[16]) {
  simd::transpose16(v);
  for (int i = 1; i < 16; ++i) v[0] = _mm512_add_ps(v[0], v[i]);
  return v[0];
}
__m512 row_maxima(__m512 v[16]) {
  simd::transpose16(v);
  for (int i = 1; i < 16; ++i) v[0] = _mm512_max_ps(v[0], v[i]);
  return v[0];
}

// The online softmax step of rows [r0, r0 + nr) (nr <= 16) of a score block s: on each row's visible
// columns s becomes exp(s * scale - m_new), 0 past them up to the block's width; m and l (of the 16 rows
// from r0) are updated; alpha[i] = exp(m_old - m_new), the factor of row r0 + i's output so far (0 while
// the row has seen nothing).
void online_softmax_rows(float* s, int64_t r0, int64_t nr, const Visible& vis, float scale, float* m, float* l,
                         float* alpha) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  const __mmask16 live = lane_mask(nr);
  __m512 part[16];
  for (int64_t i = 0; i < 16; ++i) {
    part[i] = _mm512_set1_ps(ninf);
    if (i >= nr) continue;
    float* row = s + (r0 + i) * kLd;
    const int64_t n = vis(r0 + i);
    for (int64_t c = 0; c < n; c += 16) {  // the scaled scores, kept in place
      const __mmask16 k = lane_mask(n - c);
      const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + c), vscale);
      _mm512_storeu_ps(row + c, y);
      part[i] = _mm512_mask_max_ps(part[i], k, part[i], y);
    }
  }
  const __m512 m_old = _mm512_mask_loadu_ps(_mm512_set1_ps(ninf), live, m);
  const __m512 m_new = _mm512_max_ps(m_old, row_maxima(part));
  const __mmask16 seen = _mm512_cmp_ps_mask(m_old, _mm512_set1_ps(ninf), _CMP_NEQ_OQ);
  const __m512 a = _mm512_maskz_mov_ps(seen, exp16(_mm512_sub_ps(m_old, m_new)));
  alignas(64) float mn[16];
  _mm512_store_ps(mn, m_new);
  for (int64_t i = 0; i < 16; ++i) {
    part[i] = _mm512_setzero_ps();
    if (i >= nr) continue;
    float* row = s + (r0 + i) * kLd;
    const int64_t n = vis(r0 + i);
    const __m512 vm = _mm512_set1_ps(mn[i]);
    for (int64_t c = 0; c < n; c += 16) {
      const __mmask16 k = lane_mask(n - c);
      const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + c), vm)));
      part[i] = _mm512_add_ps(part[i], e);
      _mm512_storeu_ps(row + c, e);
    }
    std::fill(row + 16 * vecs(n), row + 16 * vecs(vis.cols), 0.0f);
  }
  const __m512 l_new = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, l), a, row_sums(part));
  _mm512_mask_storeu_ps(l, live, l_new);
  _mm512_mask_storeu_ps(m, live, m_new);
  _mm512_mask_storeu_ps(alpha, live, a);
}

// row[:n] *= a.
void scale_row(float* row, int64_t n, float a) {
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 k = lane_mask(n - c);
    _mm512_mask_storeu_ps(row + c, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + c), va));
  }
}

}  // namespace

RowScratch::RowScratch(const Dims& d)
    : kt(d.E * kLd), vt(d.Ev * kLd), s(kRows * kLd), dp(kRows * kLd), acc(kRows * d.Ev), m(kRows), l(kRows),
      delta(d.L) {}

void forward_rows(const Dims& d, float scale, const float* q, const float* k, const float* v, float* o, float* lse,
                  RowScratch& w) {
  for (int64_t i0 = 0; i0 < d.L; i0 += kRows) {
    const int64_t rows = std::min(kRows, d.L - i0), jend = d.key_end(i0, rows);
    std::fill(w.acc.begin(), w.acc.begin() + rows * d.Ev, 0.0f);
    std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    for (int64_t j0 = 0; j0 < jend; j0 += kCols) {
      const Visible vis{i0 - j0, std::min(kCols, jend - j0), d.causal};
      transpose_block(k + j0 * d.E, d.E, vis.cols, d.E, w.kt.data());
      abt(q + i0 * d.E, d.E, w.kt.data(), d.E, rows, vis, w.s.data());
      for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t nr = std::min<int64_t>(16, rows - r0);
        float alpha[16];
        online_softmax_rows(w.s.data(), r0, nr, vis, scale, w.m.data() + r0, w.l.data() + r0, alpha);
        for (int64_t i = 0; i < nr; ++i) {
          if (alpha[i] != 1.0f) scale_row(w.acc.data() + (r0 + i) * d.Ev, d.Ev, alpha[i]);
        }
      }
      ab(w.s.data(), rows, vis, v + j0 * d.Ev, d.Ev, d.Ev, w.acc.data(), d.Ev);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = w.acc.data() + r * d.Ev;
      float* out = o + (i0 + r) * d.Ev;
      const __m512 vl = _mm512_set1_ps(w.l[r]);
      for (int64_t c = 0; c < d.Ev; c += 16) {
        const __mmask16 km = lane_mask(d.Ev - c);
        _mm512_mask_storeu_ps(out + c, km, _mm512_div_ps(_mm512_maskz_loadu_ps(km, a + c), vl));
      }
    }
    for (int64_t r = 0; r < rows; r += 16) {  // lse = m + log(l)
      const __mmask16 k = lane_mask(rows - r);
      const __m512 l = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, w.l.data() + r);
      _mm512_mask_storeu_ps(lse + i0 + r, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, w.m.data() + r), log16(l)));
    }
  }
}

namespace {

// rowsum(g * o) of each of the L rows, 16 rows at a time.
void row_dots(const float* g, const float* o, int64_t L, int64_t Ev, float* delta) {
  for (int64_t i0 = 0; i0 < L; i0 += 16) {
    __m512 part[16];
    for (int64_t i = 0; i < 16; ++i) {
      part[i] = _mm512_setzero_ps();
      if (i0 + i >= L) continue;
      const float *gi = g + (i0 + i) * Ev, *oi = o + (i0 + i) * Ev;
      for (int64_t c = 0; c < Ev; c += 16) {
        part[i] = _mm512_fmadd_ps(load_first(gi + c, Ev - c), load_first(oi + c, Ev - c), part[i]);
      }
    }
    _mm512_mask_storeu_ps(delta + i0, lane_mask(L - i0), row_sums(part));
  }
}

// The probabilities of a block of rows recomputed from its scores: exp(s * scale - lse) on each row's
// visible columns, 0 past them up to cols.
void probabilities(float* s, int64_t rows, const Visible& vis, float scale, const float* lse) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * kLd;
    const int64_t n = vis(r);
    const __m512 vl = _mm512_set1_ps(lse[r]);
    for (int64_t c = 0; c < vis.cols; c += 16) {
      const __mmask16 k = lane_mask(n - c);
      const __m512 x = _mm512_maskz_loadu_ps(k, row + c);
      _mm512_storeu_ps(row + c, _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_mul_ps(x, vscale), vl))));
    }
  }
}

// dS = P * (dP - D) * scale on each row's visible columns, 0 past them up to cols (in dp).
void score_grads(const float* p, float* dp, int64_t rows, const Visible& vis, float scale, const float* delta) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = vis(r);
    const __m512 vd = _mm512_set1_ps(delta[r]);
    for (int64_t c = 0; c < vis.cols; c += 16) {
      const __mmask16 k = lane_mask(n - c);
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + r * kLd + c),
                                     _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + r * kLd + c), vd));
      _mm512_storeu_ps(dp + r * kLd + c, _mm512_maskz_mov_ps(k, _mm512_mul_ps(x, vscale)));
    }
  }
}

}  // namespace

void backward_rows(const Dims& d, float scale, const float* q, const float* k, const float* v, const float* o,
                   const float* g, const float* lse, float* dq, float* dk, float* dv, RowScratch& w) {
  row_dots(g, o, d.L, d.Ev, w.delta.data());
  for (int64_t j0 = 0; j0 < d.S; j0 += kCols) {
    const int64_t cols = std::min(kCols, d.S - j0);
    transpose_block(k + j0 * d.E, d.E, cols, d.E, w.kt.data());
    transpose_block(v + j0 * d.Ev, d.Ev, cols, d.Ev, w.vt.data());
    for (int64_t i0 = d.causal ? j0 / kRows * kRows : 0; i0 < d.L; i0 += kRows) {
      const int64_t rows = std::min(kRows, d.L - i0);
      const Visible vis{i0 - j0, cols, d.causal};
      abt(q + i0 * d.E, d.E, w.kt.data(), d.E, rows, vis, w.s.data());
      probabilities(w.s.data(), rows, vis, scale, lse + i0);
      atb(w.s.data(), rows, vis, g + i0 * d.Ev, d.Ev, d.Ev, dv + j0 * d.Ev, d.Ev);
      abt(g + i0 * d.Ev, d.Ev, w.vt.data(), d.Ev, rows, vis, w.dp.data());
      score_grads(w.s.data(), w.dp.data(), rows, vis, scale, w.delta.data() + i0);
      ab(w.dp.data(), rows, vis, k + j0 * d.E, d.E, d.E, dq + i0 * d.E, d.E);
      atb(w.dp.data(), rows, vis, q + i0 * d.E, d.E, d.E, dk + j0 * d.E, d.E);
    }
  }
}

}  // namespace tandem::kernels::cpu::attention

#endif  // TANDEM_SIMD == TANDEM_SIMD_AVX512
