// Internal to kernels/cuda (plain C++, so the host tests check it too: tests/kernels/
// cuda_index_math_test.cpp): the strided, broadcasting element walk of the general op set's CUDA
// kernels (pointwise.cu, index.cu). An operand is its element pointer (Tensor::raw_data, offset
// included) and its element strides over the output's shape: 0 on broadcast dimensions, so
// broadcast, transposed and sliced operands are read in place, with no copy.
// Host side: strided_layout() drops size-1 dimensions and merges neighbours that every operand
// walks contiguously (all-contiguous operands become one dimension); at most kMaxDims remain, or
// it throws naming the op. Device side: offsets() maps a flat output index (row-major over the
// output's shape, below the output's element count) to each operand's element offset.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/functors.h"  // TANDEM_HD

namespace tandem::kernels::cuda {

constexpr int kMaxDims = 10;

template <int N>
struct StridedLayout {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};

  // One division per dimension but the outermost (whose coordinate is what is left of i): none at all when
  // every operand walks contiguously (one merged dimension), the common case.
  TANDEM_HD void offsets(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d > 0; --d) {
      const int64_t q = i / size[d], c = i - q * size[d];
      i = q;
      for (int k = 0; k < N; ++k) off[k] += c * stride[k][d];
    }
    if (ndim > 0)
      for (int k = 0; k < N; ++k) off[k] += i * stride[k][0];
  }
};

// The layout of operands ts (each broadcastable to `shape`: checked by the caller) over `shape`.
template <int N>
StridedLayout<N> strided_layout(const char* op, const Shape& shape, const std::array<Tensor, N>& ts) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<std::array<int64_t, N>> st(nd);
  for (int64_t d = 0; d < nd; ++d) st[d].fill(0);
  for (int k = 0; k < N; ++k) {
    const Tensor& t = ts[k];
    const int64_t m = t.dim();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t o = i + nd - m;
      st[o][k] = t.shape()[i] == 1 && shape[o] != 1 ? 0 : t.strides()[i];
    }
  }
  // Innermost first: a dimension joins the group inside it when every operand's stride there is
  // the group's stride times the group's size.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> strides;
  for (int64_t d = nd - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (int k = 0; k < N && merge; ++k) merge = st[d][k] == strides.back()[k] * sizes.back();
    if (merge) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      strides.push_back(st[d]);
    }
  }
  TANDEM_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), op, ": at most ", kMaxDims,
               " non-mergeable dimensions on CUDA, got ", sizes.size(), " for shape ", shape_str(shape),
               " (make the operands contiguous first)");
  StridedLayout<N> l;
  l.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < l.ndim; ++d) {
    const size_t from = sizes.size() - 1 - static_cast<size_t>(d);
    l.size[d] = sizes[from];
    for (int k = 0; k < N; ++k) l.stride[k][d] = strides[from][k];
  }
  return l;
}

}  // namespace tandem::kernels::cuda
