// The classic MNIST convnet, with PyTorch's parameter names:
//   conv1 Conv2d(1, 32, 3) -> n1 BatchNorm2d(32) -> relu -> max_pool2d(2)
//   conv2 Conv2d(32, 64, 3) -> n2 BatchNorm2d(64) -> relu -> max_pool2d(2)
//   flatten -> fc1 Linear(1600, 128) -> relu -> fc2 Linear(128, 10) -> log_softmax
// Input [N, 1, 28, 28]; output log-probabilities [N, 10].
#pragma once

#include <memory>

#include "nn/layers.h"

namespace tandem::nn::models {

class MnistNet : public Module {
 public:
  MnistNet();
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> n1, n2;
  std::shared_ptr<Linear> fc1, fc2;
};

}  // namespace tandem::nn::models
