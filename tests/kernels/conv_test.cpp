// conv2d forward/backward against a naive direct convolution in double:
// strides, padding, non-square images and kernels, 1x1 kernels, no bias,
// non-contiguous inputs, gradients asked for selectively, several threads
// (the per-chunk weight-gradient reduction), and argument errors.
#include "kernels/ops.h"
#include "kernels/conv.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

using namespace tandem;
using namespace tandem::test;
using tandem::kernels::Conv2dArgs;

namespace {

struct Case {
  int64_t N, C, H, W, K, R, S;
  Conv2dArgs args;
  bool bias;
};

int64_t out_size(int64_t in, int64_t pad, int64_t k, int64_t stride) {
  return (in + 2 * pad - k) / stride + 1;
}

// Input coordinate of output position o, kernel offset k; -1 when in padding.
int64_t in_coord(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t size) {
  const int64_t i = o * stride - pad + k;
  return (i < 0 || i >= size) ? -1 : i;
}

std::vector<double> ref_forward(const Case& c, const std::vector<double>& x, const std::vector<double>& w,
                                const std::vector<double>& b) {
  const int64_t P = out_size(c.H, c.args.pad_h, c.R, c.args.stride_h);
  const int64_t Q = out_size(c.W, c.args.pad_w, c.S, c.args.stride_w);
  std::vector<double> y(c.N * c.K * P * Q, 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          double acc = c.bias ? b[k] : 0.0;
          for (int64_t ch = 0; ch < c.C; ++ch)
            for (int64_t r = 0; r < c.R; ++r)
              for (int64_t s = 0; s < c.S; ++s) {
                const int64_t ih = in_coord(p, r, c.args.stride_h, c.args.pad_h, c.H);
                const int64_t iw = in_coord(q, s, c.args.stride_w, c.args.pad_w, c.W);
                if (ih < 0 || iw < 0) continue;
                acc += x[((n * c.C + ch) * c.H + ih) * c.W + iw] * w[((k * c.C + ch) * c.R + r) * c.S + s];
              }
          y[((n * c.K + k) * P + p) * Q + q] = acc;
        }
  return y;
}

struct RefGrads {
  std::vector<double> x, w, b;
};

RefGrads ref_backward(const Case& c, const std::vector<double>& gy, const std::vector<double>& x,
                      const std::vector<double>& w) {
  const int64_t P = out_size(c.H, c.args.pad_h, c.R, c.args.stride_h);
  const int64_t Q = out_size(c.W, c.args.pad_w, c.S, c.args.stride_w);
  RefGrads g{std::vector<double>(x.size(), 0.0), std::vector<double>(w.size(), 0.0),
             std::vector<double>(c.K, 0.0)};
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const double go = gy[((n * c.K + k) * P + p) * Q + q];
          g.b[k] += go;
          for (int64_t ch = 0; ch < c.C; ++ch)
            for (int64_t r = 0; r < c.R; ++r)
              for (int64_t s = 0; s < c.S; ++s) {
                const int64_t ih = in_coord(p, r, c.args.stride_h, c.args.pad_h, c.H);
                const int64_t iw = in_coord(q, s, c.args.stride_w, c.args.pad_w, c.W);
                if (ih < 0 || iw < 0) continue;
                const int64_t xi = ((n * c.C + ch) * c.H + ih) * c.W + iw;
                const int64_t wi = ((k * c.C + ch) * c.R + r) * c.S + s;
                g.x[xi] += go * w[wi];
                g.w[wi] += go * x[xi];
              }
        }
  return g;
}

void check_case(const Case& c, DType dtype, bool non_contig_input, uint64_t seed) {
  Generator gen(seed);
  const Tensor x = random_tensor({c.N, c.C, c.H, c.W}, dtype, gen);
  const Tensor w = random_tensor({c.K, c.C, c.R, c.S}, dtype, gen);
  const Tensor b = c.bias ? random_tensor({c.K}, dtype, gen) : Tensor();
  const Tensor x_arg = non_contig_input ? non_contiguous(x) : x;
  const std::vector<double> xv = values(x), wv = values(w), bv = c.bias ? values(b) : std::vector<double>();
  const Tol tol = tol_for(dtype);

  const Tensor y = kernels::conv2d_forward(x_arg, w, b, c.args);
  const int64_t P = out_size(c.H, c.args.pad_h, c.R, c.args.stride_h);
  const int64_t Q = out_size(c.W, c.args.pad_w, c.S, c.args.stride_w);
  ASSERT_EQ(y.shape(), (Shape{c.N, c.K, P, Q}));
  ASSERT_TRUE(y.is_contiguous());
  EXPECT_TRUE(all_close(y, ref_forward(c, xv, wv, bv), tol));

  const Tensor gy = random_tensor(y.shape(), dtype, gen);
  const RefGrads ref = ref_backward(c, values(gy), xv, wv);
  const auto g = kernels::conv2d_backward(non_contig_input ? non_contiguous(gy) : gy, x_arg, w, c.args, true,
                                          true, c.bias);
  EXPECT_TRUE(all_close(g.input, ref.x, tol)) << "input grad";
  EXPECT_TRUE(all_close(g.weight, ref.w, tol)) << "weight grad";
  if (c.bias) {
    EXPECT_TRUE(all_close(g.bias, ref.b, tol)) << "bias grad";
  } else {
    EXPECT_FALSE(g.bias.defined());
  }

  // Only some gradients: the others stay undefined, the asked ones agree.
  const auto gw_only = kernels::conv2d_backward(gy, x, w, c.args, false, true, false);
  EXPECT_FALSE(gw_only.input.defined());
  EXPECT_FALSE(gw_only.bias.defined());
  EXPECT_TRUE(all_close(gw_only.weight, ref.w, tol));
  const auto gx_only = kernels::conv2d_backward(gy, x, w, c.args, true, false, false);
  EXPECT_FALSE(gx_only.weight.defined());
  EXPECT_TRUE(all_close(gx_only.input, ref.x, tol));
  const auto gb_only = kernels::conv2d_backward(gy, x, w, c.args, false, false, true);
  EXPECT_FALSE(gb_only.input.defined());
  EXPECT_FALSE(gb_only.weight.defined());
  EXPECT_TRUE(all_close(gb_only.bias, ref.b, tol));
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {2, 3, 7, 7, 4, 3, 3, {1, 1, 0, 0}, true},    // plain
      {2, 3, 9, 6, 5, 3, 3, {2, 2, 1, 1}, true},    // stride 2, padding 1, non-square image
      {3, 2, 8, 11, 3, 2, 3, {2, 1, 1, 0}, false},  // non-square kernel, mixed stride/padding, no bias
      {2, 4, 5, 6, 3, 1, 1, {1, 1, 0, 0}, true},    // 1x1: the column matrix is the input
      {1, 2, 6, 5, 2, 1, 1, {2, 2, 0, 0}, true},    // 1x1 with stride
      {2, 1, 4, 4, 2, 5, 5, {1, 1, 2, 2}, true},    // kernel wider than the padded-out input
      {2, 2, 7, 9, 3, 3, 2, {3, 2, 1, 1}, true},    // stride 3 with padding
  };
  return c;
}

}  // namespace

TEST(Conv2d, MatchesNaiveFloat64) {
  for (size_t i = 0; i < cases().size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    check_case(cases()[i], kFloat64, false, 10 + i);
  }
}

TEST(Conv2d, MatchesNaiveFloat32) {
  for (size_t i = 0; i < cases().size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    check_case(cases()[i], kFloat32, false, 20 + i);
  }
}

TEST(Conv2d, NonContiguousInputs) {
  check_case(cases()[1], kFloat64, true, 30);
  check_case(cases()[2], kFloat32, true, 31);
}

TEST(Conv2d, SeveralThreadsSplitTheBatch) {
  // Enough work per image that the batch is cut into chunks, with an uneven
  // split (5 images over 2 or 3 chunks), so the weight-gradient reduction runs.
  const Case c{5, 8, 16, 15, 16, 3, 3, {1, 1, 1, 1}, true};
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_case(c, kFloat64, false, 40);
    check_case(c, kFloat32, false, 41);
  }
}

TEST(Conv2d, OneChannelDirectKernels) {
  // C = 1, 3x3, stride 1, no padding takes the direct float32 kernels
  // (kernels/cpu/conv_c1.cpp) for the forward and for weight/bias gradients
  // without an input gradient: rows with a partial vector (Q = 35 = 16+16+3)
  // and fewer than 16 columns (Q = 5), output channels not a multiple of the
  // 8- and 2-channel blocks, with and without bias, over several threads.
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_case({3, 1, 21, 37, 11, 3, 3, {1, 1, 0, 0}, true}, kFloat32, false, 60);
    check_case({5, 1, 7, 7, 9, 3, 3, {1, 1, 0, 0}, false}, kFloat32, false, 61);
    check_case({2, 1, 9, 18, 1, 3, 3, {1, 1, 0, 0}, true}, kFloat32, true, 62);
  }
}

TEST(Conv2d, OneChannelPaddedDirectKernels) {
  // C = 1, 3x3, stride 1, padding 1 (a ResNet's stem) takes the same kernels in the flat layout, the
  // border's lanes masked off: 16-position vectors spanning row ends (W = 7 and 5: a vector holds
  // parts of three or four rows), a last partial vector (H * W = 35, 60), maps of one row or one
  // column (every tap but the middle row or column masked), a 1x1 image (only the centre tap), the
  // stem's 28x28 (49 whole vectors), channel counts off the 8- and 2-channel blocks, over threads.
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_case({3, 1, 28, 28, 8, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 66);
    check_case({2, 1, 5, 7, 11, 3, 3, {1, 1, 1, 1}, false}, kFloat32, false, 67);
    check_case({4, 1, 12, 5, 3, 3, 3, {1, 1, 1, 1}, true}, kFloat32, true, 68);
    check_case({2, 1, 1, 19, 9, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 69);
    check_case({2, 1, 17, 1, 2, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 70);
    check_case({3, 1, 1, 1, 17, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 71);
  }
}

TEST(Conv2d, PermutedIm2colAndItsFallback) {
  // Stride 1, no padding, float32: the column matrix is built by permutes
  // when 16 consecutive column elements span at most 32 input values (Q = 3,
  // W = 5: five row breaks in a vector), and by the row-copy loop otherwise
  // (Q = 1, W = 4: 16 elements span 61 values).
  check_case({2, 3, 9, 5, 4, 3, 3, {1, 1, 0, 0}, true}, kFloat32, false, 63);
  check_case({2, 2, 20, 4, 3, 2, 4, {1, 1, 0, 0}, true}, kFloat32, false, 64);
  check_case({3, 4, 14, 15, 5, 2, 2, {1, 1, 0, 0}, false}, kFloat32, true, 65);
}

TEST(Conv2d, MnistShapes) {
  // The two convolutions of the MNIST net, at a reduced batch.
  check_case({3, 1, 28, 28, 32, 3, 3, {1, 1, 0, 0}, true}, kFloat32, false, 50);
  check_case({2, 32, 13, 13, 64, 3, 3, {1, 1, 0, 0}, true}, kFloat32, false, 51);
}

TEST(Conv2d, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({1, 3, 5, 5});
  const Tensor w = Tensor::zeros({2, 4, 3, 3});
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w, Tensor(), {}); }, {"3 channels", "4"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::conv2d_forward(Tensor::zeros({3, 5, 5}), w, Tensor(), {});
      },
      {"[N, C, H, W]"}));
  const Tensor w3 = Tensor::zeros({2, 3, 3, 3});
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w3, Tensor::zeros({3}), {}); }, {"bias"}));
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w3, Tensor(), {0, 1, 0, 0}); }, {"stride"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::conv2d_forward(x, Tensor::zeros({2, 3, 7, 7}), Tensor(), {});
      },
      {"smaller than the kernel"}));
  // Dilation and groups: the CPU kernel takes plain convolutions only (nn composes the others); a
  // dilated kernel must still fit the padded input.
  const Tensor wg = Tensor::zeros({2, 1, 3, 3});
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, wg, Tensor(), {1, 1, 0, 0, 1, 1, 3}); },
                          {"conv2d_forward", "groups", "expects 3"}));  // 2 output channels, 3 groups
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(Tensor::zeros({1, 2, 5, 5}), wg, Tensor(), {1, 1, 0, 0, 1, 1, 2}); },
                          {"the CPU kernel takes dilation 1 and groups 1", "groups 2"}));
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w3, Tensor(), {1, 1, 0, 0, 2, 2, 1}); },
                          {"the CPU kernel takes dilation 1", "dilation (2, 2)"}));
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w3, Tensor(), {1, 1, 0, 0, 3, 1, 1}); },
                          {"smaller than the kernel 7x3"}));
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w3, Tensor(), {1, 1, 0, 0, 0, 1, 1}); },
                          {"dilation and groups must be >= 1"}));
  EXPECT_TRUE(
      throws_with([&] { kernels::conv2d_forward(x.to(kInt64), w3.to(kInt64), Tensor(), {}); }, {"float32"}));
  EXPECT_TRUE(throws_with([&] { kernels::conv2d_forward(x, w3.to(kFloat64), Tensor(), {}); }, {"float32"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::conv2d_backward(Tensor::zeros({1, 2, 4, 4}), x, w3, {}, true, true, false);
      },
      {"grad_out", "[1, 2, 3, 3]"}));
}

TEST(Conv2dCpu, RejectsNonFloatDtypes) {
  const Tensor x = Tensor::zeros({1, 1, 3, 3}, kInt32);
  EXPECT_TRUE(throws_with([&] { kernels::cpu::conv2d_forward(x, x, Tensor(), {}); }, {"int32"}));
}

TEST(Conv2d, StrideOnePaddedIm2colThroughABorderedCopy) {
  // Stride 1 with padding (not the 3x3 / padding 1 / <= 64 channels of the direct kernels),
  // float32: the column matrix is built from a zero-bordered copy of the image through the permutes.
  check_case({2, 3, 9, 11, 4, 5, 5, {1, 1, 2, 2}, true}, kFloat32, false, 80);
  check_case({2, 2, 10, 6, 3, 3, 3, {1, 1, 2, 1}, false}, kFloat32, true, 81);
  // 3x3 / stride 1 / padding 1 with more output channels than the direct kernels take.
  check_case({2, 3, 6, 6, 70, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 82);
}

TEST(Conv2d, ThreeByThreePaddingOneDirectKernels) {
  // 3x3, stride 1, padding 1, float32: the forward, the input gradient and the weight gradient
  // take the direct kernels of kernels/cpu/conv3x3.cpp. Rows of 37 columns (two vectors, then a 5-column tail), exactly 16
  // and 17, 1 and 7; output channels in blocks of 8 and singles (11 = 8 + 3, 3, 1), and in the weight
  // gradient's blocks of 3, 2 and 1 (11 = 3 + 3 + 3 + 2, 7 = 3 + 3 + 1); one input channel;
  // non-square images; with and without bias; strided inputs; over several threads.
  // The ResNet's own shapes last.
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_case({3, 5, 6, 37, 11, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 70);
    check_case({2, 3, 16, 16, 8, 3, 3, {1, 1, 1, 1}, false}, kFloat32, false, 71);
    check_case({2, 4, 5, 17, 3, 3, 3, {1, 1, 1, 1}, true}, kFloat32, true, 72);
    check_case({3, 1, 9, 1, 1, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 73);
    check_case({2, 2, 1, 7, 9, 3, 3, {1, 1, 1, 1}, false}, kFloat32, false, 74);
    check_case({2, 5, 6, 9, 7, 3, 3, {1, 1, 1, 1}, true}, kFloat32, false, 78);
  }
  check_case({2, 8, 28, 28, 8, 3, 3, {1, 1, 1, 1}, false}, kFloat32, false, 75);
  check_case({2, 16, 14, 14, 16, 3, 3, {1, 1, 1, 1}, false}, kFloat32, false, 76);
  check_case({2, 32, 7, 7, 32, 3, 3, {1, 1, 1, 1}, false}, kFloat32, false, 77);
}

TEST(Conv2d, StrideTwoDirectKernels) {
  // Stride 2 both ways, 1x1 or 3x3, float32: the forward, the input gradient and the weight
  // gradient take the direct kernels of kernels/cpu/conv_strided.cpp. Even and odd image sides
  // (the last padded row read or not), padding 0, 1 and 2 (every phase's first column and row
  // shifted), rows of 35 outputs (two vectors, then a tail) and of 1; 1x1 maps up to 32 wide (the
  // input gradient's row pairs: 31 and 32 columns, an odd last row) and wider (34: row by row);
  // channels in the forward's blocks of 8 and singles (11 = 8 + 3), the weight gradient's 4 x 4 and
  // 3 x 1 blocks and their remainders (5, 7); the 1x1's flat groups of images and its channels-last weight
  // gradient; 1x1 images; strided
  // inputs; over several threads. More than 64 channels take im2col. The ResNet's own shapes last.
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_case({3, 5, 9, 70, 11, 3, 3, {2, 2, 1, 1}, true}, kFloat32, false, 90);
    check_case({2, 3, 8, 8, 7, 3, 3, {2, 2, 0, 0}, false}, kFloat32, false, 91);
    check_case({2, 4, 7, 10, 5, 3, 3, {2, 2, 2, 1}, true}, kFloat32, true, 92);
    check_case({2, 7, 12, 9, 5, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 93);
    check_case({3, 8, 15, 34, 16, 1, 1, {2, 2, 0, 0}, false}, kFloat32, true, 94);
    check_case({2, 2, 1, 1, 3, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 95);
    check_case({2, 5, 13, 31, 6, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 102);
    check_case({3, 3, 6, 32, 5, 1, 1, {2, 2, 0, 0}, false}, kFloat32, false, 103);
    // The 1x1's flat groups (maps whose P Q leaves lanes idle, laid end to end): 49 positions in groups
    // of 16 images and a short one, 3 x 3 maps with vectors over three images (7 = 4 + 3 output
    // channels), and 9 x 9 maps whose group the cache bound halves to 8.
    check_case({17, 16, 14, 14, 32, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 104);
    check_case({19, 3, 6, 5, 7, 1, 1, {2, 2, 0, 0}, true}, kFloat32, true, 105);
    check_case({9, 60, 17, 17, 5, 1, 1, {2, 2, 0, 0}, false}, kFloat32, false, 106);
    // The weight gradient with the even pixels channels last (16 or 32 input channels, maps at most 16
    // wide): 16 wide (8 columns, every transposed vector stored), odd sides (13: 7 columns), 32 channels
    // (two lane groups, blocks of 8), output channels past the blocks (20 = 16 + 4, 11 = 8 + 3), one
    // column.
    check_case({7, 16, 16, 16, 20, 1, 1, {2, 2, 0, 0}, true}, kFloat32, true, 107);
    check_case({3, 16, 13, 13, 32, 1, 1, {2, 2, 0, 0}, false}, kFloat32, false, 108);
    check_case({5, 32, 10, 9, 11, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 109);
    check_case({2, 16, 5, 1, 3, 1, 1, {2, 2, 0, 0}, false}, kFloat32, false, 110);
    // The 1x1's channels in the lanes (projection_lanes_*): two vectors of 20 input channels, the forward's
    // two vectors of 27 output channels, 16 positions of one vector of output channels.
    check_case({3, 20, 12, 11, 9, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 111);
    check_case({2, 5, 9, 15, 27, 1, 1, {2, 2, 0, 0}, true}, kFloat32, true, 112);
    check_case({2, 9, 5, 31, 13, 1, 1, {2, 2, 0, 0}, true}, kFloat32, false, 113);
    check_case({2, 3, 2, 3, 9, 3, 3, {2, 2, 1, 2}, true}, kFloat32, false, 96);
  }
  check_case({2, 70, 6, 6, 3, 3, 3, {2, 2, 1, 1}, true}, kFloat32, false, 97);
  check_case({2, 8, 28, 28, 16, 3, 3, {2, 2, 1, 1}, false}, kFloat32, false, 98);
  check_case({2, 16, 14, 14, 32, 3, 3, {2, 2, 1, 1}, false}, kFloat32, false, 99);
  check_case({2, 8, 28, 28, 16, 1, 1, {2, 2, 0, 0}, false}, kFloat32, false, 100);
  check_case({2, 16, 14, 14, 32, 1, 1, {2, 2, 0, 0}, false}, kFloat32, false, 101);
}
