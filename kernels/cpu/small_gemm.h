// Single-precision GEMM for the narrow products of Linear layers (one side of
// at most a few hundred, e.g. the batch), on an AVX-512 register-tiled
// micro-kernel, under tandem::kernels::cpu::detail.
//
//   C[m, j] (+)= sum_k A[m, k] * B[k, j]    for m in [m0, m1), j in [0, J), k in [0, K)
//
// A is read in place through two strides (A[m, k] = a[m * a_rs + k * a_ks]),
// so both W and W^T of a row-major weight are read without a copy; B is a
// BOperand: either packed first with pack_b_transposed into panels of 64 columns (zero
// padded), or a row-major matrix read in place (W, or a batch of rows, as B).
// C is row-major with leading dimension ldc.
// Assumes: built with AVX-512F (small_gemm_available() says so at run time:
// false means the caller must use another path); buffers do not overlap.
// Guarantees: every C element is the sum over k in increasing order, started
// from 0 (no accumulate) or from C, in one FMA chain: the bits depend only on
// the operands, not on the thread count, on how [m0, m1) is split, on which
// columns a call covers, or on whether B was packed.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu::detail {

constexpr int64_t kPanel = 64;  // columns per packed B panel

bool small_gemm_available();

// Floats needed for the packed form of a [K, J] matrix.
inline int64_t packed_b_size(int64_t K, int64_t J) { return (J + kPanel - 1) / kPanel * kPanel * K; }

// Packs rows [k0, k1) of B[k, j] = src[j * ld + k] (B is the transpose of a row-major [J, K]) by
// 16 x 16 tiles transposed in registers. Disjoint row ranges may be packed in parallel.
void pack_b_transposed(const float* src, int64_t ld, int64_t K, int64_t J, float* dst, int64_t k0, int64_t k1);

// B as the micro-kernel reads it: B[k, j] = p[(j / kPanel) * panel + k * ld + j % kPanel].
struct BOperand {
  const float* p;
  int64_t ld;     // floats from row k to row k + 1 within a panel
  int64_t panel;  // floats from one panel of kPanel columns to the next
  // What pack_b_transposed wrote for a [K, J] matrix.
  static BOperand packed(const float* p, int64_t K) { return {p, kPanel, kPanel * K}; }
  // A row-major [K, J] matrix with leading dimension ld, read in place (masked loads at its last column).
  static BOperand rows(const float* p, int64_t ld) { return {p, ld, kPanel}; }
  // Columns from j0 on (j0 a multiple of kPanel).
  BOperand from_column(int64_t j0) const { return {p + j0 / kPanel * panel, ld, panel}; }
};

void small_gemm(int64_t m0, int64_t m1, int64_t J, int64_t K, const float* a, int64_t a_rs, int64_t a_ks,
                const BOperand& b, float* c, int64_t ldc);

}  // namespace tandem::kernels::cpu::detail
