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
  // One statement per op: each intermediate is released as soon as the next
  // exists (nested calls would keep every temporary alive to the end of the
  // expression), which bounds the activations held at once without a graph.
  // BatchNorm, relu and the 2x2 max-pool run as one fused op (BatchNorm2d::forward_relu_pool2;
  // max_pool2d(relu(n(h)), 2) when SyncBatchNorm statistics are installed); the first layer's conv joins
  // them (BatchNorm2d::forward_conv_relu_pool2: the conv output is computed where it is read, never
  // stored).
  Tensor h = n1->forward_conv_relu_pool2(*conv1, x);
  h = (*conv2)(h);
  h = n2->forward_relu_pool2(h);
  h = F::flatten(h, 1);
  h = F::relu((*fc1)(h));
  h = (*fc2)(h);
  return F::log_softmax(h, -1);
}

}  // namespace tandem::nn::models
