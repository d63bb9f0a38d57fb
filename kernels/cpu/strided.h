// Internal: N-operand strided iteration for the CPU kernels of the general op set
// (kernels/cpu/pointwise.cpp, reduce.cpp, index.cpp). An operand is described by its data pointer
// and its element strides over the output's shape (0 on broadcast dimensions), so broadcasting,
// transposed and sliced inputs need no copy.
// Guarantees: for_each_strided visits every output position exactly once; whole innermost rows
// are split into contiguous chunks run in parallel, each chunk walking its positions in row-major
// order, so a kernel that writes only its own position is race-free.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu::detail {

// t's element strides when broadcast to `shape` (t's shape must broadcast to it: checked by the
// caller): aligned from the right, 0 where t has size 1 or no dimension.
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const int64_t n = static_cast<int64_t>(shape.size()), m = t.dim();
  Shape out(n, 0);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t o = i + n - m;
    out[o] = t.shape()[i] == 1 && shape[o] != 1 ? 0 : t.strides()[i];
  }
  return out;
}

// Calls fn(i, offsets) for every flat output index i in [0, numel(shape)), offsets[k] being operand
// k's element offset for that position. When every operand is contiguous over `shape` the offsets
// are i itself; otherwise the odometer advances once per innermost row and within a row the offsets
// step by the innermost strides, so the per-element work is fn plus N additions.
template <size_t N, typename Fn>
void for_each_strided(const Shape& shape, const std::array<Shape, N>& strides, Fn&& fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t total = shape_numel(shape);
  if (total == 0) return;
  if (nd == 0) {
    fn(int64_t{0}, std::array<int64_t, N>{});
    return;
  }
  bool flat = true;  // every operand contiguous over `shape`: one row of all the elements
  const Shape dense = contiguous_strides(shape);
  for (size_t k = 0; k < N && flat; ++k) {
    for (int64_t d = 0; d < nd; ++d) flat = flat && (shape[d] == 1 || strides[k][d] == dense[d]);
  }
  if (flat) {
    parallel_range(total, int64_t{1} << 15, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        std::array<int64_t, N> off;
        off.fill(i);
        fn(i, off);
      }
    });
    return;
  }
  const int64_t inner = shape[nd - 1];
  std::array<int64_t, N> step{};
  for (size_t k = 0; k < N; ++k) step[k] = strides[k][nd - 1];
  const int64_t rows = total / inner;
  parallel_range(rows, std::max<int64_t>(1, (int64_t{1} << 15) / inner), [&](int64_t r0, int64_t r1) {
    // Multi-index of row r0 over the outer dimensions, and each operand's offset there.
    Shape idx(nd, 0);
    std::array<int64_t, N> base{};
    int64_t rem = r0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      for (size_t k = 0; k < N; ++k) base[k] += idx[d] * strides[k][d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      std::array<int64_t, N> off = base;
      const int64_t i0 = r * inner;
      for (int64_t j = 0; j < inner; ++j) {
        fn(i0 + j, off);
        for (size_t k = 0; k < N; ++k) off[k] += step[k];
      }
      for (int64_t d = nd - 2; d >= 0; --d) {
        ++idx[d];
        for (size_t k = 0; k < N; ++k) base[k] += strides[k][d];
        if (idx[d] < shape[d]) break;
        for (size_t k = 0; k < N; ++k) base[k] -= strides[k][d] * shape[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace tandem::kernels::cpu::detail
