// The CPU's oneDNN paths (kernels/cpu/dnnl.h): which GEMM path the low-precision conv2d/linear take,
// derived here independently from CPUID and ONEDNN_MAX_CPU_ISA (AMX tiles, else AVX512_BF16, else
// the widening fallback), and bf16 results against float64 math on the same bf16 operands.
// Tolerance of a bf16 result y against the exact ref = sum_k a_k b_k of K bf16 products: each
// product is exact in f32 (8 + 8 mantissa bits), the f32 sum of K terms is within
// K * 2^-24 * sum_k |a_k b_k| of ref (the standard gamma_K bound), and the one rounding to bf16 (8
// mantissa bits) adds at most 2^-9 * |y|; we allow 2^-8 * |ref| + K * 2^-23 * sum_k |a_k b_k|, twice
// the bound (the sum bound is loose; a wrong kernel misses it by orders of magnitude).
// The ctest Dnnl.FallbackWithoutBf16Instructions runs GemmPath.* under ONEDNN_MAX_CPU_ISA=AVX512_CORE.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "kernel_test_util.h"
#include "kernels/amp.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/small_gemm.h"
#include "kernels/linear.h"

using namespace tandem;
using namespace tandem::test;
using kernels::cpu::GemmKernel;
using kernels::cpu::GemmPath;

namespace {

// The path bf16 GEMMs must take on this machine: from CPUID, capped by ONEDNN_MAX_CPU_ISA.
GemmPath expected_bf16_path() {
  if (!kernels::cpu::onednn_built()) return GemmPath::fallback;
  __builtin_cpu_init();
  bool amx = false;
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
  amx = __builtin_cpu_supports("amx-bf16");
#endif
  bool bf16 = __builtin_cpu_supports("avx512bf16");
  if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA"); cap != nullptr && *cap != '\0') {
    std::string c(cap);
    for (char& ch : c) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (c != "ALL" && c != "AVX512_CORE_AMX") amx = false;
    if (c != "ALL" && c != "AVX512_CORE_AMX" && c != "AVX512_CORE_BF16") bf16 = false;
  }
  return amx ? GemmPath::onednn_amx : bf16 ? GemmPath::onednn_bf16_avx512 : GemmPath::fallback;
}

struct Counts {
  uint64_t c[kernels::cpu::kGemmPaths];
};
Counts counts(GemmKernel k) {
  Counts r{};
  for (int p = 0; p < kernels::cpu::kGemmPaths; ++p) r.c[p] = kernels::cpu::gemm_path_count(k, GemmPath(p));
  return r;
}
// Each call since `before` took `path`, and `calls` calls were made.
void expect_only(GemmKernel k, const Counts& before, GemmPath path, uint64_t calls) {
  const Counts now = counts(k);
  for (int p = 0; p < kernels::cpu::kGemmPaths; ++p) {
    EXPECT_EQ(now.c[p] - before.c[p], GemmPath(p) == path ? calls : 0u)
        << "path " << kernels::cpu::gemm_path_name(GemmPath(p)) << " (expected all on "
        << kernels::cpu::gemm_path_name(path) << ", oneDNN ISA " << kernels::cpu::onednn_isa() << ")";
  }
}

Tensor bf16_random(const Shape& s, Generator& gen) { return kernels::cast(random_tensor(s, kFloat32, gen), kBFloat16); }

// got (bf16) against ref and the bound's sum of |products| (both float64, same shape).
::testing::AssertionResult within_bf16(const Tensor& got, const Tensor& ref, const Tensor& abs_ref, int64_t K) {
  if (got.dtype() != kBFloat16) return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype());
  if (got.shape() != ref.shape()) return ::testing::AssertionFailure() << "shape " << got.str();
  const auto g = values(got), r = values(ref), a = values(abs_ref);
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = 0x1p-8 * std::abs(r[i]) + double(K) * 0x1p-23 * a[i] + 1e-30;
    if (!(std::abs(g[i] - r[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << r[i] << " (tol " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

Tensor f64(const Tensor& t) { return t.to(kFloat64); }
Tensor abs64(const Tensor& t) {
  auto v = values(t);
  for (double& e : v) e = std::abs(e);
  return Tensor::from_vector<double>(v, t.shape());
}

}  // namespace

TEST(GemmPath, LowPrecisionLinearAndConvTakeTheCpusPath) {
  const GemmPath want = expected_bf16_path();
  EXPECT_EQ(kernels::cpu::lowp_gemm_path(kBFloat16), want) << "oneDNN ISA " << kernels::cpu::onednn_isa();
  EXPECT_EQ(kernels::cpu_bf16_pays(), want != GemmPath::fallback);
  Generator gen(3);
  const Tensor x = bf16_random({8, 32}, gen), w = bf16_random({16, 32}, gen), b = bf16_random({16}, gen);
  Counts before = counts(GemmKernel::lowp_linear);
  const Tensor y = kernels::lowp_linear_forward(x, w, b);
  kernels::lowp_linear_backward(kernels::cast(Tensor::ones(y.shape()), kBFloat16), x, w, true, true, true);
  expect_only(GemmKernel::lowp_linear, before, want, 2);

  const Tensor cx = bf16_random({2, 16, 9, 9}, gen), cw = bf16_random({32, 16, 3, 3}, gen);
  before = counts(GemmKernel::lowp_conv2d);
  const Tensor cy = kernels::lowp_conv2d_forward(cx, cw, Tensor(), {2, 2, 1, 1});
  kernels::lowp_conv2d_backward(kernels::cast(Tensor::ones(cy.shape()), kBFloat16), cx, cw, {2, 2, 1, 1}, true,
                                true, true);
  expect_only(GemmKernel::lowp_conv2d, before, want, 2);
  // f16 has no native CPU path here: always the widening fallback.
  before = counts(GemmKernel::lowp_linear);
  kernels::lowp_linear_forward(x.to(kFloat16), w.to(kFloat16), Tensor());
  expect_only(GemmKernel::lowp_linear, before, GemmPath::fallback, 1);
}

TEST(DnnlBf16, LinearMatchesFloat64OnTheSameOperands) {
  Generator gen(5);
  for (auto [N, I, O] : {std::tuple<int64_t, int64_t, int64_t>{64, 1600, 128}, {7, 33, 5}, {300, 64, 40}}) {
    const Tensor x = bf16_random({N, I}, gen), w = bf16_random({O, I}, gen), b = bf16_random({O}, gen);
    const Tensor y = kernels::lowp_linear_forward(x, w, b);
    const Tensor ref = kernels::linear_forward(f64(x), f64(w), f64(b));
    EXPECT_TRUE(within_bf16(y, ref, kernels::linear_forward(abs64(x), abs64(w), abs64(b)), I)) << N << "x" << I;
    const Tensor dy = bf16_random({N, O}, gen);
    const auto g = kernels::lowp_linear_backward(dy, x, w, true, true, true);
    const auto r = kernels::linear_backward(f64(dy), f64(x), f64(w), true, true, true);
    const auto ra = kernels::linear_backward(abs64(dy), abs64(x), abs64(w), true, true, true);
    EXPECT_TRUE(within_bf16(g.input, r.input, ra.input, O));
    EXPECT_TRUE(within_bf16(g.weight, r.weight, ra.weight, N));
    EXPECT_TRUE(within_bf16(g.bias, r.bias, ra.bias, N));
  }
}

TEST(DnnlBf16, ConvMatchesFloat64OnTheSameOperands) {
  Generator gen(6);
  struct Case {
    Shape x, w;
    kernels::Conv2dArgs args;
  };
  // 3x3 stride 1 (MnistNet's conv2 in small), 3x3 stride 2 with padding and 1x1 (ResNet's), and 4
  // channels, whose weight gradient oneDNN has no native bf16 kernel for (that part is widened).
  for (const Case& c : {Case{{4, 32, 12, 12}, {64, 32, 3, 3}, {1, 1, 0, 0}},
                        Case{{3, 16, 9, 9}, {32, 16, 3, 3}, {2, 2, 1, 1}}, Case{{2, 24, 8, 8}, {40, 24, 1, 1}, {}},
                        Case{{2, 4, 9, 9}, {8, 4, 3, 3}, {1, 1, 1, 1}}}) {
    const Tensor x = bf16_random(c.x, gen), w = bf16_random(c.w, gen), b = bf16_random({c.w[0]}, gen);
    const int64_t K = c.w[1] * c.w[2] * c.w[3];
    const Tensor y = kernels::lowp_conv2d_forward(x, w, b, c.args);
    EXPECT_TRUE(within_bf16(y, kernels::conv2d_forward(f64(x), f64(w), f64(b), c.args),
                            kernels::conv2d_forward(abs64(x), abs64(w), abs64(b), c.args), K));
    const Tensor dy = bf16_random(y.shape(), gen);
    const auto g = kernels::lowp_conv2d_backward(dy, x, w, c.args, true, true, true);
    const auto r = kernels::conv2d_backward(f64(dy), f64(x), f64(w), c.args, true, true, true);
    const auto ra = kernels::conv2d_backward(abs64(dy), abs64(x), abs64(w), c.args, true, true, true);
    const int64_t spatial = y.size(0) * y.size(2) * y.size(3);
    EXPECT_TRUE(within_bf16(g.input, r.input, ra.input, c.w[0] * c.w[2] * c.w[3]));
    EXPECT_TRUE(within_bf16(g.weight, r.weight, ra.weight, spatial));
    EXPECT_TRUE(within_bf16(g.bias, r.bias, ra.bias, spatial));
  }
}

TEST(DnnlBf16, SameBitsOnEveryRunAtAThreadCount) {
  // Each call runs as one single-threaded slice per thread, reduced in slice order
  // (kernels/cpu/dnnl.cpp): a rerun at the same thread count gives the same bits (the trainer's
  // resume and DDP-equivalence checks rely on it). MnistNet's conv2 and fc1 shapes.
  Generator gen(8);
  const Tensor x = bf16_random({64, 32, 12, 12}, gen), w = bf16_random({64, 32, 3, 3}, gen);
  const Tensor gy = bf16_random({64, 64, 10, 10}, gen);
  const Tensor lx = bf16_random({64, 1024}, gen), lw = bf16_random({128, 1024}, gen), lgy = bf16_random({64, 128}, gen);
  auto run = [&] {
    const auto g = kernels::lowp_conv2d_backward(gy, x, w, {}, true, true, true);
    const auto lg = kernels::lowp_linear_backward(lgy, lx, lw, true, true, true);
    return std::vector<std::vector<double>>{values(kernels::lowp_conv2d_forward(x, w, Tensor(), {})),
                                            values(g.input),
                                            values(g.weight),
                                            values(g.bias),
                                            values(kernels::lowp_linear_forward(lx, lw, Tensor())),
                                            values(lg.input),
                                            values(lg.weight)};
  };
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    const auto first = run(), second = run();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], second[i]) << "result " << i << ", threads " << threads;
  }
}

TEST(GemmPath, Float32LinearCountsSmallGemmOrEigen) {
  Generator gen(9);
  // Batch 64, 2^20+ multiply-adds: the small GEMM where the build has it (kernels/cpu/small_gemm.h).
  const Tensor x = random_tensor({64, 256}, kFloat32, gen), w = random_tensor({128, 256}, kFloat32, gen);
  const GemmPath big = kernels::cpu::detail::small_gemm_available() ? GemmPath::small_gemm : GemmPath::eigen;
  Counts before = counts(GemmKernel::linear_forward);
  kernels::linear_forward(x, w, Tensor());
  expect_only(GemmKernel::linear_forward, before, big, 1);
  // A tiny product: Eigen.
  before = counts(GemmKernel::linear_forward);
  kernels::linear_forward(random_tensor({2, 3}, kFloat32, gen), random_tensor({4, 3}, kFloat32, gen), Tensor());
  expect_only(GemmKernel::linear_forward, before, GemmPath::eigen, 1);
}

TEST(DnnlF32, ConvWithSixteenChannelsTakesOneDnnAndMatchesFloat64) {
  // >= 16 input and output channels: oneDNN's f32 convolution where the build has it, else the
  // engine's own kernels; 3x3 stride 1 and 2 with padding, 1x1, over 1 to 3 threads.
  Generator gen(10);
  const GemmPath want = kernels::cpu::onednn_built() ? GemmPath::onednn_f32 : GemmPath::eigen;
  struct Case {
    Shape x, w;
    kernels::Conv2dArgs args;
  };
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    for (const Case& c : {Case{{5, 16, 9, 9}, {16, 16, 3, 3}, {1, 1, 1, 1}},
                          Case{{3, 16, 10, 10}, {32, 16, 3, 3}, {2, 2, 1, 1}}, Case{{4, 32, 6, 6}, {16, 32, 1, 1}, {}}}) {
      const Tensor x = random_tensor(c.x, kFloat32, gen), w = random_tensor(c.w, kFloat32, gen);
      const Tensor b = random_tensor({c.w[0]}, kFloat32, gen);
      Counts fwd = counts(GemmKernel::conv2d_forward), bwd = counts(GemmKernel::conv2d_backward);
      const Tensor y = kernels::conv2d_forward(x, w, b, c.args);
      const Tensor gy = random_tensor(y.shape(), kFloat32, gen);
      const auto g = kernels::conv2d_backward(gy, x, w, c.args, true, true, true);
      expect_only(GemmKernel::conv2d_forward, fwd, want, 1);
      expect_only(GemmKernel::conv2d_backward, bwd, want, 1);
      EXPECT_TRUE(all_close(y, values(kernels::conv2d_forward(f64(x), f64(w), f64(b), c.args)), tol_for(kFloat32)));
      const auto r = kernels::conv2d_backward(f64(gy), f64(x), f64(w), c.args, true, true, true);
      EXPECT_TRUE(all_close(g.input, values(r.input), tol_for(kFloat32)));
      EXPECT_TRUE(all_close(g.weight, values(r.weight), tol_for(kFloat32)));
      EXPECT_TRUE(all_close(g.bias, values(r.bias), tol_for(kFloat32)));
    }
  }
}

TEST(DnnlF32, BiasGradientAloneIsTheSumOfTheOutputGradient) {
  // A bias gradient asked without the weight's (a frozen weight): the sums of gy over images and
  // pixels, in f32 and under bf16 (rounded once), with or without the input's gradient; no weight.
  Generator gen(12);
  for (int threads : {1, 2}) {
    ThreadCountGuard guard(threads);
    for (bool input : {false, true}) {
      const Tensor x = random_tensor({3, 16, 10, 10}, kFloat32, gen), w = random_tensor({32, 16, 3, 3}, kFloat32, gen);
      const kernels::Conv2dArgs args{2, 2, 1, 1};
      const Tensor gy = random_tensor({3, 32, 5, 5}, kFloat32, gen);
      const auto g = kernels::conv2d_backward(gy, x, w, args, input, false, true);
      const auto r = kernels::conv2d_backward(f64(gy), f64(x), f64(w), args, true, true, true);
      EXPECT_FALSE(g.weight.defined());
      EXPECT_EQ(g.input.defined(), input);
      EXPECT_TRUE(all_close(g.bias, values(r.bias), tol_for(kFloat32)));
      if (input) {
        EXPECT_TRUE(all_close(g.input, values(r.input), tol_for(kFloat32)));
      }

      const Tensor xb = bf16_random(x.shape(), gen), wb = bf16_random(w.shape(), gen);
      const Tensor gyb = bf16_random(gy.shape(), gen);
      const auto gb = kernels::lowp_conv2d_backward(gyb, xb, wb, args, input, false, true);
      const auto rb = kernels::conv2d_backward(f64(gyb), f64(xb), f64(wb), args, true, true, true);
      const auto rab = kernels::conv2d_backward(abs64(gyb), abs64(xb), abs64(wb), args, true, true, true);
      EXPECT_FALSE(gb.weight.defined());
      EXPECT_EQ(gb.bias.dtype(), kBFloat16);
      EXPECT_TRUE(within_bf16(gb.bias, rb.bias, rab.bias, 3 * 5 * 5));
      if (input) {
        EXPECT_TRUE(within_bf16(gb.input, rb.input, rab.input, 32 * 9));
      }
    }
  }
}

TEST(DnnlF32, ConvBuffersComeFromTheEnginesCachingAllocator) {
  // oneDNN computes in its blocked layouts: the blocked copies of x and w and the blocked result are
  // buffers of the engine's caching allocator (reused from call to call, no fresh mapping each time),
  // and they go back to it when the call returns.
  if (!kernels::cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN: the conv runs the engine's kernels";
  ThreadCountGuard guard(1);
  Generator gen(12);
  const Tensor x = random_tensor({4, 16, 12, 12}, kFloat32, gen), w = random_tensor({16, 16, 3, 3}, kFloat32, gen);
  const kernels::Conv2dArgs same{1, 1, 1, 1};
  CachingAllocator& a = host_allocator();
  kernels::conv2d_forward(x, w, Tensor(), same);  // the primitive built
  const size_t before = a.allocated_bytes();
  a.reset_peak_allocated();
  const Tensor y = kernels::conv2d_forward(x, w, Tensor(), same);
  const size_t bytes = x.numel() * sizeof(float);  // y has x's size
  EXPECT_GE(a.peak_allocated_bytes() - before, 3 * bytes) << "y, the blocked x and the blocked y";
  // Only y is still held (in a cached block of its size class or up to twice it).
  EXPECT_GE(a.allocated_bytes() - before, bytes);
  EXPECT_LE(a.allocated_bytes() - before, 2 * bytes);
}

namespace {

using kernels::cpu::MatmulSplit;

// How many bf16 matmuls took each split (kernels/cpu/dnnl.h, MatmulSplit) while fn ran.
template <typename Fn>
std::vector<uint64_t> splits_during(Fn&& fn) {
  std::vector<uint64_t> before(kernels::cpu::kMatmulSplits);
  for (int s = 0; s < kernels::cpu::kMatmulSplits; ++s) before[s] = kernels::cpu::matmul_split_count(MatmulSplit(s));
  fn();
  for (int s = 0; s < kernels::cpu::kMatmulSplits; ++s)
    before[s] = kernels::cpu::matmul_split_count(MatmulSplit(s)) - before[s];
  return before;
}

// The counts of a run where `calls` matmuls all took `split`.
std::vector<uint64_t> only(MatmulSplit split, uint64_t calls) {
  std::vector<uint64_t> v(kernels::cpu::kMatmulSplits, 0);
  v[static_cast<int>(split)] = calls;
  return v;
}

}  // namespace

TEST(DnnlSplit, EachShapeTakesTheRulesSplitAndStaysWithinBf16Tolerance) {
  // Shapes on each side of MatmulSplit's rules, over 1 to 3 threads. Where the CPU has no native
  // bf16 path no oneDNN matmul runs (all counts zero). MatmulSplit::whole at 1 thread always.
  const bool native = expected_bf16_path() != GemmPath::fallback;
  struct Case {
    int64_t N, I, O;
    int threads;
    MatmulSplit forward;
    std::vector<uint64_t> backward;  // counts of the input and weight gradients' matmuls
  };
  const std::vector<Case> cases = {
      // The GPT's projections (1024 tokens, width 64): rows forward; at 2 threads the two
      // gradients paired; at 3 the input gradient by rows, the weight gradient by depth.
      {1024, 64, 64, 1, MatmulSplit::whole, only(MatmulSplit::whole, 2)},
      {1024, 64, 64, 2, MatmulSplit::rows, only(MatmulSplit::paired, 2)},
      {1024, 64, 64, 3, MatmulSplit::rows, {0, 1, 0, 1, 0}},
      // Few rows, many outputs: the forward by columns of w^T; at 3 threads the input gradient
      // (b = w row-major: no column split) by rows, the weight gradient (depth 8) whole.
      {8, 1024, 1024, 2, MatmulSplit::cols, only(MatmulSplit::paired, 2)},
      {8, 1024, 1024, 3, MatmulSplit::cols, {1, 1, 0, 0, 0}},
      // Below 2^20 multiply-adds: whole, and the gradients not paired.
      {8, 32, 16, 2, MatmulSplit::whole, only(MatmulSplit::whole, 2)},
      // A depth (batch) of 64 < 2 x 128: the weight gradient whole; 512: by depth.
      {64, 1024, 256, 3, MatmulSplit::cols, {1, 1, 0, 0, 0}},
      {512, 1024, 256, 3, MatmulSplit::rows, {0, 1, 0, 1, 0}},
  };
  Generator gen(12);
  for (const Case& c : cases) {
    ThreadCountGuard guard(c.threads);
    const Tensor x = bf16_random({c.N, c.I}, gen), w = bf16_random({c.O, c.I}, gen), b = bf16_random({c.O}, gen);
    const Tensor dy = bf16_random({c.N, c.O}, gen);
    Tensor y;
    kernels::LinearGrads g;
    const auto fwd = splits_during([&] { y = kernels::lowp_linear_forward(x, w, b); });
    const auto bwd = splits_during([&] { g = kernels::lowp_linear_backward(dy, x, w, true, true, true); });
    const std::string where = std::to_string(c.N) + "x" + std::to_string(c.I) + "x" + std::to_string(c.O) + " at " +
                              std::to_string(c.threads) + " threads";
    EXPECT_EQ(fwd, native ? only(c.forward, 1) : only(MatmulSplit::whole, 0)) << where;
    std::vector<uint64_t> want_bwd = c.backward;
    if (!native) want_bwd.assign(kernels::cpu::kMatmulSplits, 0);
    EXPECT_EQ(bwd, want_bwd) << where;
    EXPECT_TRUE(within_bf16(y, kernels::linear_forward(f64(x), f64(w), f64(b)),
                            kernels::linear_forward(abs64(x), abs64(w), abs64(b)), c.I))
        << where;
    const auto r = kernels::linear_backward(f64(dy), f64(x), f64(w), true, true, true);
    const auto ra = kernels::linear_backward(abs64(dy), abs64(x), abs64(w), true, true, true);
    EXPECT_TRUE(within_bf16(g.input, r.input, ra.input, c.O)) << where;
    EXPECT_TRUE(within_bf16(g.weight, r.weight, ra.weight, c.N)) << where;
    EXPECT_TRUE(within_bf16(g.bias, r.bias, ra.bias, c.N)) << where;
  }
}
