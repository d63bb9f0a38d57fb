// Module: a tree of named parameters, buffers and child modules, in
// registration order, with PyTorch's dotted state_dict names
// ("conv1.weight", "n1.running_mean"). Parameters are leaf tensors that
// require grad; buffers are state without gradients. Copies of a Tensor share
// its data, so optimizers and reducers can hold parameters by value.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tandem::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  NamedTensors named_parameters() const;  // recursive, registration order
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Parameters then buffers of each module, depth first: PyTorch's order.
  NamedTensors state_dict() const;
  // Checks every name and shape first, then copies: a mismatch changes
  // nothing. Errors name the tensor. strict: unexpected names are errors too.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void to(Device device);
  void zero_grad();  // sets gradients to none

  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

 protected:
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const;
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Weights as safetensors with the state_dict names (readable by PyTorch).
void save_weights(const Module& module, const std::string& path);
void load_weights(Module& module, const std::string& path);

}  // namespace tandem::nn
