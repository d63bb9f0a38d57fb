// Device-neutral batch_norm entry points (kernels/batch_norm.h, and the fused
// batch_norm + relu + 2x2 max-pool of kernels/batch_norm_pool.h): validate the
// input rank, the [C] shapes of weight/bias/running stats/saved stats, the
// running stats' contiguity (they are updated in place), the pooled shapes and
// the uint8 code of the fused op, devices and dtypes, then call the kernel of the
// operands' backend (kernels/ops.h). The fused batch_norm + relu is a CPU kernel: on a backend
// without it the entry points run batch_norm and relu's kernels one after the other (the backward
// recomputes the batch_norm output from the saved statistics for relu's mask). The fused
// batch_norm + relu + max-pool is CPU only. On the CPU x may be bfloat16 with every other operand
// float32 (the kernels widen it as they read it; outputs float32, the input gradient bfloat16).
#include "kernels/batch_norm.h"

#include "core/profiler.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv_bn_pool.h"
#include "kernels/cpu/conv_c1.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"
#include "kernels/pointwise.h"
#include "kernels/pool.h"

namespace tandem::kernels {
namespace {

void check_channel_vector(const char* op, const char* what, const Tensor& t, int64_t C) {
  if (!t.defined()) return;
  TANDEM_CHECK(t.dim() == 1 && t.size(0) == C, op, ": expected ", what, " of shape [", C,
               "] (one value per channel), got ", t.str());
}

void check_input(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.defined(), op, ": input is undefined");
  TANDEM_CHECK(x.dim() >= 2, op, ": expected input [N, C, ...] with at least 2 dimensions, got ", x.str());
}

// The fused batch_norm + relu + 2x2 max-pool's input: 4-D with a whole pooling window.
void check_pool_input(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.defined() && x.dim() == 4, op, ": expected input [N, C, H, W], got ",
               x.defined() ? x.str() : "undefined tensor");
  TANDEM_CHECK(x.size(2) >= 2 && x.size(3) >= 2, op,
               ": the 2x2 pooling window needs H >= 2 and W >= 2, got input ", shape_str(x.shape()));
}

// v [C] viewed as [1, C, 1, ...] against x [N, C, ...].
Tensor per_channel(const Tensor& v, const Tensor& x) {
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[1] = x.size(1);
  return v.reshape(s);
}

// The backward of relu(batch_norm(x)) from the plain kernels, for a backend without the fused one:
// the batch_norm output recomputed from the saved statistics, the gradient kept where it is > 0
// (relu_backward), then batch_norm's backward.
BatchNormGrads composed_batch_norm_relu_backward(Device device, const Tensor& grad_out, const Tensor& x,
                                                 const Tensor& weight, const Tensor& bias, const Tensor& save_mean,
                                                 const Tensor& save_invstd, bool training, bool need_input,
                                                 bool need_weight, bool need_bias) {
  Tensor y = binary(BinaryOp::Mul, binary(BinaryOp::Sub, x, per_channel(save_mean, x)), per_channel(save_invstd, x));
  if (weight.defined()) y = binary(BinaryOp::Mul, y, per_channel(weight, x));
  if (bias.defined()) y = binary(BinaryOp::Add, y, per_channel(bias, x));
  const Tensor grad = TANDEM_KERNEL(device, relu_backward)(grad_out, TANDEM_KERNEL(device, relu_forward)(y));
  return TANDEM_KERNEL(device, batch_norm_backward)(grad, x, weight, save_mean, save_invstd, training, need_input,
                                                    need_weight, need_bias);
}

Shape pooled_shape(const Tensor& x) { return {x.size(0), x.size(1), x.size(2) / 2, x.size(3) / 2}; }

// Whether the CPU kernels take x in bfloat16 here: on the CPU, with the defined operands of `rest`
// float32 (checked: else an error naming the operand). False for any other x, whose operands then
// share one float dtype (common_float_dtype at the call).
bool cpu_bf16_input(const char* op, const Device& device, const Tensor& x, std::initializer_list<Tensor> rest) {
  if (x.dtype() != kBFloat16 || !device.is_cpu()) return false;
  for (const Tensor& t : rest) {
    TANDEM_CHECK(!t.defined() || t.dtype() == kFloat32, op,
                 ": with a bfloat16 input the other operands must be float32, got ", t.str());
  }
  return true;
}

void check_cpu_only(const char* op, const Device& device) {
  TANDEM_CHECK(!device.is_cuda(), op,
               ": CPU only; on CUDA use batch_norm_forward, relu_forward and max_pool2d_forward");
}

// Checks the forward's arguments; returns the device to run on. bn_input: the shape the batch norm
// normalises when it is not x's (the fused conv's output).
Device check_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Tensor& running_mean, const Tensor& running_var, bool training, double eps,
                     const Shape* bn_input = nullptr) {
  check_input(op, x);
  const Shape shape = bn_input ? *bn_input : x.shape();
  const int64_t C = shape[1], numel = shape_numel(shape);
  check_channel_vector(op, "weight", weight, C);
  check_channel_vector(op, "bias", bias, C);
  check_channel_vector(op, "running_mean", running_mean, C);
  check_channel_vector(op, "running_var", running_var, C);
  TANDEM_CHECK(running_mean.defined() == running_var.defined(), op,
               ": running_mean and running_var must be both defined or both undefined");
  TANDEM_CHECK(eps > 0, op, ": eps must be positive, got ", eps);
  if (running_mean.defined()) {
    TANDEM_CHECK(running_mean.is_contiguous() && running_var.is_contiguous(), op,
                 ": running_mean and running_var must be contiguous (they are updated in place)");
  }
  if (training) {
    TANDEM_CHECK(C == 0 || numel / C > 1, op,
                 ": expected more than 1 value per channel when training, got input ", shape_str(shape));
  } else {
    TANDEM_CHECK(running_mean.defined(), op,
                 ": eval mode (training=false) needs running_mean and running_var; got undefined ones");
  }
  const Device device = common_device(op, {x, weight, bias, running_mean, running_var});
  if (!cpu_bf16_input(op, device, x, {weight, bias, running_mean, running_var})) {
    common_float_dtype(op, {x, weight, bias, running_mean, running_var});
  }
  return device;
}

// Checks the backward's arguments; returns the device to run on.
Device check_backward(const char* op, const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                      const Tensor& save_mean, const Tensor& save_invstd) {
  check_input(op, x);
  const int64_t C = x.size(1);
  TANDEM_CHECK(grad_out.defined() && grad_out.shape() == x.shape(), op, ": expected grad_out ",
               shape_str(x.shape()), " like the input, got ",
               grad_out.defined() ? grad_out.str() : "undefined tensor");
  TANDEM_CHECK(save_mean.defined() && save_invstd.defined(), op,
               ": save_mean and save_invstd (from the forward) must be defined");
  check_channel_vector(op, "weight", weight, C);
  check_channel_vector(op, "save_mean", save_mean, C);
  check_channel_vector(op, "save_invstd", save_invstd, C);
  const Device device = common_device(op, {grad_out, x, weight, save_mean, save_invstd});
  if (!cpu_bf16_input(op, device, x, {grad_out, weight, save_mean, save_invstd})) {
    common_float_dtype(op, {grad_out, x, weight, save_mean, save_invstd});
  }
  return device;
}

}  // namespace

BatchNormForward batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps) {
  constexpr const char* op = "batch_norm_forward";
  profiler::Scope prof_scope(op);
  const Device device = check_forward(op, x, weight, bias, running_mean, running_var, training, eps);
  return TANDEM_KERNEL(device, batch_norm_forward)(x, weight, bias, running_mean, running_var, training, momentum, eps);
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd, bool training,
                                   bool need_input, bool need_weight, bool need_bias) {
  constexpr const char* op = "batch_norm_backward";
  profiler::Scope prof_scope(op);
  const Device device = check_backward(op, grad_out, x, weight, save_mean, save_invstd);
  return TANDEM_KERNEL(device, batch_norm_backward)(grad_out, x, weight, save_mean, save_invstd, training, need_input,
                                                    need_weight, need_bias);
}

BatchNormForward batch_norm_relu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& running_mean, const Tensor& running_var, bool training,
                                         double momentum, double eps) {
  constexpr const char* op = "batch_norm_relu_forward";
  profiler::Scope prof_scope(op);
  const Device device = check_forward(op, x, weight, bias, running_mean, running_var, training, eps);
  if (backend_for(device, op).batch_norm_relu_forward == nullptr) {  // no fused kernel: the plain ones
    BatchNormForward r =
        TANDEM_KERNEL(device, batch_norm_forward)(x, weight, bias, running_mean, running_var, training, momentum, eps);
    r.output = TANDEM_KERNEL(device, relu_forward)(r.output);
    return r;
  }
  return TANDEM_KERNEL(device, batch_norm_relu_forward)(x, weight, bias, running_mean, running_var, training, momentum,
                                                        eps);
}

BatchNormGrads batch_norm_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                        const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd,
                                        bool training, bool need_input, bool need_weight, bool need_bias) {
  constexpr const char* op = "batch_norm_relu_backward";
  profiler::Scope prof_scope(op);
  const Device device = check_backward(op, grad_out, x, weight, save_mean, save_invstd);
  check_channel_vector(op, "bias", bias, x.size(1));
  if (bias.defined()) common_device(op, {x, bias});
  if (bias.defined() && !cpu_bf16_input(op, device, x, {bias})) common_float_dtype(op, {x, bias});
  if (backend_for(device, op).batch_norm_relu_backward == nullptr) {
    return composed_batch_norm_relu_backward(device, grad_out, x, weight, bias, save_mean, save_invstd, training,
                                             need_input, need_weight, need_bias);
  }
  return TANDEM_KERNEL(device, batch_norm_relu_backward)(grad_out, x, weight, bias, save_mean, save_invstd, training,
                                                         need_input, need_weight, need_bias);
}

BatchNormReluPoolForward batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& weight,
                                                            const Tensor& bias, const Tensor& running_mean,
                                                            const Tensor& running_var, bool training,
                                                            double momentum, double eps) {
  constexpr const char* op = "batch_norm_relu_max_pool2d_forward";
  profiler::Scope prof_scope(op);
  check_pool_input(op, x);
  const Device device = check_forward(op, x, weight, bias, running_mean, running_var, training, eps);
  check_cpu_only(op, device);
  return TANDEM_KERNEL(device, batch_norm_relu_max_pool2d_forward)(x, weight, bias, running_mean, running_var, training,
                                                                   momentum, eps);
}

BatchNormGrads batch_norm_relu_max_pool2d_backward(const Tensor& grad_out, const Tensor& x,
                                                   const Tensor& code, const Tensor& winner,
                                                   const Tensor& weight, const Tensor& bias,
                                                   const Tensor& save_mean, const Tensor& save_invstd,
                                                   bool training, bool need_input, bool need_weight,
                                                   bool need_bias) {
  constexpr const char* op = "batch_norm_relu_max_pool2d_backward";
  profiler::Scope prof_scope(op);
  check_pool_input(op, x);
  const int64_t C = x.size(1);
  const Shape pooled = pooled_shape(x);
  TANDEM_CHECK(grad_out.defined() && grad_out.shape() == pooled, op, ": expected grad_out ",
               shape_str(pooled), " (the pooled shape of input ", shape_str(x.shape()), "), got ",
               grad_out.defined() ? grad_out.str() : "undefined tensor");
  TANDEM_CHECK(code.defined() && code.shape() == pooled && code.dtype() == kUInt8, op,
               ": expected code (from the forward) as uint8 ", shape_str(pooled), ", got ",
               code.defined() ? code.str() : "undefined tensor");
  TANDEM_CHECK(winner.defined() && winner.shape() == pooled, op, ": expected winner (from the forward) ",
               shape_str(pooled), ", got ", winner.defined() ? winner.str() : "undefined tensor");
  TANDEM_CHECK(save_mean.defined() && save_invstd.defined(), op,
               ": save_mean and save_invstd (from the forward) must be defined");
  check_channel_vector(op, "weight", weight, C);
  check_channel_vector(op, "bias", bias, C);
  check_channel_vector(op, "save_mean", save_mean, C);
  check_channel_vector(op, "save_invstd", save_invstd, C);
  const Device device = common_device(op, {grad_out, x, code, winner, weight, bias, save_mean, save_invstd});
  if (!cpu_bf16_input(op, device, x, {grad_out, winner, weight, bias, save_mean, save_invstd})) {
    common_float_dtype(op, {grad_out, x, winner, weight, bias, save_mean, save_invstd});
  }
  check_cpu_only(op, device);
  return TANDEM_KERNEL(device, batch_norm_relu_max_pool2d_backward)(
      grad_out, x, code, winner, weight, bias, save_mean, save_invstd, training, need_input, need_weight, need_bias);
}

BatchNormReluPool batch_norm_relu_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& running_mean, const Tensor& running_var, bool training,
                                         double momentum, double eps) {
  const bool fused = x.defined() && x.dim() == 4 && x.size(2) >= 2 && x.size(3) >= 2 &&
                     (x.dtype() == kFloat32 || (x.dtype() == kBFloat16 && x.device().is_cpu())) &&
                     backend_for(x.device(), "batch_norm_relu_pool2d").batch_norm_relu_max_pool2d_forward != nullptr;
  if (fused) {
    auto r = batch_norm_relu_max_pool2d_forward(x, weight, bias, running_mean, running_var, training, momentum, eps);
    return {r.output, r.save_mean, r.save_invstd, r.code, r.winner, Tensor()};
  }
  auto r = batch_norm_relu_forward(x, weight, bias, running_mean, running_var, training, momentum, eps);
  auto p = max_pool2d_forward(r.output, MaxPool2dArgs{});
  return {p.output, r.save_mean, r.save_invstd, Tensor(), Tensor(), p.indices};
}

BatchNormGrads batch_norm_relu_pool2d_backward(const Tensor& grad_out, const Tensor& x, const BatchNormReluPool& f,
                                               const Tensor& weight, const Tensor& bias, bool training, bool need_input,
                                               bool need_weight, bool need_bias) {
  if (f.code.defined()) {
    return batch_norm_relu_max_pool2d_backward(grad_out, x, f.code, f.winner, weight, bias, f.save_mean, f.save_invstd,
                                               training, need_input, need_weight, need_bias);
  }
  const Tensor grad = max_pool2d_backward(grad_out, f.indices, x.shape());
  return batch_norm_relu_backward(grad, x, weight, bias, f.save_mean, f.save_invstd, training, need_input, need_weight,
                                  need_bias);
}

namespace {

// The fused conv's own operands: x [N, 1, H, W] (H, W >= 4), conv_weight [K, 1, 3, 3], conv_bias [K];
// returns the conv output's shape.
Shape check_conv_operands(const char* op, const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias) {
  TANDEM_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 1 && x.size(2) >= 4 && x.size(3) >= 4, op,
               ": expected input [N, 1, H, W] with H, W >= 4 (one channel; a 2x2-poolable 3x3 conv output), got ",
               x.defined() ? x.str() : "undefined tensor");
  TANDEM_CHECK(conv_weight.defined() && conv_weight.dim() == 4 && conv_weight.size(1) == 1 &&
                   conv_weight.size(2) == 3 && conv_weight.size(3) == 3,
               op, ": expected conv_weight [K, 1, 3, 3], got ",
               conv_weight.defined() ? conv_weight.str() : "undefined tensor");
  const int64_t K = conv_weight.size(0);
  check_channel_vector(op, "conv_bias", conv_bias, K);
  return {x.size(0), K, x.size(2) - 2, x.size(3) - 2};
}

}  // namespace

BatchNormReluPoolForward conv_batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& conv_weight,
                                                                 const Tensor& conv_bias, const Tensor& weight,
                                                                 const Tensor& bias, const Tensor& running_mean,
                                                                 const Tensor& running_var, bool training,
                                                                 double momentum, double eps) {
  constexpr const char* op = "conv_batch_norm_relu_max_pool2d_forward";
  const Shape y = check_conv_operands(op, x, conv_weight, conv_bias);
  profiler::Scope prof_scope(op, conv_gemm_flops(y, conv_weight, 1));
  const Device device = check_forward(op, x, weight, bias, running_mean, running_var, training, eps, &y);
  common_device(op, {x, conv_weight, conv_bias, weight, bias, running_mean, running_var});
  common_float_dtype(op, {x, conv_weight, conv_bias, weight, bias, running_mean, running_var});
  TANDEM_CHECK(device.is_cpu(), op, ": CPU only; elsewhere use conv2d_forward and batch_norm_relu_pool2d");
  return TANDEM_KERNEL(device, conv_batch_norm_relu_max_pool2d_forward)(x, conv_weight, conv_bias, weight, bias,
                                                                       running_mean, running_var, training, momentum,
                                                                       eps);
}

ConvBatchNormReluPoolGrads conv_batch_norm_relu_max_pool2d_backward(
    const Tensor& grad_out, const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
    const BatchNormReluPoolForward& forward, const Tensor& weight, const Tensor& bias, bool training,
    bool need_conv_weight, bool need_conv_bias, bool need_weight, bool need_bias) {
  constexpr const char* op = "conv_batch_norm_relu_max_pool2d_backward";
  const Shape y = check_conv_operands(op, x, conv_weight, conv_bias);
  // The conv runs again in the backward: counted with the weight gradient.
  profiler::Scope prof_scope(op, conv_gemm_flops(y, conv_weight, 1 + int(need_conv_weight)));
  const BatchNormReluPoolForward& p = forward;
  const Shape pooled{y[0], y[1], y[2] / 2, y[3] / 2};
  TANDEM_CHECK(grad_out.defined() && grad_out.shape() == pooled, op, ": expected grad_out ", shape_str(pooled),
               ", got ", grad_out.defined() ? grad_out.str() : "undefined tensor");
  TANDEM_CHECK(p.code.defined() && p.code.shape() == pooled && p.code.dtype() == kUInt8 && p.winner.defined() &&
                   p.winner.shape() == pooled && p.save_mean.defined() && p.save_invstd.defined(),
               op, ": expected the forward's code (uint8) and winner ", shape_str(pooled),
               " and its saved statistics; got code ", p.code.defined() ? p.code.str() : "undefined",
               ", winner ", p.winner.defined() ? p.winner.str() : "undefined");
  for (const auto& [what, t] : {std::pair{"weight", weight}, {"bias", bias}, {"save_mean", p.save_mean},
                                {"save_invstd", p.save_invstd}}) {
    check_channel_vector(op, what, t, y[1]);
  }
  const Device device = common_device(op, {grad_out, x, conv_weight, conv_bias, p.winner, weight, bias, p.save_mean});
  common_float_dtype(op, {grad_out, x, conv_weight, conv_bias, p.winner, weight, bias, p.save_mean, p.save_invstd});
  TANDEM_CHECK(device.is_cpu(), op, ": CPU only; elsewhere use the backwards of conv2d and batch_norm_relu_pool2d");
  return TANDEM_KERNEL(device, conv_batch_norm_relu_max_pool2d_backward)(grad_out, x, conv_weight, conv_bias, forward,
                                                                        weight, bias, training, need_conv_weight,
                                                                        need_conv_bias, need_weight, need_bias);
}

bool conv_batch_norm_relu_pool2d_applies(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         const Conv2dArgs& args) {
  const bool plain = args.stride_h == 1 && args.stride_w == 1 && args.pad_h == 0 && args.pad_w == 0 &&
                     args.dilation_h == 1 && args.dilation_w == 1 && args.groups == 1;
  return plain && x.defined() && x.device().is_cpu() && x.dim() == 4 && x.size(1) == 1 && x.size(2) >= 4 &&
         x.size(3) >= 4 && conv_weight.defined() && conv_weight.dim() == 4 && conv_weight.size(1) == 1 &&
         conv_weight.size(2) == 3 && conv_weight.size(3) == 3 && x.dtype() == kFloat32 &&
         conv_weight.dtype() == kFloat32 && (!conv_bias.defined() || conv_bias.dtype() == kFloat32) &&
         cpu::detail::conv_c1_supported(1, 3, 3, 1, 1, 0, 0) &&
         backend_for(x.device(), "conv_batch_norm_relu_pool2d").conv_batch_norm_relu_max_pool2d_forward != nullptr;
}

}  // namespace tandem::kernels
