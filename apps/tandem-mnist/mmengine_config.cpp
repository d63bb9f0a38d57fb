// MMEngine config keys -> tandem-mnist's config tree (see mmengine_config.h).
#include "mmengine_config.h"

#include <algorithm>
#include <set>
#include <vector>

#include "core/error.h"
#include "train/registries.h"
#include "train/runner.h"

namespace tandem::app {
namespace {

using train::Json;

// Throws naming the first key of `obj` outside `known`, as the user wrote it, with the closest known key.
void only(const Json& obj, const std::string& where, std::initializer_list<const char*> known) {
  // `where` is "SOURCE: a.b": the key's path in the user's terms is a.b.KEY.
  const size_t colon = where.rfind(": ");
  const std::string path = colon == std::string::npos ? where : where.substr(colon + 2);
  const std::string source = colon == std::string::npos ? "config" : where.substr(0, colon);
  TANDEM_CHECK(obj.is_object(), where, " must be a dict, got ", obj.dump());
  const std::vector<std::string> names(known.begin(), known.end());
  for (const auto& [key, value] : obj.items()) {
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    const std::string guess = train::closest_key(key, names);
    std::string list;
    for (const std::string& k : names) list += (list.empty() ? "" : ", ") + k;
    TANDEM_FAIL(source, ": unknown key '", path, ".", key, "'",
                guess.empty() ? "" : " (did you mean '" + path + "." + guess + "'?)", "; ", path, " takes ", list);
  }
}

void optim_wrapper(const Json& w, const std::string& src, Json& out) {
  const std::string where = src + ": optim_wrapper";
  only(w, where, {"type", "dtype", "optimizer", "accumulative_counts", "clip_grad", "loss_scale"});
  const std::string type = w.value("type", "OptimWrapper");
  TANDEM_CHECK(type == "OptimWrapper" || type == "AmpOptimWrapper", where, ".type must be OptimWrapper or AmpOptimWrapper, got '", type, "'");
  if (type == "AmpOptimWrapper") {
    const Json dtype = w.value("dtype", Json());
    TANDEM_CHECK(dtype.is_null() || dtype == "float16" || dtype == "bfloat16", where,
                 ".dtype must be float16 or bfloat16, got ", dtype.dump());
    out["amp"] = dtype.is_null() ? "auto" : dtype == "float16" ? "fp16" : "bf16";
  } else {
    out["amp"] = "off";
  }
  TANDEM_CHECK(!w.contains("loss_scale") || w["loss_scale"] == "dynamic", where,
               ".loss_scale: only \"dynamic\" is supported (optim::GradScaler), got ", w["loss_scale"].dump());
  if (w.contains("accumulative_counts")) out["optimizer"]["accumulative_counts"] = w["accumulative_counts"];
  if (w.contains("clip_grad") && !w["clip_grad"].is_null()) {
    const Json& c = w["clip_grad"];
    only(c, where + ".clip_grad", {"max_norm", "norm_type"});
    TANDEM_CHECK(c.contains("max_norm"), where, ".clip_grad needs max_norm");
    out["optimizer"]["clip_grad_max_norm"] = c["max_norm"];
    if (c.contains("norm_type")) out["optimizer"]["clip_grad_norm_type"] = c["norm_type"];
  }
  if (w.contains("optimizer")) {
    const Json& o = w["optimizer"];
    static const std::map<std::string, std::string> names = {
        {"Adadelta", "adadelta"}, {"SGD", "sgd"}, {"Adam", "adam"}, {"AdamW", "adamw"}};
    std::string t = o.value("type", "Adadelta");
    // MMEngine's ZeroRedundancyOptimizer wraps optimizer_type (the optimizer it shards).
    const bool zero = t == "ZeroRedundancyOptimizer";
    if (zero) {
      TANDEM_CHECK(o.contains("optimizer_type") && o["optimizer_type"].is_string(), where,
                   ".optimizer type ZeroRedundancyOptimizer needs optimizer_type (Adadelta, SGD, Adam or AdamW)");
      t = o["optimizer_type"].get<std::string>();
    } else {
      TANDEM_CHECK(!o.contains("optimizer_type"), where, ".optimizer.optimizer_type is only for type "
                   "ZeroRedundancyOptimizer, not '", t, "'");
    }
    auto it = names.find(t);
    TANDEM_CHECK(it != names.end(), where, zero ? ".optimizer.optimizer_type" : ".optimizer.type",
                 " must be Adadelta, SGD, Adam or AdamW", zero ? "" : " (or ZeroRedundancyOptimizer)", ", got '", t,
                 "'");
    out["optimizer"]["type"] = it->second;
    out["optimizer"]["zero_redundancy"] = zero;
    for (const auto& [k, v] : o.items()) {  // beyond lr, momentum, weight_decay: checked by the optimizer
      if (k == "lr" || k == "momentum" || k == "weight_decay")
        out["optimizer"][k] = v;
      else if (k != "type" && k != "optimizer_type")
        out["optimizer_extra"][k] = v;
    }
  }
}

// A single scheduler of the shape tandem-mnist's schedule.type names: "step" (StepLR per epoch,
// step_size 1), "cosine" (CosineAnnealingLR per iteration over the whole run to 0), else "".
std::string named_schedule(const Json& s) {
  static const std::set<std::string> step_keys = {"type", "by_epoch", "step_size", "gamma"};
  static const std::set<std::string> cosine_keys = {"type", "by_epoch", "eta_min", "convert_to_iter_based"};
  const std::string type = s.value("type", "");
  const auto only_keys = [&](const std::set<std::string>& keys) {
    return std::all_of(s.items().begin(), s.items().end(), [&](const auto& kv) { return keys.count(kv.key()) > 0; });
  };
  if (type == "StepLR" && only_keys(step_keys) && s.value("by_epoch", true) && s.value("step_size", Json(1)) == 1)
    return "step";
  const bool per_iteration = !s.value("by_epoch", true) || s.value("convert_to_iter_based", false);
  if (type == "CosineAnnealingLR" && only_keys(cosine_keys) && per_iteration && s.value("eta_min", Json(0)) == 0)
    return "cosine";
  return "";
}

// One scheduler of the named shapes goes to schedule.type (as configs always resolved); anything
// else, or several, to schedule.param_scheduler as written (the Runner's registry checks them).
void param_scheduler(Json s, const std::string& src, Json& out) {
  const std::string where = src + ": param_scheduler";
  if (!s.is_array()) s = Json::array({s});
  for (size_t i = 0; i < s.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    TANDEM_CHECK(s[i].is_object() && s[i].contains("type") && s[i]["type"].is_string(), at,
                 " must be an object with a \"type\", got ", s[i].dump());
    const std::string type = s[i]["type"].get<std::string>();
    if (!train::param_schedulers().contains(type)) {
      std::string known;
      for (const std::string& n : train::param_schedulers().names()) known += (known.empty() ? "" : ", ") + n;
      TANDEM_FAIL(at, ".type '", type, "' is not a registered param scheduler (registered: ", known, ")");
    }
  }
  const std::string named = s.size() == 1 ? named_schedule(s[0]) : "";
  if (!named.empty()) {
    out["schedule"]["type"] = named;
    if (named == "step" && s[0].contains("gamma")) out["schedule"]["gamma"] = s[0]["gamma"];
    return;
  }
  out["schedule"]["type"] = "list";
  out["schedule"]["param_scheduler"] = s;
}

void default_hooks(const Json& h, const std::string& src, Json& out) {
  const std::string where = src + ": default_hooks";
  static const std::map<std::string, std::string> types = {
      {"timer", "IterTimerHook"}, {"logger", "LoggerHook"}, {"param_scheduler", "ParamSchedulerHook"},
      {"checkpoint", "CheckpointHook"}, {"sampler_seed", "DistSamplerSeedHook"}, {"visualization", ""}};
  for (const auto& [name, spec] : h.items()) {
    auto it = types.find(name);
    TANDEM_CHECK(it != types.end(), where, ": unknown hook '", name,
                 "' (known: timer, logger, param_scheduler, checkpoint, sampler_seed, visualization)");
    if (spec.is_null() || it->second.empty()) continue;
    TANDEM_CHECK(spec.value("type", it->second) == it->second, where, ".", name, ".type must be ", it->second);
    if (name == "logger") {
      only(spec, where + ".logger", {"type", "interval"});
      if (spec.contains("interval")) out["train"]["log_interval"] = spec["interval"];
    } else if (name == "checkpoint") {
      only(spec, where + ".checkpoint", {"type", "interval", "by_epoch", "max_keep_ckpts", "save_best", "rule", "save_last"});
      if (spec.contains("interval"))
        out["train"][spec.value("by_epoch", true) ? "checkpoint_interval_epochs" : "checkpoint_interval_iters"] =
            spec["interval"];
      if (spec.contains("max_keep_ckpts")) out["train"]["max_keep_ckpts"] = std::max<int64_t>(0, spec["max_keep_ckpts"].get<int64_t>());
      if (spec.contains("save_best") && !spec["save_best"].is_null()) out["train"]["save_best"] = spec["save_best"];
    }
  }
}

// MMEngine's visualizer: its vis_backends (a list of {type} dicts, one dict, or none) as
// train.vis_backends; the type (Visualizer, or a downstream one such as DetLocalVisualizer) only
// draws images, which Tandem's Runner does not, so any *Visualizer is taken.
void visualizer(const Json& v, const std::string& src, Json& out) {
  const std::string where = src + ": visualizer";
  only(v, where, {"type", "name", "vis_backends"});
  const std::string type = v.value("type", "Visualizer");
  TANDEM_CHECK(type.size() >= 10 && type.compare(type.size() - 10, 10, "Visualizer") == 0, where, ".type must be ",
               "Visualizer (or a downstream *Visualizer), got '", type, "'");
  Json list = v.value("vis_backends", Json::array());
  if (list.is_object()) list = Json::array({list});
  TANDEM_CHECK(list.is_array(), where, ".vis_backends must be a list of dicts with a type, got ", list.dump());
  std::vector<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + ".vis_backends[" + std::to_string(i) + "]";
    TANDEM_CHECK(list[i].is_object() && list[i].contains("type") && list[i]["type"].is_string(), at,
                 " must be a dict with a type (LocalVisBackend or TensorboardVisBackend), got ", list[i].dump());
    only(list[i], at, {"type"});
    names.push_back(list[i]["type"].get<std::string>());
  }
  train::check_vis_backends(names, where + ".vis_backends");
  out["train"]["vis_backends"] = names;
}

void data(const Json& mm, const std::string& src, Json& out) {
  if (mm.contains("train_dataloader")) {
    const Json& d = mm["train_dataloader"];
    only(d, src + ": train_dataloader", {"batch_size", "dataset", "sampler", "num_workers", "persistent_workers"});
    if (d.contains("batch_size")) out["data"]["batch_size"] = d["batch_size"];
    if (d.contains("sampler")) {
      out["data"]["shuffle"] = d["sampler"].value("shuffle", true);
      out["data"]["pad"] = d["sampler"].value("round_up", true);  // MMEngine's DefaultSampler
    }
    // type MNIST: the IDX files of data_root, as data.data_dir (the --data-dir and --limit flags
    // apply); another type: a registered dataset (train/models/zoo.h) built from its dict as written.
    if (d.contains("dataset") && d["dataset"].value("type", "MNIST") != "MNIST") {
      out["dataset"] = d["dataset"];
    } else if (d.contains("dataset")) {
      only(d["dataset"], src + ": train_dataloader.dataset", {"type", "data_root", "indices"});
      if (d["dataset"].contains("data_root")) out["data"]["data_dir"] = d["dataset"]["data_root"];
      if (d["dataset"].contains("indices")) out["data"]["limit"] = d["dataset"]["indices"];
    }
  }
  if (mm.contains("val_dataloader")) {
    const Json& d = mm["val_dataloader"];
    only(d, src + ": val_dataloader", {"batch_size", "dataset", "sampler", "num_workers", "persistent_workers"});
    if (d.contains("batch_size")) out["data"]["test_batch_size"] = d["batch_size"];
    if (d.contains("dataset") && d["dataset"].contains("indices")) out["data"]["test_limit"] = d["dataset"]["indices"];
  }
}

void dist_and_env(const Json& mm, const std::string& src, Json& out) {
  if (mm.contains("model_wrapper_cfg")) {
    const Json& w = mm["model_wrapper_cfg"];
    TANDEM_CHECK(w.is_object(), src, ": model_wrapper_cfg must be an object");
    Json extra = Json::object();
    static const std::set<std::string> flagged = {"find_unused_parameters", "bucket_cap_mb", "first_bucket_cap_mb",
                                                  "gradient_as_bucket_view", "comm_hook", "broadcast_buffers",
                                                  "static_graph", "powersgd_rank", "powersgd_start_iter"};
    for (const auto& [k, v] : w.items()) {
      if (k == "type")
        out["ddp"]["wrapper"] = v;
      else if (flagged.count(k))
        out["ddp"][k] = v;
      else
        extra[k] = v;  // checked by the wrapper (train::ddp_options_from_kwargs for DDP)
    }
    if (!extra.empty()) out["model_wrapper_extra"] = extra;
  }
  if (mm.contains("env_cfg")) {
    const Json& e = mm["env_cfg"];
    only(e, src + ": env_cfg", {"cudnn_benchmark", "mp_cfg", "dist_cfg"});
    if (e.contains("dist_cfg")) {
      only(e["dist_cfg"], src + ": env_cfg.dist_cfg", {"backend", "timeout"});
      if (e["dist_cfg"].contains("backend")) out["ddp"]["backend"] = e["dist_cfg"]["backend"];
      if (e["dist_cfg"].contains("timeout")) out["ddp"]["timeout_s"] = e["dist_cfg"]["timeout"];
    }
  }
  if (mm.contains("dist_params")) {
    const Json& d = mm["dist_params"];
    only(d, src + ": dist_params", {"backend", "port"});
    if (d.contains("backend")) out["ddp"]["backend"] = d["backend"];
    if (d.contains("port")) out["ddp"]["port"] = d["port"];
  }
  if (mm.contains("launcher")) out["ddp"]["launcher"] = mm["launcher"];
}

const std::vector<std::pair<std::string, std::string>>& mmengine_sources() {
  // (tandem-mnist key, the MMEngine key translate_mmengine copies into it unchanged)
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"train.epochs", "train_cfg.max_epochs"},
      {"train.max_iters", "train_cfg.max_iters"},
      {"train.eval_interval", "train_cfg.val_interval"},
      {"train.log_interval", "default_hooks.logger.interval"},
      {"train.max_keep_ckpts", "default_hooks.checkpoint.max_keep_ckpts"},
      {"train.save_best", "default_hooks.checkpoint.save_best"},
      {"train.seed", "randomness.seed"},
      {"data.batch_size", "train_dataloader.batch_size"},
      {"data.test_batch_size", "val_dataloader.batch_size"},
      {"data.data_dir", "train_dataloader.dataset.data_root"},
      {"data.limit", "train_dataloader.dataset.indices"},
      {"data.test_limit", "val_dataloader.dataset.indices"},
      {"optimizer.lr", "optim_wrapper.optimizer.lr"},
      {"optimizer.momentum", "optim_wrapper.optimizer.momentum"},
      {"optimizer.weight_decay", "optim_wrapper.optimizer.weight_decay"},
      {"optimizer.accumulative_counts", "optim_wrapper.accumulative_counts"},
      {"optimizer.clip_grad_max_norm", "optim_wrapper.clip_grad.max_norm"},
      {"optimizer.clip_grad_norm_type", "optim_wrapper.clip_grad.norm_type"},
      {"ddp.timeout_s", "env_cfg.dist_cfg.timeout"},
      {"ddp.port", "dist_params.port"},
      {"ddp.launcher", "launcher"},
  };
  return table;
}

}  // namespace

std::string in_mmengine_terms(const std::string& message, const Json& mm) {
  std::string out = message;
  for (const auto& [own, theirs] : mmengine_sources()) {
    const Json* at = &mm;
    for (size_t begin = 0; at && begin <= theirs.size();) {  // does the user's config hold `theirs`?
      const size_t dot = std::min(theirs.find('.', begin), theirs.size());
      const std::string part = theirs.substr(begin, dot - begin);
      at = at->is_object() && at->contains(part) ? &(*at)[part] : nullptr;
      begin = dot + 1;
    }
    const std::string quoted = "'" + own + "'";
    if (at == nullptr) continue;
    for (size_t pos = out.find(quoted); pos != std::string::npos; pos = out.find(quoted, pos + theirs.size() + 2))
      out.replace(pos, quoted.size(), "'" + theirs + "'");
  }
  return out;
}

const std::set<std::string>& mmengine_keys() {
  static const std::set<std::string> keys = {
      "model_wrapper_cfg", "optim_wrapper", "param_scheduler", "train_cfg", "val_cfg", "test_cfg",
      "default_hooks", "custom_hooks", "env_cfg", "dist_params", "auto_scale_lr", "randomness",
      "train_dataloader", "val_dataloader", "val_evaluator", "test_evaluator", "launcher", "resume", "compile",
      "default_scope", "log_level", "log_processor", "visualizer", "_base_"};
  return keys;
}

bool is_mmengine_key(const std::string& k) { return mmengine_keys().count(k) > 0; }

Json translate_mmengine(const Json& mm, const std::string& src) {
  Json out = Json::object();
  if (mm.contains("model")) {
    const Json& m = mm["model"];
    TANDEM_CHECK(m.is_object(), src, ": model must be a dict with a type, got ", m.dump());
    for (const auto& [key, value] : m.items()) {  // the rest: the model's keyword arguments
      if (key == "type")
        out["model"]["type"] = value;
      else
        out["model_extra"][key] = value;
    }
  }
  for (const char* k : {"work_dir", "load_from"})
    if (mm.contains(k)) out[k] = mm[k].is_null() ? Json("") : mm[k];
  if (mm.contains("optim_wrapper")) optim_wrapper(mm["optim_wrapper"], src, out);
  if (mm.contains("param_scheduler")) param_scheduler(mm["param_scheduler"], src, out);
  if (mm.contains("train_cfg")) {
    const Json& t = mm["train_cfg"];
    only(t, src + ": train_cfg", {"type", "by_epoch", "max_epochs", "max_iters", "val_interval", "val_begin"});
    const std::string loop = t.value("type", t.value("by_epoch", true) ? "EpochBasedTrainLoop" : "IterBasedTrainLoop");
    TANDEM_CHECK(loop == "EpochBasedTrainLoop" || loop == "IterBasedTrainLoop", src, ": train_cfg.type must be ",
                 "EpochBasedTrainLoop or IterBasedTrainLoop, got '", loop, "'");
    TANDEM_CHECK(t.value("by_epoch", loop == "EpochBasedTrainLoop") == (loop == "EpochBasedTrainLoop"), src,
                 ": train_cfg.by_epoch contradicts train_cfg.type '", loop, "'");
    if (loop == "IterBasedTrainLoop") {
      TANDEM_CHECK(t.contains("max_iters") && !t.contains("max_epochs"), src, ": train_cfg by_epoch=False counts ",
                   "iterations: give max_iters (and no max_epochs)");
      out["train"]["max_iters"] = t["max_iters"];
    } else {
      TANDEM_CHECK(!t.contains("max_iters"), src, ": train_cfg.max_iters needs by_epoch=False (IterBasedTrainLoop)");
    }
    if (t.contains("max_epochs")) out["train"]["epochs"] = t["max_epochs"];
    if (t.contains("val_interval")) out["train"]["eval_interval"] = t["val_interval"];
  }
  if (mm.contains("default_hooks")) default_hooks(mm["default_hooks"], src, out);
  if (mm.contains("visualizer") && !mm["visualizer"].is_null()) visualizer(mm["visualizer"], src, out);
  if (mm.contains("custom_hooks")) out["custom_hooks"] = mm["custom_hooks"];
  for (const char* key : {"val_evaluator", "test_evaluator"})  // one metric or a list, as MMEngine's
    if (mm.contains(key)) out[key] = mm[key].is_array() ? mm[key] : Json::array({mm[key]});
  data(mm, src, out);
  dist_and_env(mm, src, out);
  if (mm.contains("auto_scale_lr")) {
    const Json& a = mm["auto_scale_lr"];
    only(a, src + ": auto_scale_lr", {"enable", "base_batch_size"});
    out["optimizer"]["auto_scale_lr_base_batch"] = a.value("enable", false) ? a.value("base_batch_size", 0) : 0;
  }
  if (mm.contains("randomness")) {
    const Json& r = mm["randomness"];
    only(r, src + ": randomness", {"seed", "deterministic", "diff_rank_seed"});
    TANDEM_CHECK(!r.value("diff_rank_seed", false), src, ": randomness.diff_rank_seed: every rank uses one seed here");
    if (r.contains("seed") && !r["seed"].is_null()) out["train"]["seed"] = r["seed"];
  }
  if (mm.contains("resume")) out["resume"] = mm["resume"];
  if (mm.contains("compile")) out["train"]["cuda_graph"] = mm["compile"].is_boolean() ? mm["compile"] : Json(true);
  return out;
}

}  // namespace tandem::app
