// The host-device index math of the general op set's CUDA kernels, checked on the host (it is
// plain C++, so it runs here even without a GPU): kernels/cuda/strided.h's layout (dimension
// merging, broadcast strides, element offsets) against offsets computed directly from each
// operand's multi-index, and PoolGeometry::covering (the candidate windows of avg_pool's CUDA
// backward) against every window that actually covers an input position.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/view.h"
#include "kernels/avg_pool.h"
#include "kernels/cuda/strided.h"

namespace {

using namespace tandem;
namespace K = tandem::kernels;

// Operand t's element offset at output position i of `shape` (t broadcasts to it), from its
// multi-index: the plain definition the layout must reproduce.
int64_t direct_offset(const Tensor& t, const Shape& shape, int64_t i) {
  const int64_t n = static_cast<int64_t>(shape.size()), m = t.dim();
  int64_t off = t.offset();
  for (int64_t d = n - 1; d >= 0; --d) {
    const int64_t c = i % shape[d];
    i /= shape[d];
    const int64_t td = d - (n - m);
    if (td >= 0 && t.shape()[td] != 1) off += c * t.strides()[td];
  }
  return off;
}

// A tensor with t's shape viewed from a larger buffer in a random layout: contiguous, transposed
// (first and last dimension), or every other element of a wider last dimension.
Tensor random_layout(const Shape& shape, Generator& gen) {
  const int kind = static_cast<int>(gen.below(3));
  if (shape.size() >= 2 && kind == 1) {
    Shape swapped = shape;
    std::swap(swapped.front(), swapped.back());
    return Tensor::zeros(swapped).transpose(0, static_cast<int64_t>(shape.size()) - 1);
  }
  if (!shape.empty() && kind == 2) {
    Shape wide = shape;
    wide.back() = 2 * wide.back() + 1;
    return Tensor::zeros(wide).slice(static_cast<int64_t>(shape.size()) - 1, 1, wide.back(), 2);
  }
  return Tensor::zeros(shape);
}

TEST(CudaIndexMath, StridedLayoutOffsetsMatchTheMultiIndexDefinition) {
  Generator gen(41);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t rank = static_cast<int64_t>(gen.below(6));
    Shape shape(rank);
    for (int64_t& s : shape) s = 1 + static_cast<int64_t>(gen.below(4));
    // Operand b: some dimensions 1, leading ones maybe dropped (broadcast).
    Shape bs(shape.begin() + static_cast<int64_t>(gen.below(rank + 1)), shape.end());
    for (int64_t& s : bs)
      if (gen.below(2) == 0) s = 1;
    std::array<Tensor, 3> ops = {random_layout(shape, gen), random_layout(bs, gen), Tensor::zeros({})};
    const K::cuda::StridedLayout<3> l = K::cuda::strided_layout<3>("test", shape, ops);
    SCOPED_TRACE("shape " + shape_str(shape) + ", b " + shape_str(bs));
    ASSERT_LE(l.ndim, rank);
    for (int64_t i = 0; i < shape_numel(shape); ++i) {
      int64_t off[3];
      l.offsets(i, off);
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(off[k] + ops[k].offset(), direct_offset(ops[k], shape, i)) << "operand " << k << " at " << i;
      }
    }
  }
}

TEST(CudaIndexMath, StridedLayoutMergesContiguousOperandsAndLimitsDimensions) {
  const Shape shape{2, 3, 4, 5};
  const auto flat = K::cuda::strided_layout<2>("test", shape, {Tensor::zeros(shape), Tensor::zeros(shape)});
  EXPECT_EQ(flat.ndim, 1);
  EXPECT_EQ(flat.size[0], 120);
  // A row vector broadcast over the rows keeps two dimensions: rows (stride 0 for it) and columns.
  const auto bias = K::cuda::strided_layout<2>("test", shape, {Tensor::zeros(shape), Tensor::zeros({5})});
  EXPECT_EQ(bias.ndim, 2);
  EXPECT_EQ(bias.stride[1][0], 0);
  // Eleven dimensions that no operand walks contiguously: more than the kernels take.
  const Shape big(11, 2);
  std::vector<int64_t> reversed(11);
  for (int64_t d = 0; d < 11; ++d) reversed[d] = 10 - d;
  const Tensor rev = views::permute(Tensor::zeros(big), reversed);
  try {
    K::cuda::strided_layout<2>("mul", big, {Tensor::zeros(big), rev});
    ADD_FAILURE() << "no error for 11 dimensions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mul: at most 10 non-mergeable dimensions on CUDA"), std::string::npos)
        << e.what();
  }
}

// Every window that covers (h, w) lies in covering()'s ranges.
void check_covering(const K::PoolGeometry& g) {
  for (int64_t h = 0; h < g.H; ++h) {
    for (int64_t w = 0; w < g.W; ++w) {
      int64_t p0, p1, q0, q1;
      g.covering(h, w, p0, p1, q0, q1);
      for (int64_t p = 0; p < g.out_h; ++p) {
        for (int64_t q = 0; q < g.out_w; ++q) {
          int64_t h0, h1, w0, w1;
          double div;
          g.window(p, q, h0, h1, w0, w1, div);
          if (h < h0 || h >= h1 || w < w0 || w >= w1) continue;
          ASSERT_TRUE(p >= p0 && p <= p1 && q >= q0 && q <= q1)
              << "window (" << p << ", " << q << ") covers input (" << h << ", " << w << ") outside [" << p0 << ", "
              << p1 << "] x [" << q0 << ", " << q1 << "]";
        }
      }
    }
  }
}

TEST(CudaIndexMath, PoolCoveringRangesHoldEveryWindowOverAnInput) {
  Generator gen(42);
  for (int trial = 0; trial < 400; ++trial) {
    K::PoolGeometry g;
    g.H = 1 + static_cast<int64_t>(gen.below(12));
    g.W = 1 + static_cast<int64_t>(gen.below(12));
    g.adaptive = trial % 2 == 0;
    if (g.adaptive) {
      g.out_h = 1 + static_cast<int64_t>(gen.below(15));
      g.out_w = 1 + static_cast<int64_t>(gen.below(15));
    } else {
      K::AvgPool2dArgs& a = g.args;
      a.kernel_h = 1 + static_cast<int64_t>(gen.below(std::min<uint64_t>(5, g.H + 1)));
      a.kernel_w = 1 + static_cast<int64_t>(gen.below(std::min<uint64_t>(5, g.W + 1)));
      a.stride_h = 1 + static_cast<int64_t>(gen.below(3));
      a.stride_w = 1 + static_cast<int64_t>(gen.below(3));
      a.pad_h = static_cast<int64_t>(gen.below(a.kernel_h / 2 + 1));
      a.pad_w = static_cast<int64_t>(gen.below(a.kernel_w / 2 + 1));
      a.ceil_mode = gen.below(2) == 1;
      a.count_include_pad = gen.below(2) == 1;
      if (g.H + 2 * a.pad_h < a.kernel_h || g.W + 2 * a.pad_w < a.kernel_w) continue;
      g.out_h = K::avg_pool_out_size(g.H, a.kernel_h, a.stride_h, a.pad_h, a.ceil_mode);
      g.out_w = K::avg_pool_out_size(g.W, a.kernel_w, a.stride_w, a.pad_w, a.ceil_mode);
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << g.H << "x" << g.W << " -> " << g.out_h << "x"
                                      << g.out_w);
    check_covering(g);
  }
}

}  // namespace
