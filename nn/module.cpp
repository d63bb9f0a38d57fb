#include "nn/module.h"

#include <set>

#include "core/safetensors.h"

namespace tandem::nn {

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return t;
}

void Module::collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const {
  if (params)
    for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  if (buffers)
    for (auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  for (auto& [n, child] : children_) child->collect(prefix + n + ".", params, buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, true, out);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect("", true, true, out);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  NamedTensors mine = state_dict();
  std::set<std::string> expected;
  // Tensors present with the wrong shape or kind are reported before missing ones.
  std::string missing;
  for (auto& [name, t] : mine) {
    expected.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      if (missing.empty()) missing = "missing tensor '" + name + "' (expected shape " + shape_str(t.shape()) + ")";
      continue;
    }
    TANDEM_CHECK(it->second.shape() == t.shape(), "tensor '", name, "' has shape ",
                 shape_str(it->second.shape()), ", expected ", shape_str(t.shape()));
    TANDEM_CHECK(is_floating(it->second.dtype()) == is_floating(t.dtype()), "tensor '", name, "' is ",
                 dtype_name(it->second.dtype()), ", expected ", dtype_name(t.dtype()));
  }
  TANDEM_CHECK(missing.empty(), missing);
  if (strict)
    for (auto& [name, t] : state)
      TANDEM_CHECK(expected.count(name), "unexpected tensor '", name, "' (this model has no such parameter or buffer)");
  for (auto& [name, t] : mine) const_cast<Tensor&>(t).copy_(state.at(name));
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(Device device) {
  for (auto& [n, t] : state_dict()) {
    Tensor moved = t.to(device);
    const_cast<Tensor&>(t).set_data(moved);
    if (t.grad().defined()) const_cast<Tensor&>(t).set_grad(t.grad().to(device));
  }
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) const_cast<Tensor&>(t).set_grad(Tensor());
}

void save_weights(const Module& module, const std::string& path) {
  TensorMap map;
  for (auto& [n, t] : module.state_dict()) map[n] = t;
  save_safetensors(path, map, {{"format", "pt"}});
}

void load_weights(Module& module, const std::string& path) {
  TensorMap map = load_safetensors(path);
  try {
    module.load_state_dict(map);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace tandem::nn
