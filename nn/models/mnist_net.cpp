#include "nn/models/mnist_net.h"

#include "nn/functional.h"

namespace tandem::nn::models {

MnistNet::MnistNet() {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(1, 32, 3, 1));
  n1 = register_module("n1", std::make_shared<BatchNorm2d>(32));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(32, 64, 3, 1));
  n2 = register_module("n2", std::make_shared<BatchNorm2d>(64));
  fc1 = register_module("fc1", std::make_shared<Linear>(1600, 128));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, 10));
}

Tensor MnistNet::forward(const Tensor& x) {
  TANDEM_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28,
               "MnistNet: expected input [N, 1, 28, 28], got ", x.str());
  Tensor h = F::max_pool2d(F::relu((*n1)(( *conv1)(x))), 2);
  h = F::max_pool2d(F::relu((*n2)((*conv2)(h))), 2);
  h = F::relu((*fc1)(F::flatten(h, 1)));
  return F::log_softmax((*fc2)(h), -1);
}

}  // namespace tandem::nn::models
