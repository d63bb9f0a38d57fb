#include "optim/optimizer.h"

#include <cmath>

#include "kernels/optim.h"

namespace tandem::optim {

namespace {
double state_value(const std::map<std::string, double>& state, const std::string& key, const char* who) {
  auto it = state.find(key);
  TANDEM_CHECK(it != state.end(), who, ": state has no '", key, "'");
  return it->second;
}

void expect_same(const std::map<std::string, double>& state, const std::string& key, double now, const char* who) {
  const double saved = state_value(state, key, who);
  TANDEM_CHECK(saved == now, who, ": saved state has ", key, " = ", saved, " but this schedule has ", now);
}

void save_base_lrs(const std::vector<double>& base, std::map<std::string, double>& out) {
  for (size_t g = 0; g < base.size(); ++g) out["base_lr." + std::to_string(g)] = base[g];
}

void load_base_lrs(const std::map<std::string, double>& state, std::vector<double>& base, const char* who) {
  size_t groups = 0;
  for (auto& [k, v] : state) groups += k.rfind("base_lr.", 0) == 0;
  TANDEM_CHECK(groups == base.size(), who, ": saved state has ", groups, " param group(s), the optimizer has ",
               base.size());
  for (size_t g = 0; g < base.size(); ++g) base[g] = state_value(state, "base_lr." + std::to_string(g), who);
}

std::vector<ParamGroup> one_group(std::vector<Tensor> params, double lr, double wd) {
  ParamGroup g;
  g.params = std::move(params);
  g.lr = lr;
  g.weight_decay = wd;
  return {g};
}
}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, const char* name) : groups_(std::move(groups)), name_(name) {
  size_t n = 0;
  for (auto& g : groups_) {
    TANDEM_CHECK(g.lr >= 0.0, name_, ": learning rate must be >= 0, got ", g.lr);
    TANDEM_CHECK(g.weight_decay >= 0.0, name_, ": weight_decay must be >= 0, got ", g.weight_decay);
    for (auto& p : g.params)
      TANDEM_CHECK(p.requires_grad(), name_, ": parameter ", n, " (", p.str(), ") does not require grad");
    n += g.params.size();
  }
  TANDEM_CHECK(n > 0, name_, ": no parameters to optimise");
  state_.resize(n);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (set_to_none)
        p.set_grad(Tensor());
      else if (Tensor grad = p.grad(); grad.defined())
        grad.zero_();
    }
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr;
}

Tensor& Optimizer::buffer(ParamState& s, const std::string& name, const Tensor& p) {
  auto it = s.buffers.find(name);
  if (it == s.buffers.end()) it = s.buffers.emplace(name, Tensor::zeros(p.shape(), p.dtype(), p.device())).first;
  return it->second;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < state_.size(); ++i) {
    for (auto& [name, t] : state_[i].buffers) out["state." + std::to_string(i) + "." + name] = t;
    out["state." + std::to_string(i) + ".step"] = Tensor::scalar(static_cast<double>(state_[i].step), kInt64);
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    out["group." + std::to_string(g) + ".lr"] = Tensor::scalar(groups_[g].lr, kFloat64);
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<ParamState> loaded(state_.size());
  std::vector<const Tensor*> params;
  for (auto& g : groups_)
    for (auto& p : g.params) params.push_back(&p);
  for (auto& [key, t] : state) {
    if (key.rfind("group.", 0) == 0) continue;
    const auto dot1 = key.find('.'), dot2 = key.find('.', dot1 + 1);
    TANDEM_CHECK(key.rfind("state.", 0) == 0 && dot2 != std::string::npos, name_,
                 ": unexpected optimizer state key '", key, "'");
    const size_t i = std::stoul(key.substr(dot1 + 1, dot2 - dot1 - 1));
    const std::string field = key.substr(dot2 + 1);
    TANDEM_CHECK(i < loaded.size(), name_, ": state for parameter ", i, " but only ", loaded.size(), " parameters");
    if (field == "step") {
      loaded[i].step = t.item<int64_t>();
    } else {
      TANDEM_CHECK(t.shape() == params[i]->shape(), name_, ": state '", key, "' has shape ", shape_str(t.shape()),
                   ", expected ", shape_str(params[i]->shape()));
      loaded[i].buffers[field] = t.to(params[i]->device()).to(params[i]->dtype()).clone();
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto it = state.find("group." + std::to_string(g) + ".lr");
    if (it != state.end()) groups_[g].lr = it->second.item<double>();
  }
  state_ = std::move(loaded);
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const ParamState& s : state_)
    for (const auto& [name, t] : s.buffers) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// ---- SGD ----

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o) : SGD(one_group(std::move(params), o.lr, o.weight_decay), o) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& o) : Optimizer(std::move(groups), "SGD"), options_(o) {
  TANDEM_CHECK(o.momentum >= 0.0, "SGD: momentum must be >= 0, got ", o.momentum);
  TANDEM_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
               "SGD: nesterov needs momentum > 0 and dampening 0");
}

void SGD::step() {
  for_each_param_with_grad([&](ParamGroup& g, Tensor& p, Tensor& grad, ParamState& s) {
    Tensor buf = options_.momentum != 0.0 ? buffer(s, "momentum_buffer", p) : Tensor();
    kernels::SgdStep fn{static_cast<float>(g.lr), static_cast<float>(options_.momentum),
                        static_cast<float>(options_.dampening), static_cast<float>(g.weight_decay),
                        options_.nesterov, /*first=*/s.step == 0};
    kernels::sgd_update(p, grad, buf, fn);
    ++s.step;
  });
}

// ---- Adadelta ----

Adadelta::Adadelta(std::vector<Tensor> params, const AdadeltaOptions& o)
    : Adadelta(one_group(std::move(params), o.lr, o.weight_decay), o) {}

Adadelta::Adadelta(std::vector<ParamGroup> groups, const AdadeltaOptions& o)
    : Optimizer(std::move(groups), "Adadelta"), options_(o) {
  TANDEM_CHECK(o.rho >= 0.0 && o.rho <= 1.0, "Adadelta: rho must be in [0, 1], got ", o.rho);
  TANDEM_CHECK(o.eps >= 0.0, "Adadelta: eps must be >= 0, got ", o.eps);
}

void Adadelta::step() {
  for_each_param_with_grad([&](ParamGroup& g, Tensor& p, Tensor& grad, ParamState& s) {
    kernels::AdadeltaStep fn{static_cast<float>(g.lr), static_cast<float>(options_.rho),
                             static_cast<float>(options_.eps), static_cast<float>(g.weight_decay)};
    kernels::adadelta_update(p, grad, buffer(s, "square_avg", p), buffer(s, "acc_delta", p), fn);
    ++s.step;
  });
}

// ---- Adam / AdamW ----

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o)
    : Adam(one_group(std::move(params), o.lr, o.weight_decay), o) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& o)
    : Optimizer(std::move(groups), o.decoupled_weight_decay ? "AdamW" : "Adam"), options_(o) {
  TANDEM_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0, name_,
               ": betas must be in [0, 1), got ", o.beta1, ", ", o.beta2);
  TANDEM_CHECK(o.eps >= 0.0, name_, ": eps must be >= 0, got ", o.eps);
}

void Adam::step() {
  for_each_param_with_grad([&](ParamGroup& g, Tensor& p, Tensor& grad, ParamState& s) {
    ++s.step;
    const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(s.step));
    const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(s.step));
    const auto fn = kernels::AdamStep::make(g.lr, options_.beta1, options_.beta2, options_.eps, g.weight_decay,
                                            options_.decoupled_weight_decay, bc1, bc2);
    kernels::adam_update(p, grad, buffer(s, "exp_avg", p), buffer(s, "exp_avg_sq", p), fn);
  });
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions o)
    : AdamW(one_group(std::move(params), o.lr, o.weight_decay), o) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions o)
    : Adam(std::move(groups), [&] {
        o.decoupled_weight_decay = true;
        return o;
      }()) {}

// ---- StepLR ----

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : opt_(optimizer), step_size_(step_size), gamma_(gamma) {
  TANDEM_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  for (auto& g : opt_.param_groups()) base_lrs_.push_back(g.lr);
}

double StepLR::get_lr(size_t group) const {
  return base_lrs_.at(group) * std::pow(gamma_, static_cast<double>(epoch_ / step_size_));
}

void StepLR::step() { set_last_epoch(epoch_ + 1); }

void StepLR::set_last_epoch(int64_t epoch) {
  epoch_ = epoch;
  auto& groups = opt_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = get_lr(g);
}

std::map<std::string, double> StepLR::state_dict() const {
  std::map<std::string, double> out{{"last_epoch", static_cast<double>(epoch_)},
                                    {"step_size", static_cast<double>(step_size_)}, {"gamma", gamma_}};
  save_base_lrs(base_lrs_, out);
  return out;
}

void StepLR::load_state_dict(const std::map<std::string, double>& state) {
  expect_same(state, "step_size", static_cast<double>(step_size_), "StepLR");
  expect_same(state, "gamma", gamma_, "StepLR");
  std::vector<double> base = base_lrs_;
  load_base_lrs(state, base, "StepLR");
  base_lrs_ = base;
  set_last_epoch(static_cast<int64_t>(state_value(state, "last_epoch", "StepLR")));
}

// ---- CosineAnnealingLR ----

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : opt_(optimizer), t_max_(t_max), eta_min_(eta_min) {
  TANDEM_CHECK(t_max > 0, "CosineAnnealingLR: t_max must be positive, got ", t_max);
  for (auto& g : opt_.param_groups()) base_lrs_.push_back(g.lr);
}

void CosineAnnealingLR::step() { set_last_step(t_ + 1); }

void CosineAnnealingLR::set_last_step(int64_t t) {
  t_ = t;
  const double progress = static_cast<double>(std::min(t_, t_max_)) / static_cast<double>(t_max_);
  auto& groups = opt_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    groups[g].lr = eta_min_ + (base_lrs_[g] - eta_min_) * (1.0 + std::cos(M_PI * progress)) / 2.0;
}

std::map<std::string, double> CosineAnnealingLR::state_dict() const {
  std::map<std::string, double> out{{"last_step", static_cast<double>(t_)},
                                    {"t_max", static_cast<double>(t_max_)}, {"eta_min", eta_min_}};
  save_base_lrs(base_lrs_, out);
  return out;
}

void CosineAnnealingLR::load_state_dict(const std::map<std::string, double>& state) {
  expect_same(state, "t_max", static_cast<double>(t_max_), "CosineAnnealingLR");
  expect_same(state, "eta_min", eta_min_, "CosineAnnealingLR");
  std::vector<double> base = base_lrs_;
  load_base_lrs(state, base, "CosineAnnealingLR");
  base_lrs_ = base;
  set_last_step(static_cast<int64_t>(state_value(state, "last_step", "CosineAnnealingLR")));
}

}  // namespace tandem::optim
