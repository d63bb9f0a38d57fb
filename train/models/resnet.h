// ResNet: the CIFAR ResNet of He et al. (2016, section 4.2) for 1-channel 28x28 images, built from
// the engine's modules. With blocks_per_stage 3 it is ResNet-20's shape: a 3x3 stem convolution,
// three stages of `blocks_per_stage` basic blocks (two 3x3 convolutions with padding 1, BatchNorm,
// ReLU, an identity shortcut) at widths w, 2w, 4w, the first block of stages 2 and 3 downsampling
// with stride 2 through a 1x1 projection shortcut (convolution + BatchNorm, torchvision's
// "downsample"), global average pooling and a linear classifier: 6 * blocks + 2 weighted layers. A
// downsampling block computes its first conv and the projection as one op (F::conv2d_pair, nn/conv_pool.h).
// 28x28 -> 28x28 (stage 1) -> 14x14 (stage 2) -> 7x7 (stage 3) -> 1x1.
// Names follow torchvision's resnet ("conv1", "bn1", "layer1.0.conv1", "layer2.0.downsample.0",
// "fc.weight"), so a state_dict moves to an equally built PyTorch model. forward returns
// log-probabilities [N, 10] (train::Runner's loss is nll_loss of the output).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "nn/conv_pool.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/layers_general.h"
#include "nn/module.h"

namespace resnet {

using tandem::Tensor;
namespace nn = tandem::nn;
namespace F = tandem::nn::functional;

// 3x3 convolution, padding 1, no bias (the BatchNorm after it has one).
inline std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{in, out, 3, stride, 1, false});
}

class BasicBlock : public nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride) {
    conv1_ = register_module("conv1", conv3x3(in, out, stride));
    bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(out));
    conv2_ = register_module("conv2", conv3x3(out, out, 1));
    bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      ds_conv_ = std::make_shared<nn::Conv2d>(nn::Conv2dOptions{in, out, 1, stride, 0, false});
      ds_bn_ = std::make_shared<nn::BatchNorm2d>(out);
      using Modules = std::initializer_list<std::shared_ptr<nn::Module>>;
      downsample_ = register_module("downsample", std::make_shared<nn::Sequential>(Modules{ds_conv_, ds_bn_}));
    }
    paired_ = stride == 2 && downsample_;
  }
  Tensor forward(const Tensor& x) override {
    Tensor h, shortcut;
    if (paired_) {
      // conv1 (3x3, stride 2, padding 1) and the 1x1 stride-2 shortcut read the same x: one op
      // (F::conv2d_pair), the same values as the two convs.
      auto y = F::conv2d_pair(x, conv1_->weight, ds_conv_->weight);
      h = y.main;
      shortcut = ds_bn_->forward(y.projection);
    } else {
      h = conv1_->forward(x);
      shortcut = downsample_ ? downsample_->forward(x) : x;
    }
    h = bn1_->forward_relu(h);  // BN + ReLU in one kernel
    h = bn2_->forward(conv2_->forward(h));
    return F::relu(F::add(h, shortcut));
  }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_, ds_conv_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_, ds_bn_;
  std::shared_ptr<nn::Sequential> downsample_;
  bool paired_ = false;
};

class ResNet : public nn::Module {
 public:
  // width: channels of stage 1 (stages 2 and 3 have 2x and 4x); blocks_per_stage 3: ResNet-20.
  ResNet(int64_t width, int64_t blocks_per_stage, int64_t num_classes = 10) {
    TANDEM_CHECK(width >= 1, "ResNet: width must be >= 1, got ", width);
    TANDEM_CHECK(blocks_per_stage >= 1, "ResNet: blocks_per_stage must be >= 1, got ", blocks_per_stage);
    conv1_ = register_module("conv1", conv3x3(1, width, 1));
    bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(width));
    int64_t in = width;
    for (int stage = 0; stage < 3; ++stage) {
      const int64_t out = width << stage;
      auto layer = std::make_shared<nn::Sequential>();
      for (int64_t b = 0; b < blocks_per_stage; ++b) {
        layer->push_back(std::make_shared<BasicBlock>(in, out, stage > 0 && b == 0 ? 2 : 1));
        in = out;
      }
      layers_[stage] = register_module("layer" + std::to_string(stage + 1), layer);
    }
    fc_ = register_module("fc", std::make_shared<nn::Linear>(in, num_classes));
  }
  Tensor forward(const Tensor& x) override {
    TANDEM_CHECK(x.dim() == 4 && x.size(1) == 1, "ResNet: expected images [N, 1, H, W], got ",
                 tandem::shape_str(x.shape()));
    Tensor h = bn1_->forward_relu(conv1_->forward(x));
    for (auto& layer : layers_) h = layer->forward(h);
    h = F::flatten(F::adaptive_avg_pool2d(h, {1, 1}));  // global average pooling -> [N, 4w]
    return F::log_softmax(fc_->forward(h));
  }

 private:
  std::shared_ptr<nn::Conv2d> conv1_;
  std::shared_ptr<nn::BatchNorm2d> bn1_;
  std::shared_ptr<nn::Sequential> layers_[3];
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace resnet
