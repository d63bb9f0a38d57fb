#include "nn/functional.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/activation.h"
#include "kernels/amp.h"
#include "kernels/batch_norm.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv.h"
#include "kernels/conv_bn_pool.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/pointwise.h"
#include "kernels/pool.h"
#include "kernels/reduce.h"
#include "nn/amp.h"

namespace tandem::nn::functional {
namespace {

// Backward nodes. Each saves what its backward kernel needs, detached.

struct Conv2dBackward final : Node {
  Tensor x, w;
  kernels::Conv2dArgs args;
  bool has_bias;
  std::string name() const override { return "Conv2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    // A low-precision gradient: autocast's f32 route (kernels/amp.h), whose output was rounded.
    const bool rounded = g[0].dtype() != x.dtype();
    auto r = (rounded ? kernels::autocast_f32_conv2d_backward : kernels::conv2d_backward)(
        g[0], x, w, args, needs_input_grad(0), needs_input_grad(1), has_bias && needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

// What every batch-norm backward node keeps from its forward (`r`: the kernel's forward result).
struct BatchNormSaved {
  Tensor x, w, b, save_mean, save_invstd;
  bool training = false;
  template <typename Forward>
  void save(const Tensor& input, const Tensor& weight, const Tensor& bias, const Forward& r, bool train) {
    x = input.detach();
    w = weight.defined() ? weight.detach() : Tensor();
    b = bias.defined() ? bias.detach() : Tensor();
    save_mean = r.save_mean;
    save_invstd = r.save_invstd;
    training = train;
  }
};

struct BatchNormBackward final : Node, BatchNormSaved {
  std::string name() const override { return "BatchNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::batch_norm_backward(g[0], x, w, save_mean, save_invstd, training, needs_input_grad(0),
                                          needs_input_grad(1), needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

struct BatchNormReluBackward final : Node, BatchNormSaved {
  std::string name() const override { return "BatchNormReluBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::batch_norm_relu_backward(g[0], x, w, b, save_mean, save_invstd, training,
                                               needs_input_grad(0), needs_input_grad(1), needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

struct BatchNormReluMaxPool2dBackward final : Node, BatchNormSaved {
  kernels::BatchNormReluPool forward;  // the fused kernel's code and winner, or the pooling's indices
  std::string name() const override { return "BatchNormReluMaxPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::batch_norm_relu_pool2d_backward(g[0], x, forward, w, b, training, needs_input_grad(0),
                                                      needs_input_grad(1), needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

// The fused conv + batch norm + relu + max-pool (kernels/conv_bn_pool.h); x gets no gradient. Keeps x
// (the conv output is computed again in the backward, never kept).
struct ConvBatchNormReluMaxPool2dBackward final : Node {
  Tensor x, conv_weight, conv_bias, w, b;
  kernels::BatchNormReluPoolForward forward;
  bool training = false;
  std::string name() const override { return "ConvBatchNormReluMaxPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::conv_batch_norm_relu_max_pool2d_backward(g[0], x, conv_weight, conv_bias, forward, w, b,
                                                               training, needs_input_grad(0), needs_input_grad(1),
                                                               needs_input_grad(2), needs_input_grad(3));
    return {r.conv_weight, r.conv_bias, r.weight, r.bias};
  }
};

struct ReluBackward final : Node {
  Tensor y;
  std::string name() const override { return "ReluBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {kernels::relu_backward(g[0], y)}; }
};

struct MaxPool2dBackward final : Node {
  Tensor indices;
  Shape input_shape;
  std::string name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::max_pool2d_backward(g[0], indices, input_shape)};
  }
};

struct LinearBackward final : Node {
  Tensor x, w;
  bool has_bias;
  std::string name() const override { return "LinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::linear_backward(g[0], x, w, needs_input_grad(0), needs_input_grad(1),
                                      has_bias && needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

struct LogSoftmaxDimBackward final : Node {
  Tensor y;
  int64_t dim = 0;
  std::string name() const override { return "LogSoftmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::softmax_backward(g[0], y, dim, /*log=*/true)};
  }
};

struct ReshapeBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].reshape(input_shape)}; }
};

struct ScaleBackward final : Node {
  double s;
  std::string name() const override { return "ScaleBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::binary(kernels::BinaryOp::Mul, g[0], s)};
  }
};

struct SumBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "SumBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    // The 0-D gradient broadcast on its own device (a stride-0 view copied): never read by the host.
    Tensor out = Tensor::empty(input_shape, g[0].dtype(), g[0].device());
    out.copy_(views::expand(g[0].reshape({}), input_shape));
    return {out};
  }
};

template <typename NodeT>
std::shared_ptr<NodeT> make_node() {
  return std::make_shared<NodeT>();
}

// ---- mixed precision (nn/amp.h) ----

struct LowpConv2dBackward final : Node {
  Tensor x, w;
  kernels::Conv2dArgs args;
  bool has_bias;
  std::string name() const override { return "LowpConv2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::lowp_conv2d_backward(kernels::cast(g[0], w.dtype()), x, w, args, needs_input_grad(0),
                                           needs_input_grad(1), has_bias && needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

struct LowpLinearBackward final : Node {
  Tensor x, w;
  bool has_bias;
  std::string name() const override { return "LowpLinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::lowp_linear_backward(kernels::cast(g[0], x.dtype()), x, w, needs_input_grad(0),
                                           needs_input_grad(1), has_bias && needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

// Records the backward node N of y = op(x, w, b) for conv2d and linear (and their low-precision
// forms): it keeps x, w, whether there is a bias and, for convolutions, the geometry.
template <typename N>
void record_weighted(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                     const kernels::Conv2dArgs& args = {}) {
  if (!autograd::any_requires_grad({x, w, b})) return;
  auto n = make_node<N>();
  n->x = x.detach();
  n->w = w.detach();
  n->has_bias = b.defined();
  if constexpr (requires(N& m) { m.args; }) n->args = args;
  autograd::record(n, {x, w, b}, {&y});
}

// The low-precision dtype conv2d/linear compute in: the autocast dtype for f32 (or already
// low-precision) inputs under an AutocastGuard; the input's own dtype for explicit f16/bf16
// inputs; the weight's for a f32 input and a f16/bf16 weight (FSDP's mixed precision: the ops
// between two layers compute in f32); else kFloat32 (meaning: the ordinary path). f64 is never
// autocast, as in PyTorch.
DType lowp_dtype_for(const Tensor& x, const Tensor& weight) {
  if (amp::autocast_enabled() && (x.dtype() == kFloat32 || kernels::is_low_precision(x.dtype())))
    return amp::precision_dtype(amp::autocast_precision());
  if (kernels::is_low_precision(x.dtype())) return x.dtype();
  if (x.dtype() == kFloat32 && weight.defined() && kernels::is_low_precision(weight.dtype())) return weight.dtype();
  return kFloat32;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding) {
  kernels::Conv2dArgs args{stride, stride, padding, padding};
  if (const DType lp = lowp_dtype_for(x, weight); lp != kFloat32) {
    if (amp::autocast_enabled() && kernels::autocast_conv2d_in_f32(x, weight, args)) {
      // The engine's f32 kernel beats the low-precision one on this shape (kernels/amp.h).
      const Tensor x32 = float32_if_half(x);
      Tensor y = kernels::autocast_f32_conv2d_forward(x32, weight, bias, args, lp);
      record_weighted<Conv2dBackward>(y, x32, weight, bias, args);
      return y;
    }
    // A float32 x goes in as it is: the kernel rounds it to lp inside its input reorder.
    const Tensor xl = x.dtype() == kFloat32 ? x : cast(x, lp), wl = cast(weight, lp), bl = cast(bias, lp);
    Tensor y = kernels::lowp_conv2d_forward(xl, wl, bl, args);
    record_weighted<LowpConv2dBackward>(y, xl, wl, bl, args);
    return y;
  }
  Tensor y = kernels::conv2d_forward(x, weight, bias, args);
  record_weighted<Conv2dBackward>(y, x, weight, bias, args);
  return y;
}

namespace {

// The batch-norm input as the kernels take it: a CPU bfloat16 x as it is when the other operands are
// float32 (or undefined): the CPU kernels read it and give its gradient in bfloat16, with the bits of
// casting it up and the gradient down, without the two passes; else float32_if_half (CUDA, float16).
Tensor batch_norm_input(const Tensor& x, std::initializer_list<Tensor> others) {
  const bool take = x.defined() && x.dtype() == kBFloat16 && x.device().is_cpu() &&
                    std::all_of(others.begin(), others.end(),
                                [](const Tensor& t) { return !t.defined() || t.dtype() == kFloat32; });
  return take ? x : float32_if_half(x);
}

}  // namespace

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  const Tensor x = batch_norm_input(x_in, {running_mean, running_var, weight, bias});
  auto r = kernels::batch_norm_forward(x, weight, bias, running_mean, running_var, training, momentum, eps);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = make_node<BatchNormBackward>();
    n->save(x, weight, bias, r, training);
    autograd::record(n, {x, weight, bias}, {&r.output});
  }
  return r.output;
}

Tensor batch_norm_relu(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  const Tensor x = batch_norm_input(x_in, {running_mean, running_var, weight, bias});
  auto r = kernels::batch_norm_relu_forward(x, weight, bias, running_mean, running_var, training, momentum, eps);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = make_node<BatchNormReluBackward>();
    n->save(x, weight, bias, r, training);
    autograd::record(n, {x, weight, bias}, {&r.output});
  }
  return r.output;
}

Tensor batch_norm_relu_max_pool2d(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                  double eps) {
  const Tensor x = batch_norm_input(x_in, {running_mean, running_var, weight, bias});
  auto r = kernels::batch_norm_relu_pool2d(x, weight, bias, running_mean, running_var, training, momentum, eps);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = make_node<BatchNormReluMaxPool2dBackward>();
    n->save(x, weight, bias, r, training);
    n->forward = r;
    n->forward.output = Tensor();  // not needed by the backward
    autograd::record(n, {x, weight, bias}, {&r.output});
  }
  return r.output;
}

Tensor conv2d_batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         int64_t stride, int64_t padding, const Tensor& running_mean,
                                         const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                                         bool training, double momentum, double eps) {
  const kernels::Conv2dArgs args{stride, stride, padding, padding};
  bool fused = !autograd::any_requires_grad({x}) && lowp_dtype_for(x, conv_weight) == kFloat32 &&
               kernels::conv_batch_norm_relu_pool2d_applies(x, conv_weight, conv_bias, args);
  for (const Tensor& t : {running_mean, running_var, weight, bias}) {
    fused = fused && (!t.defined() || t.dtype() == x.dtype());
  }
  if (!fused) {
    const Tensor h = conv2d(x, conv_weight, conv_bias, stride, padding);
    return batch_norm_relu_max_pool2d(h, running_mean, running_var, weight, bias, training, momentum, eps);
  }
  auto r = kernels::conv_batch_norm_relu_max_pool2d_forward(x, conv_weight, conv_bias, weight, bias, running_mean,
                                                            running_var, training, momentum, eps);
  Tensor y = r.output;
  if (autograd::any_requires_grad({conv_weight, conv_bias, weight, bias})) {
    auto n = make_node<ConvBatchNormReluMaxPool2dBackward>();
    n->x = x.detach();
    n->conv_weight = conv_weight.detach();
    n->conv_bias = conv_bias.defined() ? conv_bias.detach() : Tensor();
    n->w = weight.defined() ? weight.detach() : Tensor();
    n->b = bias.defined() ? bias.detach() : Tensor();
    n->training = training;
    n->forward = r;
    n->forward.output = Tensor();  // not needed by the backward
    autograd::record(n, {conv_weight, conv_bias, weight, bias}, {&y});
  }
  return y;
}

Tensor relu(const Tensor& x_in) {
  const Tensor x = float32_if_half(x_in);
  Tensor y = kernels::relu_forward(x);
  if (autograd::any_requires_grad({x})) {
    auto n = make_node<ReluBackward>();
    n->y = y.detach();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

namespace {

// Values and indices of one max pooling; an unbatched [C, H, W] input gets a batch of 1, removed after.
MaxOutput max_pool(const char* op, const Tensor& x_in, const kernels::MaxPool2dArgs& args) {
  TANDEM_CHECK(x_in.defined() && (x_in.dim() == 3 || x_in.dim() == 4), op,
               ": expected [N, C, H, W] or [C, H, W], got ", x_in.defined() ? x_in.str() : "undefined");
  if (x_in.dim() == 3) {
    MaxOutput r = max_pool(op, unsqueeze(x_in, 0), args);
    const Shape unbatched(r.indices.shape().begin() + 1, r.indices.shape().end());
    return {squeeze(r.values, 0), r.indices.reshape(unbatched)};
  }
  const Tensor x = float32_if_half(x_in);
  auto r = kernels::max_pool2d_forward(x, args);
  if (autograd::any_requires_grad({x})) {
    auto n = make_node<MaxPool2dBackward>();
    n->indices = r.indices;
    n->input_shape = x.shape();
    autograd::record(n, {x}, {&r.output});
  }
  return {r.output, r.indices};
}

}  // namespace

MaxOutput max_pool2d_with_indices(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
                                  bool ceil_mode) {
  if (stride <= 0) stride = kernel;
  kernels::MaxPool2dArgs args{kernel, kernel, stride, stride, padding, padding, dilation, dilation, ceil_mode};
  return max_pool("max_pool2d", x, args);
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode) {
  return max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode).values;
}

MaxOutput adaptive_max_pool2d_with_indices(const Tensor& x, std::array<int64_t, 2> output_size) {
  kernels::MaxPool2dArgs args;
  args.adaptive_h = output_size[0];
  args.adaptive_w = output_size[1];
  TANDEM_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_max_pool2d: output size must be >= 1, got [",
               output_size[0], ", ", output_size[1], "]");
  return max_pool("adaptive_max_pool2d", x, args);
}

Tensor adaptive_max_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  return adaptive_max_pool2d_with_indices(x, output_size).values;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TANDEM_CHECK(x.defined() && x.dim() >= 1, "linear: input must be at least 1-D [..., in], got ",
               x.defined() ? x.str() : "undefined");
  if (x.dim() != 2) {
    TANDEM_CHECK(weight.defined() && weight.dim() == 2, "linear: weight must be 2-D [out, in], got ",
                 weight.defined() ? weight.str() : "undefined");
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    out_shape.push_back(weight.size(0));
    return reshape(linear(reshape(x, {-1, x.shape().back()}), weight, bias), out_shape);
  }
  if (const DType lp = lowp_dtype_for(x, weight); lp != kFloat32) {
    const Tensor xl = cast(x, lp), wl = cast(weight, lp), bl = cast(bias, lp);
    Tensor y = kernels::lowp_linear_forward(xl, wl, bl);
    record_weighted<LowpLinearBackward>(y, xl, wl, bl);
    return y;
  }
  Tensor y = kernels::linear_forward(x, weight, bias);
  record_weighted<LinearBackward>(y, x, weight, bias);
  return y;
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = float32_if_half(x_in);
  TANDEM_CHECK(x.defined(), "log_softmax: operand is undefined");
  Tensor y = kernels::softmax_forward(x, dim, /*log=*/true);
  if (autograd::any_requires_grad({x})) {
    auto n = make_node<LogSoftmaxDimBackward>();
    n->y = y.detach();
    n->dim = views::wrap_dim(dim, x.dim(), "log_softmax");
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = x.reshape(shape);
  if (autograd::any_requires_grad({x})) {
    y = y.is_same(x) ? x.detach() : y;  // a fresh handle to carry the history
    auto n = make_node<ReshapeBackward>();
    n->input_shape = x.shape();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor flatten(const Tensor& x, int64_t start_dim) {
  const int64_t s = start_dim < 0 ? start_dim + x.dim() : start_dim;
  TANDEM_CHECK(s >= 0 && s < std::max<int64_t>(x.dim(), 1), "flatten: start_dim ", start_dim,
               " out of range for ", x.str());
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  shape.push_back(-1);
  return reshape(x, shape);
}

Tensor scale(const Tensor& a, double s) {
  Tensor y = kernels::binary(kernels::BinaryOp::Mul, a, s);
  if (autograd::any_requires_grad({a})) {
    auto n = make_node<ScaleBackward>();
    n->s = s;
    autograd::record(n, {a}, {&y});
  }
  return y;
}

Tensor sum(const Tensor& a) {
  Tensor y = kernels::sum_dims(a, {}, false);
  if (autograd::any_requires_grad({a})) {
    auto n = make_node<SumBackward>();
    n->input_shape = a.shape();
    autograd::record(n, {a}, {&y});
  }
  return y;
}

}  // namespace tandem::nn::functional
