// A synthetic multilayer perceptron for communication benchmarks: Linear layers with ReLU
// between them, in_features -> hidden x layers -> out_features. The default (1024 -> 2048 x6 ->
// 10, 23.1M float32 parameters, 92.4 MB of gradients) is the DDP benchmark's reference model.
// Parameter names follow torch.nn.Sequential of Linear/ReLU: "0.weight", "0.bias", "2.weight",
// ... (ReLUs take the odd indices), so a PyTorch script can build the same model.
// Input [N, in_features]; output [N, out_features] (raw scores, no softmax).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/layers.h"

namespace tandem::nn::models {

struct MlpOptions {
  int64_t in_features = 1024;
  int64_t hidden = 2048;
  int64_t layers = 6;  // hidden layers (Linear + ReLU); the output Linear comes on top
  int64_t out_features = 10;
};

class Mlp : public Module {
 public:
  explicit Mlp(const MlpOptions& options = {});
  Tensor forward(const Tensor& x) override;

  // Number of float32 parameters a model with these options holds.
  static int64_t parameter_count(const MlpOptions& options);

  const MlpOptions options;
  std::vector<std::shared_ptr<Linear>> linears;
};

}  // namespace tandem::nn::models
