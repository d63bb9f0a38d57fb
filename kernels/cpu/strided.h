// Internal: N-operand strided iteration for the CPU kernels of the general op set
// (kernels/cpu/pointwise.cpp, reduce.cpp, index.cpp). An operand is described by its data pointer
// and its element strides over the output's shape (0 on broadcast dimensions), so broadcasting,
// transposed and sliced inputs need no copy.
// Guarantees: for_each_strided visits every output position exactly once; positions are split
// into contiguous chunks of the flat output index run in parallel, each chunk walking its
// positions in row-major order, so a kernel that writes only its own position is race-free.
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
// k's element offset for that position.
template <size_t N, typename Fn>
void for_each_strided(const Shape& shape, const std::array<Shape, N>& strides, Fn&& fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t total = shape_numel(shape);
  parallel_range(total, int64_t{1} << 15, [&](int64_t i0, int64_t i1) {
    Shape idx(nd, 0);
    std::array<int64_t, N> off{};
    int64_t rem = i0;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = shape[d] == 0 ? 0 : rem % shape[d];
      rem = shape[d] == 0 ? 0 : rem / shape[d];
      for (size_t k = 0; k < N; ++k) off[k] += idx[d] * strides[k][d];
    }
    for (int64_t i = i0; i < i1; ++i) {
      fn(i, off);
      for (int64_t d = nd - 1; d >= 0; --d) {
        ++idx[d];
        for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
        if (idx[d] < shape[d]) break;
        for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * shape[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace tandem::kernels::cpu::detail
