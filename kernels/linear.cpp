// Device-neutral linear and matmul entry points: validate ranks, the inner
// dimensions, the bias shape, devices and dtypes, then route to cpu:: or
// cuda::. No math here. Also the GEMM peak the profiler reports against.
#include "kernels/linear.h"

#include <algorithm>
#include <chrono>

#include "core/profiler.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

void check_input_weight(const char* op, const Tensor& x, const Tensor& weight) {
  TANDEM_CHECK(x.defined() && weight.defined(), op, ": input and weight must be defined");
  TANDEM_CHECK(x.dim() == 2, op, ": expected input [N, in_features], got ", x.str());
  TANDEM_CHECK(weight.dim() == 2, op, ": expected weight [out_features, in_features], got ", weight.str());
  TANDEM_CHECK(x.size(1) == weight.size(1), op, ": input has ", x.size(1), " features but weight ",
               shape_str(weight.shape()), " expects ", weight.size(1));
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "linear_forward";
  check_input_weight(op, x, weight);
  profiler::Scope prof_scope(op, 2.0 * static_cast<double>(x.size(0)) * static_cast<double>(weight.numel()));
  if (bias.defined()) {
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": expected bias [", weight.size(0),
                 "], got ", bias.str());
  }
  const Device device = common_device(op, {x, weight, bias});
  common_float_dtype(op, {x, weight, bias});
  return TANDEM_KERNEL(device, linear_forward)(x, weight, bias);
}

LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input,
                            bool need_weight, bool need_bias) {
  constexpr const char* op = "linear_backward";
  check_input_weight(op, x, weight);
  profiler::Scope prof_scope(op, 2.0 * (int(need_input) + int(need_weight)) * static_cast<double>(x.size(0)) *
                                     static_cast<double>(weight.numel()));
  const Shape expected{x.size(0), weight.size(0)};
  TANDEM_CHECK(grad_out.defined() && grad_out.shape() == expected, op, ": expected grad_out ",
               shape_str(expected), ", got ", grad_out.defined() ? grad_out.str() : "undefined tensor");
  const Device device = common_device(op, {grad_out, x, weight});
  common_float_dtype(op, {grad_out, x, weight});
  return TANDEM_KERNEL(device, linear_backward)(grad_out, x, weight, need_input, need_weight, need_bias);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  constexpr const char* op = "matmul";
  TANDEM_CHECK(a.defined() && b.defined(), op, ": operands must be defined");
  TANDEM_CHECK(a.dim() == 2 && b.dim() == 2, op, ": expected two 2-D matrices, got ", a.str(), " and ",
               b.str());
  TANDEM_CHECK(a.size(1) == b.size(0), op, ": inner dimensions differ: ", shape_str(a.shape()), " x ",
               shape_str(b.shape()));
  profiler::Scope prof_scope(op, 2.0 * static_cast<double>(a.size(0)) * static_cast<double>(b.numel()));
  const Device device = common_device(op, {a, b});
  common_float_dtype(op, {a, b});
  return TANDEM_KERNEL(device, matmul)(a, b);
}

namespace {

constexpr int64_t kPeakN = 512;

// Best of five runs of gemm() after one warm-up (page in buffers, spin up the pool) on `threads`
// threads, as GFLOP/s of a kPeakN^3 GEMM. Not recorded: the kernels are called below the dispatcher.
template <typename Gemm>
double best_gemm_gflops(const char* what, int threads, Gemm gemm) {
  TANDEM_CHECK(threads >= 1, what, ": threads must be >= 1, got ", threads);
  const int before = num_threads();
  set_num_threads(threads);
  double best = 1e30;
  try {
    gemm();
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      gemm();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  } catch (...) {
    set_num_threads(before);
    throw;
  }
  set_num_threads(before);
  return 2.0 * kPeakN * kPeakN * kPeakN / best / 1e9;
}

}  // namespace

double measure_gemm_peak_gflops(int threads) {
  const Tensor a = Tensor::full({kPeakN, kPeakN}, 0.5), b = Tensor::full({kPeakN, kPeakN}, 0.25);
  return best_gemm_gflops("measure_gemm_peak_gflops", threads, [&] { cpu::matmul(a, b); });
}

double measure_lowp_gemm_peak_gflops(int threads) {
  const Tensor a = Tensor::full({kPeakN, kPeakN}, 0.5).to(kBFloat16);
  const Tensor b = Tensor::full({kPeakN, kPeakN}, 0.25).to(kBFloat16);
  if (!cpu::lowp_linear_native(a)) return 0.0;
  bool native = true;
  const double g = best_gemm_gflops("measure_lowp_gemm_peak_gflops", threads, [&] {
    Tensor y;
    native = cpu::lowp_linear_forward(a, b, Tensor(), y) && native;
  });
  return native ? g : 0.0;
}

std::string profile_report(Device device, int threads) {
  if (!device.is_cpu()) return profiler::report(0.0);
  bool lowp = false;
  for (const profiler::OpStat& s : profiler::snapshot()) lowp = lowp || profiler::is_lowp_op(s.op);
  return profiler::report(measure_gemm_peak_gflops(threads), lowp ? measure_lowp_gemm_peak_gflops(threads) : 0.0);
}

}  // namespace tandem::kernels
