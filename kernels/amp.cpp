// Device-neutral mixed-precision entry points (see kernels/amp.h). Validates dtypes and devices,
// then calls the table's kernels (kernels/ops.h): CUDA runs the half paths of the conv2d and linear
// kernels (kernels/cuda/{conv,linear}.cu take f16/bf16 operands directly) and the unscale kernel of
// kernels/cuda/amp.cu; CPU runs bf16 on oneDNN with the operands as they are (kernels/cpu/lowp.cpp)
// where the CPU has bf16 instructions, and elsewhere (and for f16) emulates low-precision
// conv/linear with the f32 kernels on widened operands and rounds the results. The f32 entry points
// of kernels/{conv,linear}.cpp are not used for low-precision tensors (their dtype check admits
// f32/f64 only). Profiling (core/profiler.h): casts are recorded as "cast"; the native
// low-precision GEMMs (CUDA, CPU oneDNN) as "lowp_*" with their FLOPs; the CPU emulation's GEMMs are
// recorded by the f32 entry points it calls (conv2d_forward, ...).
#include "kernels/amp.h"

#include "core/profiler.h"
#include "kernels/cpu/conv3x3.h"
#include "kernels/cpu/conv_c1.h"
#include "kernels/cpu/conv_strided.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

#include <cstdio>
#include <mutex>

namespace tandem::kernels {
namespace {

DType common_lowp_dtype(const char* op, std::initializer_list<Tensor> tensors) {
  const DType d = common_dtype(op, tensors);
  TANDEM_CHECK(is_low_precision(d), op, ": expected float16 or bfloat16 operands, got ", dtype_name(d));
  return d;
}

// The conv's FLOPs as the profiler counts them (kernels/dispatch.h), from the input's shape.
double conv_flops(const Tensor& x, const Tensor& w, const Conv2dArgs& a, int gemms) {
  if (x.dim() != 4 || w.dim() != 4 || a.stride_h < 1 || a.stride_w < 1) return 0.0;
  const int64_t p = (x.size(2) + 2 * a.pad_h - w.size(2)) / a.stride_h + 1;
  const int64_t q = (x.size(3) + 2 * a.pad_w - w.size(3)) / a.stride_w + 1;
  return conv_gemm_flops({x.size(0), w.size(0), p, q}, w, gemms);
}
// The linear's FLOPs as the profiler counts them: gemms products of [N, in] with [out, in].
double linear_flops(const Tensor& x, const Tensor& w, int gemms) {
  return 2.0 * gemms * static_cast<double>(x.size(0)) * static_cast<double>(w.numel());
}
// Records a CPU call that widens (kernels/cpu/dnnl.h's fallback path); for bf16 on a CPU without
// bf16 instructions, says so once per process on stderr (one line).
void cpu_fallback(cpu::GemmKernel kernel, DType d) {
  cpu::detail::count_gemm_path(kernel, cpu::GemmPath::fallback);
  if (d != kBFloat16 || cpu::lowp_gemm_path(d) != cpu::GemmPath::fallback) return;
  static std::once_flag once;
  std::call_once(once, [] {
    if (!cpu::onednn_built()) {
      std::fprintf(stderr, "tandem: this build has no oneDNN (TANDEM_ONEDNN=OFF): bf16 conv2d/linear on the CPU run "
                           "as f32 math on widened operands, slower than float32\n");
    } else {
      std::fprintf(stderr,
                   "tandem: this CPU offers oneDNN no bf16 instructions (ISA %s; AVX512_BF16 or AMX needed): bf16 "
                   "conv2d/linear run as f32 math on widened operands, slower than float32\n",
                   cpu::onednn_isa());
    }
  });
}

Tensor widen(const Tensor& t) { return t.defined() ? cast(t, kFloat32) : Tensor(); }
Tensor narrow_to(const Tensor& t, DType d) { return t.defined() ? cast(t, d) : Tensor(); }

}  // namespace

bool is_low_precision(DType t) { return t == kFloat16 || t == kBFloat16; }

bool cpu_bf16_pays() { return cpu::lowp_gemm_path(kBFloat16) != cpu::GemmPath::fallback; }

Tensor cast(const Tensor& x, DType to) {
  TANDEM_CHECK(x.defined(), "cast: undefined tensor");
  if (x.dtype() == to) return x;
  profiler::Scope prof_scope("cast");
  return TANDEM_KERNEL(x.device(), cast)(x, to);
}

// The compute dtype of a low-precision conv: the weight's (and bias's, and grad_out's) dtype; x may
// also be float32 (rounded to that dtype as part of the op).
DType conv_compute_dtype(const char* op, const Tensor& x, std::initializer_list<Tensor> lowp) {
  const DType d = common_lowp_dtype(op, lowp);
  TANDEM_CHECK(x.defined() && (x.dtype() == d || x.dtype() == kFloat32), op, ": expected the input in ",
               dtype_name(d), " (the weight's dtype) or float32, got ", x.defined() ? dtype_name(x.dtype()) : "none");
  return d;
}

Tensor lowp_conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  constexpr const char* op = "lowp_conv2d_forward";
  const Device device = common_device(op, {x, weight, bias});
  const DType d = conv_compute_dtype(op, x, {weight, bias});
  if (device.is_cuda()) {
    profiler::Scope prof_scope(op, conv_flops(x, weight, args, 1));
    return kernel_for<&Backend::conv2d_forward>(device, op)(cast(x, d), weight, bias, args);
  }
  if (cpu::lowp_conv2d_native(x, d)) {
    profiler::Scope prof_scope(op, conv_flops(x, weight, args, 1));
    Tensor y;
    if (cpu::lowp_conv2d_forward(x, weight, bias, args, y)) return y;
  } else {
    cpu_fallback(cpu::GemmKernel::lowp_conv2d, d);
  }
  return cast(conv2d_forward(widen(cast(x, d)), widen(weight), widen(bias), args), d);
}

Conv2dGrads lowp_conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                 const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias) {
  constexpr const char* op = "lowp_conv2d_backward";
  const Device device = common_device(op, {grad_out, x, weight});
  const DType d = conv_compute_dtype(op, x, {grad_out, weight});
  if (device.is_cuda()) {
    profiler::Scope prof_scope(op, conv_flops(x, weight, args, int(need_input) + int(need_weight)));
    Conv2dGrads g = kernel_for<&Backend::conv2d_backward>(device, op)(grad_out, cast(x, d), weight, args, need_input,
                                                                      need_weight, need_bias);
    if (g.input.defined()) g.input = cast(g.input, x.dtype());
    return g;
  }
  if (cpu::lowp_conv2d_native(x, d)) {
    profiler::Scope prof_scope(op, conv_flops(x, weight, args, int(need_input) + int(need_weight)));
    Conv2dGrads g;
    if (cpu::lowp_conv2d_backward(grad_out, x, weight, args, need_input, need_weight, need_bias, g)) return g;
  } else {
    cpu_fallback(cpu::GemmKernel::lowp_conv2d, d);
  }
  Conv2dGrads g =
      conv2d_backward(widen(grad_out), widen(cast(x, d)), widen(weight), args, need_input, need_weight, need_bias);
  // The input gradient in x's dtype: rounded to d, then (for a float32 x) widened exactly.
  const Tensor gx = g.input.defined() ? cast(narrow_to(g.input, d), x.dtype()) : Tensor();
  return {gx, narrow_to(g.weight, d), narrow_to(g.bias, d)};
}

Tensor autocast_f32_conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args,
                                   DType out) {
  if (out == kBFloat16 && cpu::conv2d_c1_bf16_applies(x, weight, bias, args)) {
    profiler::Scope prof_scope("conv2d_forward", conv_flops(x, weight, args, 1));
    return cpu::conv2d_c1_forward_bf16(x, weight, bias, args);
  }
  return cast(conv2d_forward(x, weight, bias, args), out);
}

Conv2dGrads autocast_f32_conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                         const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias) {
  if (!need_input && cpu::conv2d_c1_bf16_backward_applies(grad_out, x, weight, args)) {
    profiler::Scope prof_scope("conv2d_backward", conv_flops(x, weight, args, int(need_weight)));
    return cpu::conv2d_c1_backward_bf16(grad_out, x, weight, args, need_weight, need_bias);
  }
  return conv2d_backward(cast(grad_out, x.dtype()), x, weight, args, need_input, need_weight, need_bias);
}

bool autocast_conv2d_in_f32(const Tensor& x, const Tensor& weight, const Conv2dArgs& a) {
  if (!x.device().is_cpu() || x.dim() != 4 || weight.dim() != 4 || weight.dtype() != kFloat32) return false;
  const int64_t C = x.size(1), K = weight.size(0);
  if (C == 1) return true;
  const int64_t R = weight.size(2), S = weight.size(3);
  if (cpu::detail::conv_strided_projection(C, K, R, S, a.stride_h, a.stride_w, a.pad_h, a.pad_w)) return true;
  return (C < 16 || K < 16) && cpu::detail::conv3x3_supported(C, K, R, S, a.stride_h, a.stride_w, a.pad_h, a.pad_w);
}

Tensor lowp_linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "lowp_linear_forward";
  const Device device = common_device(op, {x, weight, bias});
  const DType d = common_lowp_dtype(op, {x, weight, bias});
  if (device.is_cuda()) {
    profiler::Scope prof_scope(op, linear_flops(x, weight, 1));
    return kernel_for<&Backend::linear_forward>(device, op)(x, weight, bias);
  }
  if (cpu::lowp_linear_native(x)) {
    profiler::Scope prof_scope(op, linear_flops(x, weight, 1));
    Tensor y;
    if (cpu::lowp_linear_forward(x, weight, bias, y)) return y;
  } else {
    cpu_fallback(cpu::GemmKernel::lowp_linear, d);
  }
  return cast(linear_forward(widen(x), widen(weight), widen(bias)), d);
}

LinearGrads lowp_linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input,
                                 bool need_weight, bool need_bias) {
  constexpr const char* op = "lowp_linear_backward";
  const Device device = common_device(op, {grad_out, x, weight});
  const DType d = common_lowp_dtype(op, {grad_out, x, weight});
  if (device.is_cuda()) {
    profiler::Scope prof_scope(op, linear_flops(x, weight, int(need_input) + int(need_weight)));
    return kernel_for<&Backend::linear_backward>(device, op)(grad_out, x, weight, need_input, need_weight,
                                                             need_bias);
  }
  if (cpu::lowp_linear_native(x)) {
    profiler::Scope prof_scope(op, linear_flops(x, weight, int(need_input) + int(need_weight)));
    LinearGrads g;
    if (cpu::lowp_linear_backward(grad_out, x, weight, need_input, need_weight, need_bias, g)) return g;
  } else {
    cpu_fallback(cpu::GemmKernel::lowp_linear, d);
  }
  LinearGrads g = linear_backward(widen(grad_out), widen(x), widen(weight), need_input, need_weight, need_bias);
  return {narrow_to(g.input, d), narrow_to(g.weight, d), narrow_to(g.bias, d)};
}

void unscale_and_check_(const Tensor& grad, const Tensor& found_inf, double inv_scale) {
  constexpr const char* op = "unscale_and_check_";
  TANDEM_CHECK(grad.defined() && found_inf.defined(), op, ": grad and found_inf must be defined");
  const Device device = common_device(op, {grad, found_inf});
  TANDEM_KERNEL(device, unscale_and_check_)(grad, found_inf, inv_scale);
}

}  // namespace tandem::kernels
