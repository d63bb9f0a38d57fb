#include "nn/layers.h"

#include "nn/functional.h"
#include "nn/init.h"

namespace tandem::nn {

Conv2d::Conv2d(const Conv2dOptions& o) : options(o) {
  TANDEM_CHECK(o.in_channels > 0 && o.out_channels > 0 && o.kernel_size > 0 && o.stride > 0 && o.padding >= 0,
               "Conv2d: bad options in=", o.in_channels, " out=", o.out_channels, " kernel=", o.kernel_size,
               " stride=", o.stride, " padding=", o.padding);
  const int64_t fan_in = o.in_channels * o.kernel_size * o.kernel_size;
  weight = Tensor::empty({o.out_channels, o.in_channels, o.kernel_size, o.kernel_size});
  init::kaiming_uniform_default_(weight, fan_in);
  register_parameter("weight", weight);
  if (o.bias) {
    bias = Tensor::empty({o.out_channels});
    init::kaiming_uniform_default_(bias, fan_in);
    register_parameter("bias", bias);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  return F::conv2d(x, weight, bias, options.stride, options.padding);
}

BatchNorm2d::BatchNorm2d(int64_t n, double eps_, double momentum_)
    : num_features(n), eps(eps_), momentum(momentum_) {
  TANDEM_CHECK(n > 0, "BatchNorm2d: num_features must be positive, got ", n);
  weight = register_parameter("weight", Tensor::ones({n}));
  bias = register_parameter("bias", Tensor::zeros({n}));
  running_mean = register_buffer("running_mean", Tensor::zeros({n}));
  running_var = register_buffer("running_var", Tensor::ones({n}));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, kInt64));
}

void BatchNorm2d::count_batch(const Tensor& x) {
  TANDEM_CHECK(x.dim() == 4 && x.size(1) == num_features, "BatchNorm2d(", num_features,
               "): expected input [N, ", num_features, ", H, W], got ", x.str());
  if (is_training()) {
    // Counted where the buffer lives (an in-place add on its device): reading it back would make
    // every training forward wait for the device.
    num_batches_tracked.add_(Tensor::ones({}, kInt64, num_batches_tracked.device()));
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  count_batch(x);
  if (is_training() && stats_sync_) return stats_sync_->forward(*this, x);
  return F::batch_norm(x, running_mean, running_var, weight, bias, is_training(), momentum, eps);
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  if (is_training() && stats_sync_) return F::relu(forward(x));
  count_batch(x);
  return F::batch_norm_relu(x, running_mean, running_var, weight, bias, is_training(), momentum, eps);
}

Tensor BatchNorm2d::forward_relu_pool2(const Tensor& x) {
  if (is_training() && stats_sync_) return F::max_pool2d(forward_relu(x), 2);
  count_batch(x);
  return F::batch_norm_relu_max_pool2d(x, running_mean, running_var, weight, bias, is_training(), momentum, eps);
}

Tensor BatchNorm2d::forward_conv_relu_pool2(const Conv2d& conv, const Tensor& x) {
  if (is_training() && stats_sync_) return forward_relu_pool2(F::conv2d(x, conv.weight, conv.bias, conv.options.stride,
                                                                        conv.options.padding));
  TANDEM_CHECK(conv.options.out_channels == num_features, "BatchNorm2d(", num_features, "): expected a conv with ",
               num_features, " output channels, got ", conv.options.out_channels);
  if (is_training()) num_batches_tracked.add_(Tensor::ones({}, kInt64, num_batches_tracked.device()));
  return F::conv2d_batch_norm_relu_max_pool2d(x, conv.weight, conv.bias, conv.options.stride, conv.options.padding,
                                              running_mean, running_var, weight, bias, is_training(), momentum, eps);
}

Linear::Linear(int64_t in, int64_t out, bool with_bias) {
  TANDEM_CHECK(in > 0 && out > 0, "Linear: sizes must be positive, got in=", in, " out=", out);
  weight = Tensor::empty({out, in});
  init::kaiming_uniform_default_(weight, in);
  register_parameter("weight", weight);
  if (with_bias) {
    bias = Tensor::empty({out});
    init::kaiming_uniform_default_(bias, in);
    register_parameter("bias", bias);
  }
}

Tensor Linear::forward(const Tensor& x) { return F::linear(x, weight, bias); }

Tensor ReLU::forward(const Tensor& x) { return F::relu(x); }
Tensor MaxPool2d::forward(const Tensor& x) { return F::max_pool2d(x, kernel_, stride_, padding_, dilation_, ceil_mode_); }
Tensor Flatten::forward(const Tensor& x) { return F::flatten(x, start_dim_); }
Tensor LogSoftmax::forward(const Tensor& x) { return F::log_softmax(x, -1); }

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(children().size()), std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& [name, m] : children()) y = m->forward(y);
  return y;
}

}  // namespace tandem::nn
