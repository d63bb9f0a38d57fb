// The Runner with several optimizers (RunnerOptions::optim_wrapper_dict, MMEngine's
// MultiOptimWrapperConstructor): an OptimWrapperDict with one wrapper per child module of the model,
// each over that child's parameters, with its param schedulers (param_scheduler_dict, or the one
// list for each); every iteration is the model's train_step(batch, optim_wrapper);
// checkpoints hold each wrapper's optimizer and scaler state under "<name>.".
#include <spdlog/spdlog.h>

#include "train/checkpoint.h"
#include "train/registries.h"
#include "train/runner.h"
#include "train/runner_internal.h"

namespace tandem::train {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The entries of `state` under "<name>.", without the prefix.
TensorMap under(const TensorMap& state, const std::string& name) {
  TensorMap out;
  const std::string prefix = name + ".";
  for (const auto& [key, t] : state)
    if (key.rfind(prefix, 0) == 0) out[key.substr(prefix.size())] = t;
  return out;
}

}  // namespace

void Runner::setup_optimizer_dict() {
  std::vector<std::string> names;
  for (const auto& [name, cfg] : o_.optim_wrapper_dict) names.push_back(name);
  const std::string model = o_.model_instance ? std::string("the given model") : "model " + o_.model;
  TANDEM_CHECK(task_->has_train_step(), model, " has several optimizers (optim_wrapper ", joined(names),
               ") but does not override train_step(batch, optim_wrapper): a model with several optimizers runs its "
               "own step (train/model.h)");
  TANDEM_CHECK(o_.launcher == "none" && !o_.cuda_graph && o_.auto_scale_lr_base_batch == 0, "several optimizers "
               "(optim_wrapper ", joined(names), ") train on one process, without --cuda-graph and auto_scale_lr, "
               "here; got launcher ", o_.launcher, o_.cuda_graph ? ", cuda_graph" : "",
               o_.auto_scale_lr_base_batch > 0 ? ", auto_scale_lr" : "");
  std::map<std::string, std::shared_ptr<nn::Module>> children;
  std::vector<std::string> child_names;
  for (const auto& [name, child] : net_->children()) {
    children[name] = child;
    child_names.push_back(name);
  }
  for (const std::string& name : names)
    TANDEM_CHECK(children.count(name), "optim_wrapper.", name, ": ", model, " has no child module '", name,
                 "'; its children: ", child_names.empty() ? std::string("(none)") : joined(child_names));
  optim_dict_ = std::make_unique<OptimWrapperDict>(build_optim_wrapper_dict(
      o_.optim_wrapper_dict, [&](const std::string& name) { return children.at(name)->parameters(); }));
  primary_ = &optim_dict_->first();
  base_lr_ = optimizer().lr();
  for (const auto& [name, specs] : o_.param_scheduler_dict)
    TANDEM_CHECK(o_.optim_wrapper_dict.count(name) > 0, "param_scheduler.", name,
                 ": optim_wrapper has no wrapper '", name, "'; it has: ", joined(names));
  for (const std::string& name : names) {
    OptimWrapper& w = optim_dict_->at(name);
    // Each wrapper's schedulers bound to its optimizer, all stepped in this order by the hook.
    const auto own = o_.param_scheduler_dict.find(name);
    add_schedulers(w.optimizer(), o_.param_scheduler_dict.empty()           ? scheduler_specs(o_)
                                  : own == o_.param_scheduler_dict.end() ? std::vector<SchedulerSpec>{}
                                                                          : own->second);
    spdlog::info("optim_wrapper.{}: {} parameters, lr {}{}", name, children.at(name)->parameters().size(),
                 w.optimizer().lr(), w.scaler().enabled() ? ", float16 loss scaling" : "");
  }
}

IterOutputs Runner::dict_step(const DataBatch& batch) {
  IterOutputs out;
  out.batch_size = batch_tensor(batch, "inputs").size(0);
  out.lr = optimizer().lr();
  const LossList losses = task_->train_step(batch, *optim_dict_);
  TANDEM_CHECK(!losses.empty(), "train_step returned no losses; it returns the losses to log");
  out.loss = 0;
  for (const auto& [name, loss] : losses) {
    const double v = loss.item<double>();
    out.losses.emplace_back(name, v);
    out.loss += v;
  }
  out.updated = true;
  return out;
}

void Runner::save_optim_state(Checkpoint& c) {
  if (!optim_dict_) {
    c.optimizer = optimizer().state_dict();
    if (scaler().enabled()) c.scaler = scaler().state_dict();
    return;
  }
  for (const std::string& name : optim_dict_->names()) {
    OptimWrapper& w = optim_dict_->at(name);
    for (const auto& [key, t] : w.optimizer().state_dict()) c.optimizer[name + "." + key] = t;
    for (const auto& [key, t] : w.scaler().state_dict()) c.scaler[name + "." + key] = t;
  }
}

void Runner::load_optim_state(const Checkpoint& c) {
  if (!optim_dict_) {
    optimizer().load_state_dict(c.optimizer);
    if (scaler().enabled() && !c.scaler.empty()) scaler().load_state_dict(c.scaler);
    return;
  }
  for (const std::string& name : optim_dict_->names()) {
    OptimWrapper& w = optim_dict_->at(name);
    try {
      w.optimizer().load_state_dict(under(c.optimizer, name));
      w.scaler().load_state_dict(under(c.scaler, name));
    } catch (const Error& e) {
      TANDEM_FAIL("optim_wrapper.", name, ": ", e.what());
    }
  }
}

}  // namespace tandem::train
