// nn/conv_pool.h. GeneralConv2dBackward calls the conv kernels of kernels/conv.h with per-axis
// geometry; DilateBackward takes the strided grid positions of the gradient back; the pools
// record their own nodes (kernels/avg_pool.h).
#include "nn/conv_pool.h"

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/avg_pool.h"
#include "kernels/conv.h"
#include "kernels/conv_pair.h"
#include "nn/amp.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

struct GeneralConv2dBackward final : Node {
  Tensor x, w;
  kernels::Conv2dArgs args;
  bool has_bias = false;
  std::string name() const override { return "Conv2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::conv2d_backward(g[0], x, w, args, needs_input_grad(0), needs_input_grad(1),
                                      has_bias && needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

// The pair's node: two outputs (main, projection), three inputs (x, main_weight, projection_weight).
struct Conv2dPairBackward final : Node {
  Tensor x, w3, w1;
  std::string name() const override { return "Conv2dPairBackward"; }
  uint32_t num_outputs() const override { return 2; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::conv2d_pair_backward(g[0], g[1], x, w3, w1, needs_input_grad(0), needs_input_grad(1),
                                           needs_input_grad(2));
    return {r.input, r.main_weight, r.projection_weight};
  }
};

struct DilateBackward final : Node {
  int64_t dh = 1, dw = 1;
  std::string name() const override { return "DilateBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {g[0].slice(2, 0, g[0].size(2), dh).slice(3, 0, g[0].size(3), dw).contiguous()};
  }
};

struct AvgPool2dBackward final : Node {
  Shape input_shape;
  kernels::AvgPool2dArgs args;
  std::string name() const override { return "AvgPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::avg_pool2d_backward(g[0], input_shape, args)};
  }
};

struct AdaptiveAvgPool2dBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "AdaptiveAvgPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::adaptive_avg_pool2d_backward(g[0], input_shape)};
  }
};

// The weight spread over a grid with dilation (dh, dw): zeros between the taps.
Tensor dilate(const Tensor& w, int64_t dh, int64_t dw) {
  Tensor out = Tensor::zeros({w.size(0), w.size(1), (w.size(2) - 1) * dh + 1, (w.size(3) - 1) * dw + 1}, w.dtype(),
                             w.device());
  out.slice(2, 0, out.size(2), dh).slice(3, 0, out.size(3), dw).copy_(w);
  if (autograd::any_requires_grad({w})) {
    auto n = std::make_shared<DilateBackward>();
    n->dh = dh;
    n->dw = dw;
    autograd::record(n, {w}, {&out});
  }
  return out;
}

Tensor conv_once(const Tensor& x, const Tensor& w, const Tensor& b, const kernels::Conv2dArgs& args) {
  Tensor y = kernels::conv2d_forward(x, w, b, args);
  if (autograd::any_requires_grad({x, w, b})) {
    auto n = std::make_shared<GeneralConv2dBackward>();
    n->x = x.detach();
    n->w = w.detach();
    n->args = args;
    n->has_bias = b.defined();
    autograd::record(n, {x, w, b}, {&y});
  }
  return y;
}

// Runs fn on x made 4-D (an unbatched [C, H, W] input gets a batch of 1, removed afterwards).
template <typename Fn>
Tensor batched(const char* op, const Tensor& x, Fn&& fn) {
  TANDEM_CHECK(x.defined() && (x.dim() == 3 || x.dim() == 4), op, ": expected [N, C, H, W] or [C, H, W], got ",
               x.defined() ? x.str() : "undefined");
  if (x.dim() == 4) return fn(x);
  return squeeze(fn(unsqueeze(x, 0)), 0);
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  return batched("conv2d", x_in, [&](const Tensor& x) {
    TANDEM_CHECK(weight.defined() && weight.dim() == 4, "conv2d: weight must be [K, C/groups, R, S], got ",
                 weight.defined() ? weight.str() : "undefined");
    TANDEM_CHECK(p.groups > 0 && p.stride[0] > 0 && p.stride[1] > 0 && p.dilation[0] > 0 && p.dilation[1] > 0 &&
                     p.padding[0] >= 0 && p.padding[1] >= 0,
                 "conv2d: groups, stride and dilation must be positive and padding non-negative, got groups ",
                 p.groups, ", stride ", p.stride[0], "x", p.stride[1], ", dilation ", p.dilation[0], "x",
                 p.dilation[1], ", padding ", p.padding[0], "x", p.padding[1]);
    const int64_t G = p.groups, K = weight.size(0), Cg = weight.size(1);
    TANDEM_CHECK(x.size(1) == Cg * G && K % G == 0, "conv2d: input ", x.str(), " and weight ", weight.str(),
                 " do not fit groups=", G, " (expected input channels = ", Cg, " x ", G,
                 " and output channels divisible by ", G, ")");
    const bool plain = G == 1 && p.dilation[0] == 1 && p.dilation[1] == 1 && p.stride[0] == p.stride[1] &&
                       p.padding[0] == p.padding[1];
    if (plain) return conv2d(x, weight, bias, p.stride[0], p.padding[0]);
    if (x.device().is_cuda()) {  // cuDNN takes dilation and groups itself: one convolution
      const kernels::Conv2dArgs args{p.stride[0], p.stride[1], p.padding[0],   p.padding[1],
                                     p.dilation[0], p.dilation[1], p.groups};
      return conv_once(x, weight, bias, args);
    }
    const Tensor w = p.dilation[0] == 1 && p.dilation[1] == 1 ? weight : dilate(weight, p.dilation[0], p.dilation[1]);
    const kernels::Conv2dArgs args{p.stride[0], p.stride[1], p.padding[0], p.padding[1]};
    if (G == 1) return conv_once(x, w, bias, args);
    const int64_t Kg = K / G;
    std::vector<Tensor> outs;
    for (int64_t g = 0; g < G; ++g) {
      outs.push_back(conv_once(narrow(x, 1, g * Cg, Cg), narrow(w, 0, g * Kg, Kg),
                               bias.defined() ? narrow(bias, 0, g * Kg, Kg) : Tensor(), args));
    }
    return cat(outs, 1);
  });
}

Tensor avg_pool2d(const Tensor& x_in, int64_t kernel, int64_t stride, int64_t padding, bool ceil_mode,
                  bool count_include_pad, int64_t divisor_override) {
  return batched("avg_pool2d", x_in, [&](const Tensor& x) {
    const int64_t s = stride <= 0 ? kernel : stride;
    const kernels::AvgPool2dArgs args{kernel, kernel, s, s, padding, padding, ceil_mode, count_include_pad,
                                      divisor_override};
    Tensor y = kernels::avg_pool2d_forward(x, args);
    if (autograd::any_requires_grad({x})) {
      auto n = std::make_shared<AvgPool2dBackward>();
      n->input_shape = x.shape();
      n->args = args;
      autograd::record(n, {x}, {&y});
    }
    return y;
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x_in, std::array<int64_t, 2> output_size) {
  return batched("adaptive_avg_pool2d", x_in, [&](const Tensor& x) {
    Tensor y = kernels::adaptive_avg_pool2d_forward(x, output_size[0], output_size[1]);
    if (autograd::any_requires_grad({x})) {
      auto n = std::make_shared<AdaptiveAvgPool2dBackward>();
      n->input_shape = x.shape();
      autograd::record(n, {x}, {&y});
    }
    return y;
  });
}

ConvPairOutput conv2d_pair(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight) {
  if (amp::autocast_enabled() || !kernels::conv2d_pair_applies(x, main_weight, projection_weight)) {
    return {conv2d(x, main_weight, Tensor(), 2, 1), conv2d(x, projection_weight, Tensor(), 2, 0)};
  }
  auto r = kernels::conv2d_pair_forward(x, main_weight, projection_weight);
  ConvPairOutput y{r.main, r.projection};
  if (autograd::any_requires_grad({x, main_weight, projection_weight})) {
    auto n = std::make_shared<Conv2dPairBackward>();
    n->x = x.detach();
    n->w3 = main_weight.detach();
    n->w1 = projection_weight.detach();
    autograd::record(n, {x, main_weight, projection_weight}, {&y.main, &y.projection});
  }
  return y;
}

}  // namespace tandem::nn::functional
