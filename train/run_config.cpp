// Loading a job's config tree (see run_config.h): defaults <- file <- --cfg-options <- flags, and
// the one translation of Tandem's former own-shape keys into MMEngine's.
#include "train/run_config.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "train/py_config.h"

namespace tandem::train {
namespace {

// Records `source` as the origin of `path` and of every key under it.
void record_origins(const Json& value, const std::string& path, const std::string& source, Origins& out) {
  if (!path.empty()) out[path] = source;
  if (!value.is_object()) return;
  for (const auto& [key, v] : value.items()) record_origins(v, path.empty() ? key : path + "." + key, source, out);
}

using Translate = std::function<void(const Json& value, Json& out)>;

// Sets `value` at a dotted MMEngine path of `out` (creating dicts on the way).
Translate to(const std::string& path) {
  return [path](const Json& v, Json& out) { set_path_free(out, path, v); };
}

// A first-N limit: 0 (all) is the key left out.
Translate all_or(const std::string& path) {
  return [path](const Json& v, Json& out) {
    if (v != Json(0)) set_path_free(out, path, v);
  };
}

// The former own-shape keys and what each becomes. A key absent here is refused naming the nearest.
const std::map<std::string, Translate>& own_keys() {
  static const std::map<std::string, Translate> table = {
      {"data.data_dir",
       [](const Json& v, Json& out) {
         set_path_free(out, "train_dataloader.dataset.data_root", v);
         set_path_free(out, "val_dataloader.dataset.data_root", v);
       }},
      {"data.batch_size", to("train_dataloader.batch_size")},
      {"data.test_batch_size", to("val_dataloader.batch_size")},
      {"data.limit", all_or("train_dataloader.dataset.indices")},
      {"data.test_limit", all_or("val_dataloader.dataset.indices")},
      {"data.shuffle", to("train_dataloader.sampler.shuffle")},
      {"data.pad", to("train_dataloader.sampler.round_up")},
      {"optimizer.type",
       [](const Json& v, Json& out) {
         const std::string t = v.is_string() ? v.get<std::string>() : v.dump();
         const std::string name = registered_optimizer_name(t);
         set_path_free(out, "optim_wrapper.optimizer.type", name.empty() ? v : Json(name));
       }},
      {"optimizer.lr", to("optim_wrapper.optimizer.lr")},
      {"optimizer.momentum", to("optim_wrapper.optimizer.momentum")},
      {"optimizer.weight_decay", to("optim_wrapper.optimizer.weight_decay")},
      {"optimizer.accumulative_counts", to("optim_wrapper.accumulative_counts")},
      {"optimizer.clip_grad_max_norm",
       [](const Json& v, Json& out) {
         if (v != Json(0) && v != Json(0.0)) set_path_free(out, "optim_wrapper.clip_grad.max_norm", v);
       }},
      {"optimizer.clip_grad_norm_type", to("optim_wrapper.clip_grad.norm_type")},
      {"optimizer.zero_redundancy",
       [](const Json& v, Json&) {
         TANDEM_CHECK(v == false, "config key 'optimizer.zero_redundancy' is now optim_wrapper.optimizer.type "
                      "'ZeroRedundancyOptimizer' with optimizer_type the optimizer it shards (e.g. 'SGD'); write that");
       }},
      {"optimizer.auto_scale_lr_base_batch",
       [](const Json& v, Json& out) {
         const bool on = v.is_number() && v.get<double>() > 0;
         set_path_free(out, "auto_scale_lr.enable", on);
         if (on) set_path_free(out, "auto_scale_lr.base_batch_size", v);
       }},
      {"schedule.type",
       [](const Json& v, Json& out) {
         if (v == "step") out["param_scheduler"] = {{"type", "StepLR"}, {"by_epoch", true}, {"step_size", 1}};
         if (v == "cosine") out["param_scheduler"] = {{"type", "CosineAnnealingLR"}, {"by_epoch", false}};
         TANDEM_CHECK(v == "step" || v == "cosine" || v == "list", "config key 'schedule.type' (now param_scheduler) "
                      "must be one of step, cosine, list; got ", v.dump());
       }},
      {"schedule.gamma", to("param_scheduler.gamma")},
      {"schedule.param_scheduler", to("param_scheduler")},
      {"amp",
       [](const Json& v, Json& out) {
         TANDEM_CHECK(v == "off" || v == "fp16" || v == "bf16" || v == "auto", "config key 'amp' (now "
                      "optim_wrapper.type and dtype) must be one of off, fp16, bf16, auto; got ", v.dump());
         out["optim_wrapper"]["type"] = v == "off" ? "OptimWrapper" : "AmpOptimWrapper";
         out["optim_wrapper"]["dtype"] = v == "fp16" ? Json("float16") : v == "bf16" ? Json("bfloat16") : Json();
       }},
      {"ddp.launcher", to("launcher")},
      {"ddp.backend", to("env_cfg.dist_cfg.backend")},
      {"ddp.timeout_s", to("env_cfg.dist_cfg.timeout")},
      {"ddp.port", to("dist_params.port")},
      {"ddp.sync_bn", [](const Json& v, Json& out) { out["sync_bn"] = v == true ? Json("torch") : Json(); }},
      {"ddp.wrapper", to("model_wrapper_cfg.type")},
      {"train.epochs", to("train_cfg.max_epochs")},
      {"train.max_iters",
       [](const Json& v, Json& out) {
         if (v == Json(0)) return;
         out["train_cfg"]["type"] = "IterBasedTrainLoop";
         out["train_cfg"]["max_iters"] = v;
       }},
      {"train.seed", to("randomness.seed")},
      {"train.log_interval", to("default_hooks.logger.interval")},
      {"train.eval_interval", to("train_cfg.val_interval")},
      {"train.checkpoint_interval_iters", to("default_hooks.checkpoint.interval_iters")},
      {"train.checkpoint_interval_epochs", to("default_hooks.checkpoint.interval")},
      {"train.max_keep_ckpts", to("default_hooks.checkpoint.max_keep_ckpts")},
      {"train.cuda_graph", to("compile")},
      {"train.save_best",
       [](const Json& v, Json& out) { set_path_free(out, "default_hooks.checkpoint.save_best", v == "" ? Json() : v); }},
      {"train.vis_backends",
       [](const Json& v, Json& out) {
         Json list = Json::array();
         for (const Json& name : v.is_array() ? v : Json::array({v})) list.push_back({{"type", name}});
         out["visualizer"]["vis_backends"] = list;
       }},
      {"env.device", to("env_cfg.device")},
      {"env.threads", to("env_cfg.threads")},
  };
  return table;
}

// Own-shape keys whose whole dict maps onto an MMEngine dict (their keys go there as written).
const std::map<std::string, std::string>& own_dicts() {
  static const std::map<std::string, std::string> m = {{"model_extra", "model"},
                                                       {"optimizer_extra", "optim_wrapper.optimizer"},
                                                       {"model_wrapper_extra", "model_wrapper_cfg"},
                                                       {"dataset", "train_dataloader.dataset"}};
  return m;
}

// The DDP keywords of the former ddp section, which keep their names under model_wrapper_cfg.
bool is_ddp_keyword(const std::string& key) {
  for (const char* k : {"bucket_cap_mb", "first_bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view",
                        "comm_hook", "powersgd_rank", "powersgd_start_iter", "broadcast_buffers", "static_graph"})
    if (key == k) return true;
  return false;
}

[[noreturn]] void unknown_own_key(const std::string& path, const std::string& source) {
  std::vector<std::string> known;
  for (const auto& [k, f] : own_keys()) known.push_back(k);
  const std::string guess = closest_key(path, known);
  TANDEM_FAIL(source, ": unknown config key '", path, "'", guess.empty() ? "" : " (did you mean '" + guess + "'?)",
              "; this is Tandem's former own shape, read as MMEngine's keys (e.g. optimizer.lr is "
              "optim_wrapper.optimizer.lr): write the MMEngine key (docs/training.md)");
}

void translate_leaf(const std::string& path, const Json& v, const std::string& source, Json& out) {
  auto it = own_keys().find(path);
  if (it != own_keys().end()) return it->second(v, out);
  const std::string section = path.substr(0, path.find('.'));
  if (section == "ddp" && is_ddp_keyword(path.substr(4))) return set_path_free(out, "model_wrapper_cfg." + path.substr(4), v);
  unknown_own_key(path, source);
}

void translate_tree(const Json& own, const std::string& prefix, const std::string& source, Json& out) {
  for (const auto& [key, v] : own.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (prefix.empty() && own_dicts().count(key)) {
      if (v.is_null()) continue;
      TANDEM_CHECK(v.is_object(), source, ": config key '", key, "' (now ", own_dicts().at(key),
                   ") must be a dict, got ", v.dump());
      for (const auto& [k, x] : v.items()) set_path_free(out, own_dicts().at(key) + "." + k, x);
    } else if (v.is_object() && !own_keys().count(path) && !(prefix == "ddp" && is_ddp_keyword(key))) {
      translate_tree(v, path, source, out);
    } else {
      translate_leaf(path, v, source, out);
    }
  }
}

// One file's tree as MMEngine keys: its own-shape keys translated, a .py file's variables dropped.
Json file_tree(const std::string& file) {
  const Json raw = load_config_with_bases(file);
  const std::string source = "config '" + file + "'";
  TANDEM_CHECK(raw.is_object(), source, ": a config must be a dict of keys");
  const bool py = file.size() > 3 && file.substr(file.size() - 3) == ".py";
  Json kept = Json::object();
  for (const auto& [key, value] : raw.items())
    if (!py || is_own_schema_key(key) || is_run_config_key(key)) kept[key] = value;
  return translate_own_schema(kept, source);
}

}  // namespace

Json merge_onto_defaults(const Json& defaults, const Json& file) {
  Json out = merge_inherited(defaults, file);
  for (const char* path : {"model", "model_wrapper_cfg", "optim_wrapper.optimizer", "param_scheduler",
                           "train_dataloader.dataset"}) {
    std::string pointer = std::string("/") + path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    const Json::json_pointer at(pointer);
    if (!file.contains(at) || !defaults.contains(at)) continue;
    const Json& mine = file.at(at);
    if (mine.is_object() && mine.contains("type") && mine["type"] != defaults.at(at).value("type", Json()))
      out[at] = mine;
  }
  // Several optimizers (MultiOptimWrapperConstructor): the file's wrappers and per-wrapper
  // schedules (a dict without a type), nothing of the default's.
  if (file.contains("optim_wrapper") && file["optim_wrapper"].is_object() && file["optim_wrapper"].contains("constructor"))
    out["optim_wrapper"] = file["optim_wrapper"];
  if (file.contains("param_scheduler") && file["param_scheduler"].is_object() && !file["param_scheduler"].contains("type"))
    out["param_scheduler"] = file["param_scheduler"];
  return out;
}

bool is_own_schema_key(const std::string& k) {
  for (const char* own : {"train", "ddp", "data", "optimizer", "schedule", "env", "amp", "model_extra",
                          "optimizer_extra", "model_wrapper_extra", "dataset"})
    if (k == own) return true;
  return false;
}

std::string registered_optimizer_name(const std::string& lower) {
  static const std::map<std::string, std::string> names = {
      {"adadelta", "Adadelta"}, {"sgd", "SGD"}, {"adam", "Adam"}, {"adamw", "AdamW"}};
  const auto it = names.find(lower);
  return it == names.end() ? "" : it->second;
}

Json translate_own_schema(const Json& tree, const std::string& source) {
  Json own = Json::object(), mm = Json::object();  // MMEngine's keys pass as they are
  for (const auto& [key, value] : tree.items()) (is_own_schema_key(key) ? own : mm)[key] = value;
  Json out = Json::object();
  // schedule.type first (it replaces the scheduler), then the keys that refine it.
  if (own.contains("schedule") && own["schedule"].is_object() && own["schedule"].contains("type"))
    translate_leaf("schedule.type", own["schedule"]["type"], source, out);
  Json rest = own;
  if (rest.contains("schedule") && rest["schedule"].is_object()) {
    const Json type = rest["schedule"].value("type", Json("step"));
    rest["schedule"].erase("type");
    if (type != "step") rest["schedule"].erase("gamma");  // only StepLR has a gamma
    if (type != "list") rest["schedule"].erase("param_scheduler");  // the list goes with type list only
  }
  if (rest.contains("optimizer") && rest["optimizer"].is_object()) {  // a norm type without clipping: off
    Json& opt = rest["optimizer"];
    const Json norm = opt.value("clip_grad_max_norm", Json(0));
    if (norm == Json(0) || norm == Json(0.0)) opt.erase("clip_grad_norm_type");
    // momentum was SGD's only: another optimizer's zero is dropped (a non-zero one is refused by its schema).
    if (opt.contains("type") && opt["type"] != "sgd" && opt.value("momentum", Json(0)) == Json(0)) opt.erase("momentum");
  }
  translate_tree(rest, "", source, out);
  return merge_inherited(mm, out);
}

Json default_run_config() {
  static const Json tree = Json::parse(R"({
    "model": {"type": "MnistNet"},
    "model_wrapper_cfg": {"type": "MMDistributedDataParallel"},
    "optim_wrapper": {"type": "OptimWrapper", "optimizer": {"type": "Adadelta", "lr": 1.0}},
    "param_scheduler": {"type": "StepLR", "by_epoch": true, "step_size": 1, "gamma": 0.7},
    "train_cfg": {"type": "EpochBasedTrainLoop"},
    "train_dataloader": {"dataset": {"type": "MNIST", "data_root": "/usr/share/datasets/fashion-mnist"}},
    "val_evaluator": [],
    "test_evaluator": [],
    "custom_hooks": []
  })");
  return tree;
}

LoadedConfig load_run_config(const std::string& file, const std::vector<std::string>& cfg_options,
                             const std::vector<FlagSetting>& flags) {
  LoadedConfig c{default_run_config(), {}};
  if (!file.empty()) {
    const Json mm = file_tree(file);
    record_origins(mm, "", "config '" + file + "'", c.origins);
    c.tree = merge_onto_defaults(c.tree, mm);
  }
  for (const std::string& a : cfg_options) {
    const size_t eq = a.find('=');
    TANDEM_CHECK(eq != std::string::npos && eq > 0, "--cfg-options: expected KEY=VALUE (e.g. "
                 "optim_wrapper.optimizer.lr=0.5), got '", a, "'");
    const std::string key = a.substr(0, eq), text = a.substr(eq + 1);
    // JSON as written, else as MMEngine's DictAction reads it (True, None, (0.9,0.999), a,b), else the text.
    Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) {
      try {
        value = parse_cfg_option_value(text);
      } catch (const Error&) {
        value = text;
      }
    }
    Json part = Json::object();
    try {  // a string key takes the text as written ("work_dir=123" is the string "123")
      if (!value.is_string() && get_path(c.tree, key).is_string()) value = text;
    } catch (const Error&) {
    }
    set_path_free(part, key, value);
    if (is_own_schema_key(key.substr(0, key.find('.')))) part = translate_own_schema(part, "--cfg-options");
    record_origins(part, "", "--cfg-options", c.origins);
    c.tree = merge_inherited(c.tree, part);
  }
  for (const FlagSetting& f : flags) {
    set_path_free(c.tree, f.path, f.value);
    record_origins(f.value, f.path, f.flag, c.origins);
  }
  return c;
}

}  // namespace tandem::train
