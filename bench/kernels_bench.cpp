// The CPU kernels of MnistNet's step on its own shapes (batch 64), one thread: the conv layers of
// MnistNet and the example ResNet forward and backward (f32 and bf16), linear forward and backward,
// and the fused batch_norm+relu+max_pool beside the unfused composition it replaces (batch_norm_relu
// then max_pool2d), so that the fusion's gain shows as a ratio of the same run (and the first layer's conv
// fused with it beside the ops one by one, BM_FirstLayer); likewise the batch
// norms on a bf16 input beside the cast-up composition they replace. BM_GemmPeak times a
// 512^3 product through the engine's linear entry points at 1 and 2 threads, f32 and bf16: the peak
// that bench/headline.py divides each kernel's FLOP/s by. Build it for another instruction set to
// see that set's kernel paths, e.g.
//   cmake -B build-avx2 -DTANDEM_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3
//   cmake --build build-avx2 --target kernels_bench && build-avx2/bench/kernels_bench
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <string>

#include "core/random.h"
#include "core/thread_pool.h"
#include "kernels/batch_norm.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/amp.h"
#include "kernels/conv.h"
#include "kernels/conv_bn_pool.h"
#include "kernels/conv_pair.h"
#include "kernels/linear.h"
#include "kernels/pool.h"

using namespace tandem;

namespace {

Tensor uniform(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(gen.uniform(lo, hi));
  return t;
}

// MnistNet's two batch-norm layers: conv1's output [64, 32, 26, 26] and conv2's [64, 64, 11, 11].
Shape bn_shape(int64_t layer) { return layer == 0 ? Shape{64, 32, 26, 26} : Shape{64, 64, 11, 11}; }

struct BnCase {
  Tensor x, w, b, rm, rv, gy;
  explicit BnCase(const Shape& s)
      : x(uniform(s, 1, -2, 2)),
        w(uniform({s[1]}, 2, 0.5, 1.5)),
        b(uniform({s[1]}, 3, -0.5, 0.5)),
        rm(Tensor::zeros({s[1]})),
        rv(uniform({s[1]}, 4, 0.5, 2)),
        gy(uniform({s[0], s[1], s[2] / 2, s[3] / 2}, 5)) {}
};

void BM_BnReluPoolFusedForward(benchmark::State& state) {
  set_num_threads(1);
  BnCase c(bn_shape(state.range(0)));
  for (auto _ : state) {
    auto f = kernels::batch_norm_relu_max_pool2d_forward(c.x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
    benchmark::DoNotOptimize(f.output.raw_data());
  }
}

void BM_BnReluPoolUnfusedForward(benchmark::State& state) {
  set_num_threads(1);
  BnCase c(bn_shape(state.range(0)));
  for (auto _ : state) {
    auto bn = kernels::batch_norm_relu_forward(c.x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
    auto pool = kernels::max_pool2d_forward(bn.output, kernels::MaxPool2dArgs{});
    benchmark::DoNotOptimize(pool.output.raw_data());
  }
}

void BM_BnReluPoolFusedBackward(benchmark::State& state) {
  set_num_threads(1);
  BnCase c(bn_shape(state.range(0)));
  auto f = kernels::batch_norm_relu_max_pool2d_forward(c.x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
  for (auto _ : state) {
    auto g = kernels::batch_norm_relu_max_pool2d_backward(c.gy, c.x, f.code, f.winner, c.w, c.b, f.save_mean,
                                                          f.save_invstd, true, true, true, true);
    benchmark::DoNotOptimize(g.input.raw_data());
  }
}

void BM_BnReluPoolUnfusedBackward(benchmark::State& state) {
  set_num_threads(1);
  BnCase c(bn_shape(state.range(0)));
  auto bn = kernels::batch_norm_relu_forward(c.x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
  auto pool = kernels::max_pool2d_forward(bn.output, kernels::MaxPool2dArgs{});
  for (auto _ : state) {
    const Tensor g_relu = kernels::max_pool2d_backward(c.gy, pool.indices, c.x.shape());
    auto g = kernels::batch_norm_relu_backward(g_relu, c.x, c.w, c.b, bn.save_mean, bn.save_invstd, true, true,
                                               true, true);
    benchmark::DoNotOptimize(g.input.raw_data());
  }
}

// MnistNet's first layer, forward and backward (conv1 [1 -> 32, 28x28] then batch norm + relu + 2x2
// max-pool): Arg(0) 1 as the one fused op (kernels/conv_bn_pool.h), 0 as the ops one by one; Arg(1)
// threads (the step's data is hot in cache here, as it is not in the trainer).
void BM_FirstLayer(benchmark::State& state) {
  set_num_threads(static_cast<int>(state.range(1)));
  BnCase c(bn_shape(0));
  const Tensor x = uniform({64, 1, 28, 28}, 6, 0, 1), cw = uniform({32, 1, 3, 3}, 7, -0.3, 0.3);
  const Tensor cb = uniform({32}, 8, -0.1, 0.1);
  for (auto _ : state) {
    if (state.range(0)) {
      auto f = kernels::conv_batch_norm_relu_max_pool2d_forward(x, cw, cb, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
      auto g =
          kernels::conv_batch_norm_relu_max_pool2d_backward(c.gy, x, cw, cb, f, c.w, c.b, true, true, true, true, true);
      benchmark::DoNotOptimize(g.conv_weight.raw_data());
    } else {
      const Tensor y = kernels::conv2d_forward(x, cw, cb, {});
      auto f = kernels::batch_norm_relu_max_pool2d_forward(y, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
      auto g = kernels::batch_norm_relu_max_pool2d_backward(c.gy, y, f.code, f.winner, c.w, c.b, f.save_mean,
                                                            f.save_invstd, true, true, true, true);
      auto d = kernels::conv2d_backward(g.input, x, cw, {}, false, true, true);
      benchmark::DoNotOptimize(d.weight.raw_data());
    }
  }
  set_num_threads(1);
}

// A bf16 activation (autocast's conv output) into batch_norm_relu (kPool false) or the fused
// batch_norm+relu+max_pool (kPool true): Arg(1) 0 times the composition the bf16 kernels replace (x
// cast up to f32, the f32 kernel; backward: the f32 kernel on that saved f32 x, its input gradient
// cast down to bf16), 1 the kernel on the bf16 x itself (same bits). Arg(0) = layer.
template <bool kPool>
void BM_BnReluBf16Forward(benchmark::State& state) {
  set_num_threads(1);
  BnCase c(bn_shape(state.range(0)));
  const Tensor x16 = kernels::cast(c.x, kBFloat16);
  const bool direct = state.range(1) == 1;
  for (auto _ : state) {
    const Tensor x = direct ? x16 : kernels::cast(x16, kFloat32);
    if constexpr (kPool) {
      benchmark::DoNotOptimize(
          kernels::batch_norm_relu_max_pool2d_forward(x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5).output.raw_data());
    } else {
      benchmark::DoNotOptimize(kernels::batch_norm_relu_forward(x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5).output.raw_data());
    }
  }
}

template <bool kPool>
void BM_BnReluBf16Backward(benchmark::State& state) {
  set_num_threads(1);
  BnCase c(bn_shape(state.range(0)));
  const Tensor x16 = kernels::cast(c.x, kBFloat16);
  const Tensor x = state.range(1) == 1 ? x16 : kernels::cast(x16, kFloat32);
  auto f = kernels::batch_norm_relu_max_pool2d_forward(x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
  const Tensor gy = kPool ? c.gy : uniform(x.shape(), 6);
  for (auto _ : state) {
    auto g = kPool ? kernels::batch_norm_relu_max_pool2d_backward(gy, x, f.code, f.winner, c.w, c.b, f.save_mean,
                                                                  f.save_invstd, true, true, true, true)
                   : kernels::batch_norm_relu_backward(gy, x, c.w, c.b, f.save_mean, f.save_invstd, true, true, true,
                                                       true);
    const Tensor gx = kernels::cast(g.input, kBFloat16);  // no pass when it already is bf16
    benchmark::DoNotOptimize(gx.raw_data());
  }
}

// The convolutions timed, batch 64: MnistNet's two (1 -> 32 channels on 28x28 and 32 -> 64 on 13x13,
// 3x3, no padding) and the example ResNet's (examples/resnet: the stem, the 3x3 stride-1 layers of
// its three stages, the two stride-2 3x3 and the two 1x1 stride-2 projections). Arg = index.
// Each case's label names its layer (bench/headline.py prints it).
struct ConvGeom {
  int64_t cin, cout, hw, k, stride, pad;
  bool need_input;  // false for a first layer (no gradient of the images)
  const char* name;
};
constexpr ConvGeom kConvs[] = {
    {1, 32, 28, 3, 1, 0, false, "MnistNet conv1 1->32 3x3, 28x28"},
    {32, 64, 13, 3, 1, 0, true, "MnistNet conv2 32->64 3x3, 13x13"},
    {1, 8, 28, 3, 1, 1, false, "ResNet stem 1->8 3x3, 28x28"},
    {8, 8, 28, 3, 1, 1, true, "ResNet stage 1 8->8 3x3, 28x28"},
    {16, 16, 14, 3, 1, 1, true, "ResNet stage 2 16->16 3x3, 14x14"},
    {32, 32, 7, 3, 1, 1, true, "ResNet stage 3 32->32 3x3, 7x7"},
    {8, 16, 28, 3, 2, 1, true, "ResNet 8->16 3x3 stride 2, 28x28"},
    {16, 32, 14, 3, 2, 1, true, "ResNet 16->32 3x3 stride 2, 14x14"},
    {8, 16, 28, 1, 2, 0, true, "ResNet 8->16 1x1 stride 2, 28x28"},
    {16, 32, 14, 1, 2, 0, true, "ResNet 16->32 1x1 stride 2, 14x14"}};
constexpr int64_t kConvCount = sizeof(kConvs) / sizeof(kConvs[0]);

struct ConvCase {
  Tensor x, w, b, gy;
  kernels::Conv2dArgs args;
  bool need_input;
  explicit ConvCase(int64_t index) {
    const ConvGeom& g = kConvs[index];
    const int64_t out = (g.hw + 2 * g.pad - g.k) / g.stride + 1;
    x = uniform({64, g.cin, g.hw, g.hw}, 6);
    w = uniform({g.cout, g.cin, g.k, g.k}, 7, -0.3, 0.3);
    b = uniform({g.cout}, 8);
    gy = uniform({64, g.cout, out, out}, 9);
    args = kernels::Conv2dArgs{g.stride, g.stride, g.pad, g.pad};
    need_input = g.need_input;
  }
};

// Floating-point operations per second (printed with a G suffix) of `passes` GEMM-sized passes, and
// the layer's name as the label (a backward without the input's gradient says so, and a bf16 case that
// autocast computes in f32, rounding only its output).
void set_conv_flops(benchmark::State& state, const ConvCase& c, double passes, bool backward,
                    bool f32_route = false) {
  const double macs = double(c.gy.numel()) * double(c.w.numel() / c.w.size(0));
  state.counters["FLOP/s"] = benchmark::Counter(2 * macs * passes * double(state.iterations()),
                                                benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
  const bool weight_only = backward && !c.need_input;
  const std::string notes = std::string(weight_only ? "weight grad only" : "") + (weight_only && f32_route ? "; " : "") +
                            (f32_route ? "autocast's f32 route" : "");
  state.SetLabel(kConvs[state.range(0)].name + (notes.empty() ? "" : " (" + notes + ")"));
}

void BM_Conv2dForward(benchmark::State& state) {
  set_num_threads(1);
  ConvCase c(state.range(0));
  for (auto _ : state) {
    Tensor y = kernels::conv2d_forward(c.x, c.w, c.b, c.args);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_conv_flops(state, c, 1, false);
}

void BM_Conv2dBackward(benchmark::State& state) {
  set_num_threads(1);
  ConvCase c(state.range(0));
  for (auto _ : state) {
    auto g = kernels::conv2d_backward(c.gy, c.x, c.w, c.args, c.need_input, true, true);
    benchmark::DoNotOptimize(g.weight.raw_data());
  }
  set_conv_flops(state, c, c.need_input ? 2 : 1, true);
}

// The same convolutions under bf16 autocast, as F::conv2d runs them (kernels/amp.h): the f32 route
// where autocast_conv2d_in_f32 says the engine's f32 kernels win (output rounded to bf16, bf16 output
// gradient), else the low-precision conv (oneDNN with AVX512_BF16/AMX where the CPU has them, else the
// widening emulation) of the f32 input (rounded inside the op) and the bf16 weight.
void BM_Conv2dForwardBf16(benchmark::State& state) {
  set_num_threads(1);
  ConvCase c(state.range(0));
  const bool f32_route = kernels::autocast_conv2d_in_f32(c.x, c.w, c.args);
  const Tensor w = kernels::cast(c.w, kBFloat16), b = kernels::cast(c.b, kBFloat16);
  for (auto _ : state) {
    Tensor y = f32_route ? kernels::autocast_f32_conv2d_forward(c.x, c.w, c.b, c.args, kBFloat16)
                         : kernels::lowp_conv2d_forward(c.x, w, b, c.args);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_conv_flops(state, c, 1, false, f32_route);
}

void BM_Conv2dBackwardBf16(benchmark::State& state) {
  set_num_threads(1);
  ConvCase c(state.range(0));
  const bool f32_route = kernels::autocast_conv2d_in_f32(c.x, c.w, c.args);
  const Tensor w = kernels::cast(c.w, kBFloat16), gy = kernels::cast(c.gy, kBFloat16);
  for (auto _ : state) {
    auto g = f32_route ? kernels::autocast_f32_conv2d_backward(gy, c.x, c.w, c.args, c.need_input, true, true)
                       : kernels::lowp_conv2d_backward(gy, c.x, w, c.args, c.need_input, true, true);
    benchmark::DoNotOptimize(g.weight.raw_data());
  }
  set_conv_flops(state, c, c.need_input ? 2 : 1, true, f32_route);
}

// Linear layers [N, I] x [O, I]^T: a wide-K one (64 x 9216 x 128) and MnistNet's fc1, small K (64 x
// 1600 x 128); arg 1 = 1: bf16 (kernels/amp.h), else f32. Forward, then backward (input and weight grads).
struct LinearCase {
  Tensor x, w, b, gy;
  LinearCase(benchmark::State& state, int64_t which, DType d) {
    const int64_t I = which == 0 ? 9216 : 1600;
    state.SetLabel(which == 0 ? "64x9216x128, wide K" : "64x1600x128, small K (MnistNet fc1)");
    x = kernels::cast(uniform({64, I}, 11), d);
    w = kernels::cast(uniform({128, I}, 12, -0.05, 0.05), d);
    b = kernels::cast(uniform({128}, 13), d);
    gy = kernels::cast(uniform({64, 128}, 14), d);
  }
};

void BM_LinearForward(benchmark::State& state) {
  set_num_threads(1);
  const bool bf16 = state.range(1) != 0;
  LinearCase c(state, state.range(0), bf16 ? kBFloat16 : kFloat32);
  for (auto _ : state) {
    Tensor y = bf16 ? kernels::lowp_linear_forward(c.x, c.w, c.b) : kernels::linear_forward(c.x, c.w, c.b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * 64 * double(c.w.numel()) * double(state.iterations()),
                                                benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}

void BM_LinearBackward(benchmark::State& state) {
  set_num_threads(1);
  const bool bf16 = state.range(1) != 0;
  LinearCase c(state, state.range(0), bf16 ? kBFloat16 : kFloat32);
  for (auto _ : state) {
    auto g = bf16 ? kernels::lowp_linear_backward(c.gy, c.x, c.w, true, true, true)
                  : kernels::linear_backward(c.gy, c.x, c.w, true, true, true);
    benchmark::DoNotOptimize(g.weight.raw_data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * 64 * double(c.w.numel()) * double(state.iterations()),
                                                benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}

// The GEMM peak: [512, 512] x [512, 512]^T through linear_forward (f32) or lowp_linear_forward on
// bf16 operands, arg 0 = threads, arg 1 = 1: bf16. Two threads are timed in wall-clock time (the
// kernel pool's other thread runs beside this one). The f32 case also reports the profiler's peak,
// kernels::measure_gemm_peak_gflops (Eigen's 512^3 GEMM, best of five), as "profiler_peak".
void BM_GemmPeak(benchmark::State& state) {
  constexpr int64_t n = 512;
  const int threads = static_cast<int>(state.range(0));
  const bool bf16 = state.range(1) != 0;
  set_num_threads(threads);
  const DType d = bf16 ? kBFloat16 : kFloat32;
  const Tensor a = kernels::cast(uniform({n, n}, 21), d), b = kernels::cast(uniform({n, n}, 22), d);
  for (auto _ : state) {
    Tensor y = bf16 ? kernels::lowp_linear_forward(a, b, Tensor()) : kernels::linear_forward(a, b, Tensor());
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n * double(state.iterations()),
                                                benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
  if (!bf16)
    state.counters["profiler_peak"] = benchmark::Counter(kernels::measure_gemm_peak_gflops(threads) * 1e9,
                                                         benchmark::Counter::kDefaults,
                                                         benchmark::Counter::OneK::kIs1000);
  state.SetLabel("512x512x512");
  set_num_threads(1);
}

// The core's own arithmetic peak, 1 thread: a loop of independent multiply-adds on registers only
// (no memory), arg = 1: bf16 pairs (vdpbf16ps, 2 multiply-adds per f32 lane; only in builds with
// AVX512_BF16). A GEMM can only approach it; bench/headline.py divides by the larger of this and the
// 512^3 GEMM, so no kernel reads above 100% of what the core can do.
void BM_FmaPeak(benchmark::State& state) {
  set_num_threads(1);
  const bool bf16 = state.range(0) != 0;
  constexpr int kAcc = 12, kSteps = 1000;
  double flops_per_step = 0;
#if defined(__AVX512F__)
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(0.001f * float(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-6f);
  for (auto _ : state) {
    for (int k = 0; k < kSteps; ++k) {
#if defined(__AVX512BF16__)
      if (bf16) {
        for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
        continue;
      }
#endif
      for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    for (int i = 0; i < kAcc; ++i) benchmark::DoNotOptimize(acc[i]);
  }
  flops_per_step = kAcc * (bf16 ? 64.0 : 32.0);
#if !defined(__AVX512BF16__)
  if (bf16) state.SkipWithError("this build has no AVX512_BF16 instructions");
#endif
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(0.001f * float(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-6f);
  for (auto _ : state) {
    for (int k = 0; k < kSteps; ++k) {
      for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    for (int i = 0; i < kAcc; ++i) benchmark::DoNotOptimize(acc[i]);
  }
  flops_per_step = kAcc * 16.0;
  if (bf16) state.SkipWithError("this build has no AVX512_BF16 instructions");
#else
  for (auto _ : state) {
  }
  state.SkipWithError("this build has no vector multiply-add to time");
#endif
  state.counters["FLOP/s"] = benchmark::Counter(flops_per_step * kSteps * double(state.iterations()),
                                                benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
  state.SetLabel("registers only");
}

}  // namespace

BENCHMARK(BM_FmaPeak)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
// One thread on this thread's CPU time like the other cases; two in wall-clock time.
BENCHMARK(BM_GemmPeak)->ArgsProduct({{1}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmPeak)->ArgsProduct({{2}, {0, 1}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluPoolFusedForward)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluPoolUnfusedForward)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluPoolFusedBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluPoolUnfusedBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FirstLayer)->ArgsProduct({{0, 1}, {1, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluBf16Forward<false>)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluBf16Backward<false>)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluBf16Forward<true>)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BnReluBf16Backward<true>)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2dForward)->DenseRange(0, kConvCount - 1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2dBackward)->DenseRange(0, kConvCount - 1)->Unit(benchmark::kMicrosecond);

// The ResNet's stride-2 blocks' two convs of one input (kernels/conv_pair.h), batch 64, 1 thread: the
// fused pair (arg 1 = 0) beside the two convs one by one as the model ran them before (arg 1 = 1; their
// input gradients then added, as autograd adds them). Arg 0: the block, 0 = 8->16 at 28x28, 1 = 16->32
// at 14x14 (kConvs 6 and 8, 7 and 9); arg 2: 0 the forward, 1 the input gradient, 2 the weight gradients.
// FLOP/s counts both convs' multiply-adds.
void BM_Conv2dPair(benchmark::State& state) {
  set_num_threads(1);
  const int64_t block = state.range(0);
  const bool separate = state.range(1) != 0;
  const int64_t part = state.range(2);
  ConvCase main(6 + block), proj(8 + block);
  const Tensor& x = main.x;  // both cases draw x with the same seed and shape
  for (auto _ : state) {
    if (part == 0) {
      if (separate) {
        Tensor a = kernels::conv2d_forward(x, main.w, Tensor(), main.args);
        Tensor b = kernels::conv2d_forward(x, proj.w, Tensor(), proj.args);
        benchmark::DoNotOptimize(b.raw_data());
      } else {
        auto y = kernels::conv2d_pair_forward(x, main.w, proj.w);
        benchmark::DoNotOptimize(y.projection.raw_data());
      }
    } else if (separate) {
      auto a = kernels::conv2d_backward(main.gy, x, main.w, main.args, part == 1, part == 2, false);
      auto b = kernels::conv2d_backward(proj.gy, x, proj.w, proj.args, part == 1, part == 2, false);
      if (part == 1) a.input.add_(b.input);
      benchmark::DoNotOptimize(a);
    } else {
      auto g = kernels::conv2d_pair_backward(main.gy, proj.gy, x, main.w, proj.w, part == 1, part == 2, part == 2);
      benchmark::DoNotOptimize(g);
    }
  }
  const double macs = double(main.gy.numel()) * double(main.w.numel() / main.w.size(0)) +
                      double(proj.gy.numel()) * double(proj.w.numel() / proj.w.size(0));
  state.counters["FLOP/s"] = benchmark::Counter(2 * macs * double(state.iterations()), benchmark::Counter::kIsRate,
                                                benchmark::Counter::OneK::kIs1000);
  static const char* const kPart[] = {"forward", "input gradient", "weight gradients"};
  state.SetLabel(std::string(block == 0 ? "ResNet 8->16" : "ResNet 16->32") + " 3x3 + 1x1 stride 2, " +
                 (separate ? "one by one" : "fused") + ": " + kPart[part]);
}
BENCHMARK(BM_Conv2dPair)->ArgsProduct({{0, 1}, {0, 1}, {0, 1, 2}})->Unit(benchmark::kMicrosecond);

// Where a conv's backward spends its time: one gradient asked for at a time (second Arg: 0 the input's,
// 1 the weight's, 2 the bias's), the same cases as BM_Conv2dBackward, f32, 1 thread.
void BM_ConvGradParts(benchmark::State& state) {
  set_num_threads(1);
  ConvCase c(state.range(0));
  const int64_t part = state.range(1);
  for (auto _ : state) {
    auto g = kernels::conv2d_backward(c.gy, c.x, c.w, c.args, part == 0, part == 1, part == 2);
    benchmark::DoNotOptimize(g);
  }
  static const char* const kPart[] = {"input gradient", "weight gradient", "bias gradient"};
  state.SetLabel(std::string(kConvs[state.range(0)].name) + ": " + kPart[part]);
}
BENCHMARK(BM_ConvGradParts)
    ->ArgsProduct({benchmark::CreateDenseRange(0, kConvCount - 1, 1), {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);
// The memory floor of a conv pass: the tensors the pass must read and write, streamed once each with
// whole-vector loads and stores and no arithmetic, the same tensors as BM_Conv2dForward /
// BM_ConvGradParts (second Arg: 0 the forward, reading x and writing y; 1 the input gradient, reading gy
// and writing gx; 2 the weight gradient, reading gy and x). x is read whole even where a stride-2 1x1
// projection needs only its even rows: streaming every line measured faster here than reading the
// even rows alone. A pass's time against its floor and against the multiply-add loop's time for its
// arithmetic says which of the two bounds it.
void BM_ConvTraffic(benchmark::State& state) {
  set_num_threads(1);
  ConvCase c(state.range(0));
  const int64_t part = state.range(1);
  const Tensor& read = part == 0 ? c.x : c.gy;
  const double bytes = 4.0 * double(c.x.numel() + c.gy.numel());  // every pass moves one x and one gy
#if defined(__AVX512F__)
  // The sum of t's floats in lanes (in registers: it feeds the stores or the sink, so no load can be
  // left out).
  const auto read_all = [](const Tensor& t) {
    const float* p = t.data<float>();
    const int64_t n = t.numel(), whole = n / 16 * 16;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < whole; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(p + i));
    return _mm512_add_ps(acc, _mm512_maskz_loadu_ps(__mmask16((1u << (n - whole)) - 1), p + whole));
  };
  const auto write_all = [](Tensor& t, __m512 v) {
    float* p = t.data<float>();
    const int64_t n = t.numel(), whole = n / 16 * 16;
    for (int64_t i = 0; i < whole; i += 16) _mm512_storeu_ps(p + i, v);
    _mm512_mask_storeu_ps(p + whole, __mmask16((1u << (n - whole)) - 1), v);
  };
  float sink = 0;
  for (auto _ : state) {
    if (part == 2) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, _mm512_add_ps(read_all(c.gy), read_all(c.x)));
      sink += lanes[0];
      continue;
    }
    Tensor out = Tensor::empty(part == 0 ? c.gy.shape() : c.x.shape());  // y or gx, as the kernel allocates
    write_all(out, read_all(read));
    benchmark::DoNotOptimize(out.raw_data());
  }
  benchmark::DoNotOptimize(sink);
#else
  for (auto _ : state) {
  }
  state.SkipWithError("this build has no AVX-512 loads and stores to time");
#endif
  state.counters["bytes/s"] = benchmark::Counter(bytes * double(state.iterations()), benchmark::Counter::kIsRate,
                                                 benchmark::Counter::OneK::kIs1024);
  static const char* const kPart[] = {"forward", "input gradient", "weight gradient"};
  state.SetLabel(std::string(kConvs[state.range(0)].name) + ": memory traffic of the " + kPart[part] + " alone");
}
BENCHMARK(BM_ConvTraffic)
    ->ArgsProduct({benchmark::CreateDenseRange(0, kConvCount - 1, 1), {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2dForwardBf16)->DenseRange(0, kConvCount - 1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2dBackwardBf16)->DenseRange(0, kConvCount - 1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearForward)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearBackward)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
