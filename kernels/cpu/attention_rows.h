// The fused attention's shared pieces (kernels/cpu/attention.cpp) and its float32 vector rows. Internal.
// Dims: one batch entry's sizes and the causal rule in blocks of kRows query rows by kCols key columns.
// The vector rows (built where the kernels are compiled for AVX-512, TANDEM_SIMD_AVX512) run the same
// FlashAttention recurrence as attention.cpp's portable rows; their block products are 16-lane
// multiply-adds on register tiles of up to 4 rows by 64 columns instead of Eigen's GEMMs (which, at a
// head's widths of 16-64, spent most of their time packing), the key block is transposed once with
// 16x16 register transposes, and the causal mask also skips the part of the diagonal block past each
// group of 4 rows. Guarantees: as the portable rows, a batch entry's bits depend on its data alone,
// not on the thread that computes it; the results agree with them to float32 rounding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::attention {

inline constexpr int64_t kRows = 64;  // query rows per block
inline constexpr int64_t kCols = 64;  // key columns per block

struct Dims {
  int64_t L, S, E, Ev;
  bool causal;
  // Columns of key block [j0, j0 + cols) that query row i attends to (a prefix of the block).
  int64_t visible(int64_t i, int64_t j0, int64_t cols) const {
    return causal ? std::clamp<int64_t>(i - j0 + 1, 0, cols) : cols;
  }
  // One past the last key column any of the query rows [i0, i0 + rows) attends to.
  int64_t key_end(int64_t i0, int64_t rows) const { return causal ? std::min(S, i0 + rows) : S; }
};

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// One thread's buffers for the vector rows of entries of sizes d.
struct RowScratch {
  explicit RowScratch(const Dims& d);
  std::vector<float> kt, vt;  // a key (value) block transposed: [E (Ev)][kCols]
  std::vector<float> s, dp;   // scores / probabilities and their gradients: [kRows][kCols]
  std::vector<float> acc;     // the forward's unnormalised output rows: [kRows][Ev]
  std::vector<float> m, l;    // the forward's running row maxima and sums: [kRows]
  std::vector<float> delta;   // the backward's rowsum(dO * O): [L]
};

// Forward of one batch entry: o [L, Ev] and lse [L] from q [L, E], k [S, E], v [S, Ev] (contiguous).
void forward_rows(const Dims& d, float scale, const float* q, const float* k, const float* v, float* o, float* lse,
                  RowScratch& w);
// Backward of one batch entry; dq, dk, dv start at zero and are added to.
void backward_rows(const Dims& d, float scale, const float* q, const float* k, const float* v, const float* o,
                   const float* g, const float* lse, float* dq, float* dk, float* dv, RowScratch& w);
#endif

}  // namespace tandem::kernels::cpu::attention
