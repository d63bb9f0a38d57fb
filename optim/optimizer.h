// Optimizers with PyTorch's semantics. Parameters are held by handle (they
// share data with the model's); state lives per parameter, created on the
// first step. A parameter whose .grad is undefined is skipped, as in PyTorch.
// state_dict flattens the per-parameter state to "state.<i>.<name>" tensors
// (i counts parameters across groups in order) plus "group.<g>.lr" scalars.
// Every optimizer also takes a list of ParamGroups (each group's lr and
// weight_decay win over the options'), which is how a wrapper such as
// dist::ZeroRedundancyOptimizer builds the same optimizer over a subset.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 0.0;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // Sets every gradient to none (PyTorch's default since 2.0), or with
  // set_to_none false zeroes them in place, keeping their storage (what
  // DDP's gradient_as_bucket_view wants: gradients stay bucket views).
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  double lr() const { return groups_.at(0).lr; }
  void set_lr(double lr);  // every group

  // Virtual so that a wrapper holding its state elsewhere (a sharded optimizer) answers for it.
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);
  // Bytes of the per-parameter state tensors this object holds (momentum, Adam's moments, ...).
  virtual int64_t state_bytes() const;

 protected:
  Optimizer(std::vector<ParamGroup> groups, const char* name);
  struct ParamState {
    std::map<std::string, Tensor> buffers;
    int64_t step = 0;
  };
  // State of the i-th parameter overall (groups in order).
  ParamState& state(size_t index) { return state_[index]; }
  // Allocates a zero buffer like p on first use.
  Tensor& buffer(ParamState& s, const std::string& name, const Tensor& p);
  // Calls fn(group, param, grad, state) for every parameter that has a
  // gradient, in order; the others are skipped, as PyTorch does.
  template <typename Fn>
  void for_each_param_with_grad(Fn&& fn) {
    size_t i = 0;
    for (auto& g : groups_)
      for (auto& p : g.params) {
        ParamState& s = state(i++);
        Tensor grad = p.grad();
        if (grad.defined()) fn(g, p, grad, s);
      }
  }

  std::vector<ParamGroup> groups_;
  const char* name_;

 private:
  std::vector<ParamState> state_;
};

struct SGDOptions {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);
  void step() override;

 private:
  SGDOptions options_;
};

struct AdadeltaOptions {
  double lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0.0;
};

class Adadelta : public Optimizer {
 public:
  Adadelta(std::vector<Tensor> params, const AdadeltaOptions& options);
  Adadelta(std::vector<ParamGroup> groups, const AdadeltaOptions& options);
  void step() override;

 private:
  AdadeltaOptions options_;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // true: AdamW
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options);
  void step() override;

 protected:
  AdamOptions options_;
};

// AdamW: Adam with decoupled weight decay (p *= 1 - lr * weight_decay).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options);
  AdamW(std::vector<ParamGroup> groups, AdamOptions options);
};

// Multiplies every group's lr by gamma each step_size calls of step()
// (call it once per epoch), from the lrs the optimizer had at construction.
class StepLR {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma);
  void step();
  int64_t last_epoch() const { return epoch_; }
  void set_last_epoch(int64_t epoch);  // for resuming
  double get_lr(size_t group = 0) const;
  // {"last_epoch", "step_size", "gamma", "base_lr.<g>"}; load_state_dict checks
  // step_size, gamma and the group count match, restores the base lrs and
  // last_epoch and sets the groups' lrs (throws tandem::Error on a mismatch).
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  Optimizer& opt_;
  int64_t step_size_;
  double gamma_;
  int64_t epoch_ = 0;
  std::vector<double> base_lrs_;
};

// Cosine annealing from the optimizer's lrs at construction down to eta_min
// over t_max calls of step() (call it once per iteration), as PyTorch's
// CosineAnnealingLR: lr = eta_min + (base - eta_min) * (1 + cos(pi * t / t_max)) / 2.
class CosineAnnealingLR {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  void step();
  int64_t last_step() const { return t_; }
  void set_last_step(int64_t t);
  // {"last_step", "t_max", "eta_min", "base_lr.<g>"}; load_state_dict as StepLR's.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  Optimizer& opt_;
  int64_t t_max_;
  double eta_min_;
  int64_t t_ = 0;
  std::vector<double> base_lrs_;
};

}  // namespace tandem::optim
