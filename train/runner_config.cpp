// RunnerOptions from a config tree in MMEngine's shape (see run_config.h): every value read once,
// from the completed tree, where the Runner uses it.
#include <algorithm>

#include "core/error.h"
#include "train/evaluator.h"
#include "train/models/zoo.h"
#include "train/run_config.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

// The entries of a list of {type, ...} dicts as specs whose keyword errors name `owner`[i].
template <typename Spec>
std::vector<Spec> specs_of(const Json& list, const std::string& owner, const Origins& o) {
  std::vector<Spec> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = owner + "[" + std::to_string(i) + "]";
    out.push_back(Spec{list[i]["type"].get<std::string>(), kwargs_at(list[i], path, o)});
  }
  return out;
}

std::string describe_data(const Json& d) {
  const std::string type = d["type"].get<std::string>(), root = d.value("data_root", "");
  if (type == "MNIST" && root == "/usr/share/datasets/fashion-mnist")
    return "Fashion-MNIST (Debian's dataset-fashion-mnist) in " + root;
  return type + (root.empty() ? "" : " in " + root);
}

void set_data(const Json& t, const Origins& o, RunnerOptions& r) {
  const Json& train = t["train_dataloader"];
  const Json& val = t["val_dataloader"];
  r.batch_size = train["batch_size"].get<int64_t>();
  r.val_batch_size = val["batch_size"].get<int64_t>();
  r.shuffle = train["sampler"]["shuffle"].get<bool>();
  r.pad = train["sampler"]["round_up"].get<bool>();
  const Json& td = train["dataset"];
  const Json& vd = val["dataset"];
  r.train_dataset = datasets().get(td["type"].get<std::string>())(kwargs_at(td, "train_dataloader.dataset", o), "train");
  r.val_dataset = datasets().get(vd["type"].get<std::string>())(kwargs_at(vd, "val_dataloader.dataset", o), "val");
  r.data_description = describe_data(td) + " (" + std::to_string(r.train_dataset->size()) + " train, " +
                       std::to_string(r.val_dataset->size()) + " test samples)";
}

void set_optim(const Json& t, const Origins& o, RunnerOptions& r) {
  const Json& w = t["optim_wrapper"];
  const Json& scale = t["auto_scale_lr"];
  r.auto_scale_lr_base_batch = scale["enable"].get<bool>() ? scale["base_batch_size"].get<int64_t>() : 0;
  r.param_scheduler.clear();
  const Json& ps = t["param_scheduler"];
  if (ps.is_object()) {  // several optimizers: one list per wrapper
    for (const auto& [name, list] : ps.items())
      r.param_scheduler_dict[name] = specs_of<SchedulerSpec>(list, "param_scheduler." + name, o);
  } else {
    r.param_schedulers = specs_of<SchedulerSpec>(ps, "param_scheduler", o);
  }
  if (w.contains("constructor")) {  // several optimizers, each wrapper's config as completed
    for (const auto& [name, child] : w.items())
      if (name != "constructor") r.optim_wrapper_dict[name] = child.dump();
    return;
  }
  const Json& opt = w["optimizer"];
  r.optimizer = opt["type"].get<std::string>();
  r.optimizer_args = kwargs_at(opt, "optim_wrapper.optimizer", o);
  const Json& dtype = w["dtype"];
  const std::string type = w["type"].get<std::string>();
  r.amp = type != "AmpOptimWrapper" ? "off" : dtype.is_null() ? "auto" : dtype == "float16" ? "fp16" : "bf16";
  // The two built-in types follow amp; another registered wrapper is built by its name.
  r.optim_wrapper = type == "OptimWrapper" || type == "AmpOptimWrapper" ? "" : type;
  r.loss_scale = w["loss_scale"].dump();
  r.accumulative_counts = w["accumulative_counts"].get<int64_t>();
  if (!w["clip_grad"].is_null()) {
    r.clip_max_norm = w["clip_grad"]["max_norm"].get<double>();
    r.clip_norm_type = w["clip_grad"]["norm_type"].get<double>();
  }
}

void set_loop_and_hooks(const Json& t, RunnerOptions& r) {
  const Json& loop = t["train_cfg"];
  if (loop["by_epoch"].get<bool>())
    r.max_epochs = loop["max_epochs"].get<int64_t>();
  else
    r.max_iters = loop["max_iters"].get<int64_t>();
  r.val_interval = loop["val_interval"].get<int64_t>();
  const Json& seed = t["randomness"]["seed"];
  r.seed = seed.is_null() ? 1 : seed.get<uint64_t>();
  const Json& hooks = t["default_hooks"];
  if (hooks["logger"].is_object()) r.log_interval = hooks["logger"]["interval"].get<int64_t>();
  if (hooks["checkpoint"].is_object()) {
    const Json& c = hooks["checkpoint"];
    const int64_t interval = c["interval"].get<int64_t>();
    r.checkpoint_interval_epochs = c["by_epoch"].get<bool>() ? interval : 0;
    r.checkpoint_interval_iters = c["by_epoch"].get<bool>() ? c["interval_iters"].get<int64_t>() : interval;
    r.max_keep_ckpts = std::max<int64_t>(0, c["max_keep_ckpts"].get<int64_t>());
    const Json& best = c["save_best"];
    r.save_best = best.is_null() ? "" : best == "auto" ? "accuracy" : best.get<std::string>();
  }
  r.vis_backends.clear();
  for (const Json& b : t["visualizer"]["vis_backends"]) r.vis_backends.push_back(b["type"].get<std::string>());
}

void set_env(const Json& t, RunnerOptions& r) {
  const Json& env = t["env_cfg"];
  r.device = env["device"].get<std::string>();
  r.threads = env["threads"].get<int>();
  r.launcher = t["launcher"].get<std::string>();
  r.backend = env["dist_cfg"]["backend"].get<std::string>();
  r.dist_timeout_s = env["dist_cfg"]["timeout"].get<double>();
  r.port = t["dist_params"]["port"].get<int>();
  r.sync_bn = t["sync_bn"] == true || t["sync_bn"] == "torch";
  r.cuda_graph = t["compile"].is_object() || t["compile"] == true;
}

}  // namespace

RunnerOptions runner_options_from_config(const Json& given, const Origins& o) {
  const Json t = complete_run_config(given, o);
  RunnerOptions r;
  r.model = t["model"]["type"].get<std::string>();
  r.model_args = kwargs_at(t["model"], "model", o);
  r.model_wrapper = t["model_wrapper_cfg"]["type"].get<std::string>();
  r.model_wrapper_args = kwargs_at(t["model_wrapper_cfg"], "model_wrapper_cfg", o);
  set_optim(t, o, r);
  set_loop_and_hooks(t, r);
  set_env(t, r);
  r.val_evaluator = specs_of<MetricSpec>(t["val_evaluator"], "val_evaluator", o);
  r.test_evaluator = specs_of<MetricSpec>(t["test_evaluator"], "test_evaluator", o);
  r.custom_hooks = specs_of<HookSpec>(t["custom_hooks"], "custom_hooks", o);
  const std::string work_dir = t["work_dir"].get<std::string>();
  if (!work_dir.empty()) r.work_dir = work_dir;
  r.load_from = t["load_from"].is_null() ? "" : t["load_from"].get<std::string>();
  r.resume = t["resume"].get<bool>() ? "auto" : "";
  r.config_json = t.dump();
  // The keys that decide the sample order and the saved state's meaning (not the data's path).
  r.resume_keys = {"model", "train_dataloader.batch_size", "train_dataloader.dataset.type",
                   "train_dataloader.dataset.indices", "train_dataloader.sampler.shuffle",
                   "train_dataloader.sampler.round_up",
                   t["optim_wrapper"].contains("constructor") ? "optim_wrapper" : "optim_wrapper.optimizer.type",
                   "param_scheduler", "randomness.seed"};
  set_data(t, o, r);
  return r;
}

std::unique_ptr<Runner> runner_from_config(const Json& tree, const Origins& origins) {
  return std::make_unique<Runner>(runner_options_from_config(tree, origins));
}

std::unique_ptr<Runner> Runner::from_config(const std::string& config_json) {
  Json tree = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(!tree.is_discarded() && tree.is_object(), "Runner::from_config: the config is not a JSON object");
  return runner_from_config(merge_onto_defaults(default_run_config(), tree));
}

}  // namespace tandem::train
