// Layers of the general op set, with PyTorch's state_dict names and default initialisation:
//   Dropout(p)                      no state; F::dropout in training, the identity in eval
//   LayerNorm(shape, eps, affine)   "weight" (ones), "bias" (zeros) of `shape` when affine
//   Embedding(num, dim, padding)    "weight" [num, dim] ~ Normal(0, 1), the padding row zeroed
//   GELU(approximate)               no state; "none" or "tanh"
//   ModuleList                      children "0", "1", ... as torch.nn.ModuleList; it has no
//                                   forward of its own (calling it throws): a parent module calls
//                                   its entries in its own forward
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "nn/module.h"

namespace tandem::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  const double p;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // undefined without elementwise_affine
  const Shape normalized_shape;
  const double eps;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;  // int64/int32 indices of any shape -> [..., dim]
  Tensor weight;
  const std::optional<int64_t> padding_idx;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  const std::string approximate;
};

class ModuleList : public Module {
 public:
  ModuleList() = default;
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return children().size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  Tensor forward(const Tensor& x) override;  // throws: a ModuleList is a container
};

}  // namespace tandem::nn
