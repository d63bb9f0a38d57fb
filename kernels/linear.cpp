// Device-neutral linear and matmul entry points: validate ranks, the inner
// dimensions, the bias shape, devices and dtypes, then route to cpu:: or
// cuda::. No math here. Also the GEMM peak the profiler reports against.
#include "kernels/linear.h"

#include <algorithm>
#include <chrono>

#include "core/profiler.h"
#include "core/thread_pool.h"
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

double measure_gemm_peak_gflops(int threads) {
  TANDEM_CHECK(threads >= 1, "measure_gemm_peak_gflops: threads must be >= 1, got ", threads);
  constexpr int64_t n = 512;
  const int before = num_threads();
  set_num_threads(threads);
  // Not recorded: the kernel is called below the instrumented dispatcher.
  Tensor a = Tensor::full({n, n}, 0.5), b = Tensor::full({n, n}, 0.25);
  double best = 1e30;
  try {
    cpu::matmul(a, b);  // warm-up: page in buffers, spin up the pool
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      Tensor c = cpu::matmul(a, b);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  } catch (...) {
    set_num_threads(before);
    throw;
  }
  set_num_threads(before);
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace tandem::kernels
