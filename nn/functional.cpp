#include "nn/functional.h"

#include "core/autograd.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/pool.h"

namespace tandem::nn::functional {
namespace {

// Backward nodes. Each saves what its backward kernel needs, detached.

struct Conv2dBackward final : Node {
  Tensor x, w;
  kernels::Conv2dArgs args;
  bool has_bias;
  std::string name() const override { return "Conv2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::conv2d_backward(g[0], x, w, args, needs_input_grad(0), needs_input_grad(1),
                                      has_bias && needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

struct BatchNormBackward final : Node {
  Tensor x, w, save_mean, save_invstd;
  bool training;
  std::string name() const override { return "BatchNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::batch_norm_backward(g[0], x, w, save_mean, save_invstd, training, needs_input_grad(0),
                                          needs_input_grad(1), needs_input_grad(2));
    return {r.input, r.weight, r.bias};
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

struct LogSoftmaxBackward final : Node {
  Tensor y;
  std::string name() const override { return "LogSoftmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::log_softmax_backward(g[0], y)};
  }
};

struct NllLossBackward final : Node {
  Tensor log_probs, target;
  std::string name() const override { return "NllLossBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::nll_loss_backward(g[0], log_probs, target)};
  }
};

struct ReshapeBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].reshape(input_shape)}; }
};

struct AddBackward final : Node {
  double sign_b = 1.0;
  std::string name() const override { return sign_b > 0 ? "AddBackward" : "SubBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gb;
    if (needs_input_grad(1)) gb = sign_b > 0 ? g[0] : kernels::scale(g[0], -1.0);
    return {g[0], gb};
  }
};

struct MulBackward final : Node {
  Tensor a, b;
  std::string name() const override { return "MulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = kernels::mul(g[0], b);
    if (needs_input_grad(1)) gb = kernels::mul(g[0], a);
    return {ga, gb};
  }
};

struct ScaleBackward final : Node {
  double s;
  std::string name() const override { return "ScaleBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {kernels::scale(g[0], s)}; }
};

struct SumBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "SumBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor out = Tensor::empty(input_shape, g[0].dtype(), g[0].device());
    out.fill_(g[0].to(Device::cpu()).to(kFloat64).item<double>());
    return {out};
  }
};

struct MatmulBackward final : Node {
  Tensor a, b;
  std::string name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = kernels::matmul(g[0], b.transpose(0, 1));
    if (needs_input_grad(1)) gb = kernels::matmul(a.transpose(0, 1), g[0]);
    return {ga, gb};
  }
};

template <typename NodeT>
std::shared_ptr<NodeT> make_node() {
  return std::make_shared<NodeT>();
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding) {
  kernels::Conv2dArgs args{stride, stride, padding, padding};
  Tensor y = kernels::conv2d_forward(x, weight, bias, args);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = make_node<Conv2dBackward>();
    n->x = x.detach();
    n->w = weight.detach();
    n->args = args;
    n->has_bias = bias.defined();
    autograd::record(n, {x, weight, bias}, {&y});
  }
  return y;
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  auto r = kernels::batch_norm_forward(x, weight, bias, running_mean, running_var, training, momentum, eps);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = make_node<BatchNormBackward>();
    n->x = x.detach();
    n->w = weight.defined() ? weight.detach() : Tensor();
    n->save_mean = r.save_mean;
    n->save_invstd = r.save_invstd;
    n->training = training;
    autograd::record(n, {x, weight, bias}, {&r.output});
  }
  return r.output;
}

Tensor relu(const Tensor& x) {
  Tensor y = kernels::relu_forward(x);
  if (autograd::any_requires_grad({x})) {
    auto n = make_node<ReluBackward>();
    n->y = y.detach();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  if (stride <= 0) stride = kernel;
  kernels::MaxPool2dArgs args{kernel, kernel, stride, stride, padding, padding};
  auto r = kernels::max_pool2d_forward(x, args);
  if (autograd::any_requires_grad({x})) {
    auto n = make_node<MaxPool2dBackward>();
    n->indices = r.indices;
    n->input_shape = x.shape();
    autograd::record(n, {x}, {&r.output});
  }
  return r.output;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = kernels::linear_forward(x, weight, bias);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = make_node<LinearBackward>();
    n->x = x.detach();
    n->w = weight.detach();
    n->has_bias = bias.defined();
    autograd::record(n, {x, weight, bias}, {&y});
  }
  return y;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  TANDEM_CHECK(dim == -1 || dim == x.dim() - 1, "log_softmax: only the last dimension is supported, got dim ",
               dim, " for ", x.str());
  Tensor y = kernels::log_softmax_forward(x);
  if (autograd::any_requires_grad({x})) {
    auto n = make_node<LogSoftmaxBackward>();
    n->y = y.detach();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target) {
  Tensor loss = kernels::nll_loss_forward(log_probs, target);
  if (autograd::any_requires_grad({log_probs})) {
    auto n = make_node<NllLossBackward>();
    n->log_probs = log_probs.detach();
    n->target = target;
    autograd::record(n, {log_probs}, {&loss});
  }
  return loss;
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

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::add(a, b);
  if (autograd::any_requires_grad({a, b})) autograd::record(make_node<AddBackward>(), {a, b}, {&y});
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::sub(a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = make_node<AddBackward>();
    n->sign_b = -1.0;
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::mul(a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = make_node<MulBackward>();
    n->a = a.detach();
    n->b = b.detach();
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

Tensor scale(const Tensor& a, double s) {
  Tensor y = kernels::scale(a, s);
  if (autograd::any_requires_grad({a})) {
    auto n = make_node<ScaleBackward>();
    n->s = s;
    autograd::record(n, {a}, {&y});
  }
  return y;
}

Tensor sum(const Tensor& a) {
  Tensor y = kernels::sum(a);
  if (autograd::any_requires_grad({a})) {
    auto n = make_node<SumBackward>();
    n->input_shape = a.shape();
    autograd::record(n, {a}, {&y});
  }
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::matmul(a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = make_node<MatmulBackward>();
    n->a = a.detach();
    n->b = b.detach();
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

}  // namespace tandem::nn::functional
