// The layers of the MNIST net and the containers around them. Each holds its
// parameters under PyTorch's names (weight, bias, running_mean, running_var,
// num_batches_tracked) and initialises them as PyTorch's reset_parameters.
// BatchNorm2d may be given a BatchNormStatsSync: then its training forward
// normalises with statistics shared beyond this process (SyncBatchNorm, which
// dist/parallel/sync_batch_norm.h implements; nn itself never communicates).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "nn/module.h"

namespace tandem::nn {

struct Conv2dOptions {
  int64_t in_channels, out_channels, kernel_size, stride = 1, padding = 0;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& o);
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0)
      : Conv2d(Conv2dOptions{in, out, kernel, stride, padding}) {}
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  const Conv2dOptions options;
};

class BatchNorm2d;

// How a BatchNorm2d computes its training-mode forward when its batch
// statistics are shared with other processes. forward() returns the
// differentiable output for x and updates bn's running_mean/running_var (not
// num_batches_tracked, which BatchNorm2d counts itself). Eval mode never calls
// it. Implemented in dist/ (dist::SyncBatchNormStats) so that nn needs no dist.
class BatchNormStatsSync {
 public:
  virtual ~BatchNormStatsSync() = default;
  virtual Tensor forward(BatchNorm2d& bn, const Tensor& x) = 0;
  virtual std::string name() const = 0;  // for messages, e.g. "SyncBatchNorm(gloo, 2 ranks)"
};

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)), fused into one kernel (F::batch_norm_relu) unless synced statistics are
  // installed and training (then exactly relu(forward(x))).
  Tensor forward_relu(const Tensor& x);
  // max_pool2d(forward_relu(x), 2) (kernel 2, stride 2), fused into one kernel
  // (F::batch_norm_relu_max_pool2d) under the same condition as forward_relu.
  Tensor forward_relu_pool2(const Tensor& x);
  // forward_relu_pool2(conv(x)), as one fused op where F::conv2d_batch_norm_relu_max_pool2d has one.
  Tensor forward_conv_relu_pool2(const Conv2d& conv, const Tensor& x);
  // Installs (or, with nullptr, removes) the strategy for synced statistics.
  void set_stats_sync(std::shared_ptr<BatchNormStatsSync> sync) { stats_sync_ = std::move(sync); }
  const std::shared_ptr<BatchNormStatsSync>& stats_sync() const { return stats_sync_; }

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  const int64_t num_features;
  const double eps, momentum;

 private:
  void count_batch(const Tensor& x);  // checks x's shape; in training, ++num_batches_tracked
  std::shared_ptr<BatchNormStatsSync> stats_sync_;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0, int64_t dilation = 1,
                     bool ceil_mode = false)
      : kernel_(kernel), stride_(stride), padding_(padding), dilation_(dilation), ceil_mode_(ceil_mode) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t kernel_, stride_, padding_, dilation_;
  bool ceil_mode_;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t start_dim_;
};

class LogSoftmax : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Children named "0", "1", ... as torch.nn.Sequential.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
};

}  // namespace tandem::nn
