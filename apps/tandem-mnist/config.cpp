// tandem-mnist's config schema and its resolution (see config.h).
#include "config.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "mmengine_config.h"
#include "train/py_config.h"
#include "train/models/zoo.h"
#include "train/runner.h"

namespace tandem::app {
namespace {

using train::Json;

const std::map<std::string, std::string>& flag_keys() {
  static const std::map<std::string, std::string> m = {
      {"--data-dir", "data.data_dir"},
      {"--batch-size", "data.batch_size"},
      {"--test-batch-size", "data.test_batch_size"},
      {"--limit", "data.limit"},
      {"--test-limit", "data.test_limit"},
      {"--no-shuffle", "data.shuffle"},
      {"--no-pad", "data.pad"},
      {"--optimizer", "optimizer.type"},
      {"--lr", "optimizer.lr"},
      {"--momentum", "optimizer.momentum"},
      {"--weight-decay", "optimizer.weight_decay"},
      {"--auto-scale-lr", "optimizer.auto_scale_lr_base_batch"},
      {"--lr-schedule", "schedule.type"},
      {"--gamma", "schedule.gamma"},
      {"--amp", "amp"},
      {"--launcher", "ddp.launcher"},
      {"--backend", "ddp.backend"},
      {"--bucket-cap-mb", "ddp.bucket_cap_mb"},
      {"--first-bucket-cap-mb", "ddp.first_bucket_cap_mb"},
      {"--find-unused-parameters", "ddp.find_unused_parameters"},
      {"--gradient-as-bucket-view", "ddp.gradient_as_bucket_view"},
      {"--comm-hook", "ddp.comm_hook"},
      {"--powersgd-rank", "ddp.powersgd_rank"},
      {"--powersgd-start-iter", "ddp.powersgd_start_iter"},
      {"--static-graph", "ddp.static_graph"},
      {"--no-broadcast-buffers", "ddp.broadcast_buffers"},
      {"--sync-bn", "ddp.sync_bn"},
      {"--dist-timeout", "ddp.timeout_s"},
      {"--epochs", "train.epochs"},
      {"--seed", "train.seed"},
      {"--log-interval", "train.log_interval"},
      {"--eval-interval", "train.eval_interval"},
      {"--checkpoint-interval", "train.checkpoint_interval_iters"},
      {"--checkpoint-epochs", "train.checkpoint_interval_epochs"},
      {"--max-keep-ckpts", "train.max_keep_ckpts"},
      {"--cuda-graph", "train.cuda_graph"},
      {"--device", "env.device"},
      {"--threads", "env.threads"},
      {"--init-weights", "load_from"},
      {"--work-dir", "work_dir"},
  };
  return m;
}

template <typename T>
T get(const Json& c, const std::string& key) {
  return train::get_path(c, key).get<T>();
}

void check_choice(const std::string& key, const std::string& value, std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) {
    if (value == c) return;
    list += std::string(list.empty() ? "" : ", ") + c;
  }
  TANDEM_FAIL("config key '", key, "' must be one of ", list, "; got \"", value, "\"");
}

template <typename T>
T at_least(const Json& c, const std::string& key, T minimum) {
  const T v = get<T>(c, key);
  TANDEM_CHECK(v >= minimum, "config key '", key, "' must be >= ", minimum, ", got ", v);
  return v;
}

// A list of {type, ...} objects (custom_hooks, schedule.param_scheduler) as JSON text.
std::string spec_list(const Json& c, const std::string& key) {
  const Json& list = train::get_path(c, key);
  TANDEM_CHECK(list.is_array(), "config key '", key, "' must be a list of objects with a \"type\", got ", list.dump());
  for (const Json& h : list)
    TANDEM_CHECK(h.is_object() && h.contains("type") && h["type"].is_string(), "config key '", key,
                 "' must be a list of objects with a \"type\", got ", h.dump());
  return list.dump();
}

// A top-level key that is neither MMEngine's nor tandem-mnist's own: named with the closest of both.
void check_top_level_key(const std::string& source, const std::string& key, const Json& own_tree) {
  if (is_mmengine_key(key) || own_tree.contains(key)) return;
  std::vector<std::string> all(mmengine_keys().begin(), mmengine_keys().end());
  std::string theirs, ours;
  for (const std::string& k : all) theirs += (theirs.empty() ? "" : ", ") + k;
  for (const auto& [k, v] : own_tree.items()) {
    all.push_back(k);
    ours += (ours.empty() ? "" : ", ") + k;
  }
  const std::string guess = train::closest_key(key, all);
  TANDEM_FAIL(source, ": unknown config key '", key, "'", guess.empty() ? "" : " (did you mean '" + guess + "'?)",
              "; MMEngine's keys: ", theirs, "; Tandem's own: ", ours);
}

}  // namespace

Json options_to_json(const TrainOptions& o) {
  return {
      {"model", {{"type", o.model}}},
      {"data",
       {{"data_dir", o.data_dir}, {"batch_size", o.batch_size}, {"test_batch_size", o.test_batch_size},
        {"limit", o.limit}, {"test_limit", o.test_limit}, {"shuffle", o.shuffle}, {"pad", o.pad}}},
      {"optimizer",
       {{"type", o.optimizer}, {"lr", o.lr}, {"momentum", o.momentum}, {"weight_decay", o.weight_decay},
        {"auto_scale_lr_base_batch", o.auto_scale_lr_base_batch}, {"accumulative_counts", o.accumulative_counts},
        {"clip_grad_max_norm", o.clip_max_norm}, {"clip_grad_norm_type", o.clip_norm_type},
        {"zero_redundancy", o.zero_redundancy}}},
      {"schedule", {{"type", o.lr_schedule}, {"gamma", o.gamma}, {"param_scheduler", Json::parse(o.param_schedulers)}}},
      {"amp", o.amp},
      {"ddp",
       {{"launcher", o.launcher}, {"backend", o.backend}, {"bucket_cap_mb", o.bucket_cap_mb},
        {"first_bucket_cap_mb", o.first_bucket_cap_mb}, {"find_unused_parameters", o.find_unused_parameters},
        {"gradient_as_bucket_view", o.gradient_as_bucket_view}, {"comm_hook", o.comm_hook},
        {"powersgd_rank", o.powersgd_rank}, {"powersgd_start_iter", o.powersgd_start_iter},
        {"sync_bn", o.sync_bn}, {"timeout_s", o.dist_timeout_s}, {"wrapper", o.model_wrapper},
        {"broadcast_buffers", o.broadcast_buffers}, {"static_graph", o.static_graph}, {"port", o.port}}},
      // model_wrapper_cfg's keyword arguments beyond the ddp.* keys (any object; the wrapper checks them).
      {"model_wrapper_extra", o.model_wrapper_extra == "{}" ? Json() : Json::parse(o.model_wrapper_extra)},
      // The model's keyword arguments and a registered dataset (train/models/zoo.h), as written.
      {"model_extra", o.model_extra == "{}" ? Json() : Json::parse(o.model_extra)},
      {"optimizer_extra", o.optimizer_extra == "{}" ? Json() : Json::parse(o.optimizer_extra)},
      {"dataset", o.dataset == "{}" ? Json() : Json::parse(o.dataset)},
      {"train",
       {{"epochs", o.epochs}, {"seed", o.seed}, {"log_interval", o.log_interval},
        {"max_iters", o.max_iters}, {"eval_interval", o.eval_interval}, {"checkpoint_interval_iters", o.checkpoint_interval_iters},
        {"checkpoint_interval_epochs", o.checkpoint_interval_epochs}, {"max_keep_ckpts", o.max_keep_ckpts},
        {"cuda_graph", o.cuda_graph}, {"save_best", o.save_best}, {"vis_backends", o.vis_backends}}},
      {"custom_hooks", Json::parse(o.custom_hooks)},
      {"val_evaluator", Json::parse(o.val_evaluator)},
      {"test_evaluator", Json::parse(o.test_evaluator)},
      {"resume", o.resume_from_config},
      {"env", {{"device", o.device}, {"threads", o.threads}}},
      {"load_from", o.init_weights},
      {"work_dir", o.work_dir},
  };
}

void options_from_json(const Json& c, TrainOptions& o) {
  o.model = get<std::string>(c, "model.type");
  TANDEM_CHECK(train::models().contains(o.model), "config key 'model.type': '", o.model,
               "' is not a registered model (see train/models/zoo.h)");
  o.data_dir = get<std::string>(c, "data.data_dir");
  o.batch_size = at_least<int64_t>(c, "data.batch_size", 1);
  o.test_batch_size = at_least<int64_t>(c, "data.test_batch_size", 1);
  o.limit = at_least<int64_t>(c, "data.limit", 0);
  o.test_limit = at_least<int64_t>(c, "data.test_limit", 0);
  o.shuffle = get<bool>(c, "data.shuffle");
  o.pad = get<bool>(c, "data.pad");
  o.optimizer = get<std::string>(c, "optimizer.type");
  check_choice("optimizer.type", o.optimizer, {"adadelta", "sgd", "adam", "adamw"});
  o.lr = at_least<double>(c, "optimizer.lr", 0.0);
  o.momentum = at_least<double>(c, "optimizer.momentum", 0.0);
  o.weight_decay = at_least<double>(c, "optimizer.weight_decay", 0.0);
  o.auto_scale_lr_base_batch = at_least<int64_t>(c, "optimizer.auto_scale_lr_base_batch", 0);
  o.accumulative_counts = at_least<int64_t>(c, "optimizer.accumulative_counts", 1);
  o.clip_max_norm = at_least<double>(c, "optimizer.clip_grad_max_norm", 0.0);
  o.clip_norm_type = get<double>(c, "optimizer.clip_grad_norm_type");
  o.zero_redundancy = get<bool>(c, "optimizer.zero_redundancy");
  TANDEM_CHECK(o.clip_norm_type >= 1, "config key 'optimizer.clip_grad_norm_type' must be >= 1, got ",
               o.clip_norm_type);
  o.lr_schedule = get<std::string>(c, "schedule.type");
  check_choice("schedule.type", o.lr_schedule, {"step", "cosine", "list"});
  o.param_schedulers = spec_list(c, "schedule.param_scheduler");
  TANDEM_CHECK((o.lr_schedule == "list") == (o.param_schedulers != "[]"), "config key 'schedule.type' is \"",
               o.lr_schedule, "\" but 'schedule.param_scheduler' ", o.param_schedulers == "[]" ? "is empty" : "is not",
               "; schedule.type \"list\" goes with a non-empty schedule.param_scheduler, and only it");
  o.gamma = get<double>(c, "schedule.gamma");
  TANDEM_CHECK(o.gamma > 0, "config key 'schedule.gamma' must be > 0, got ", o.gamma);
  o.amp = get<std::string>(c, "amp");
  check_choice("amp", o.amp, {"off", "fp16", "bf16", "auto"});
  o.launcher = get<std::string>(c, "ddp.launcher");
  check_choice("ddp.launcher", o.launcher, {"none", "pytorch", "slurm", "mpi"});
  o.backend = get<std::string>(c, "ddp.backend");
  check_choice("ddp.backend", o.backend, {"auto", "gloo", "nccl"});
  o.bucket_cap_mb = at_least<double>(c, "ddp.bucket_cap_mb", 0.0);  // 0: auto, measured at start-up
  o.first_bucket_cap_mb = get<double>(c, "ddp.first_bucket_cap_mb");
  TANDEM_CHECK(o.first_bucket_cap_mb > 0, "config key 'ddp.first_bucket_cap_mb' must be > 0, got ",
               o.first_bucket_cap_mb);
  o.find_unused_parameters = get<bool>(c, "ddp.find_unused_parameters");
  o.gradient_as_bucket_view = get<bool>(c, "ddp.gradient_as_bucket_view");
  o.comm_hook = get<std::string>(c, "ddp.comm_hook");
  check_choice("ddp.comm_hook", o.comm_hook, {"allreduce", "fp16", "bf16", "powersgd"});
  o.powersgd_rank = static_cast<int>(at_least<int64_t>(c, "ddp.powersgd_rank", 1));
  o.powersgd_start_iter = at_least<int64_t>(c, "ddp.powersgd_start_iter", 0);
  o.sync_bn = get<bool>(c, "ddp.sync_bn");
  o.model_wrapper = get<std::string>(c, "ddp.wrapper");
  o.broadcast_buffers = get<bool>(c, "ddp.broadcast_buffers");
  o.static_graph = get<bool>(c, "ddp.static_graph");
  o.port = at_least<int>(c, "ddp.port", 0);
  TANDEM_CHECK(o.port <= 65535, "config key 'ddp.port' must be <= 65535, got ", o.port);
  const Json& extra = c.at("model_wrapper_extra");
  TANDEM_CHECK(extra.is_null() || extra.is_object(), "config key 'model_wrapper_cfg' must be an object");
  o.model_wrapper_extra = extra.is_null() ? "{}" : extra.dump();
  for (const auto& [key, field] : {std::pair<const char*, std::string*>{"model_extra", &o.model_extra},
                                   std::pair<const char*, std::string*>{"optimizer_extra", &o.optimizer_extra},
                                   std::pair<const char*, std::string*>{"dataset", &o.dataset}}) {
    const Json& v = c.at(key);
    TANDEM_CHECK(v.is_null() || v.is_object(), "config key '", key, "' must be an object, got ", v.dump());
    *field = v.is_null() ? "{}" : v.dump();
  }
  const Json& ds = c.at("dataset");
  TANDEM_CHECK(ds.is_null() || (ds.contains("type") && ds["type"].is_string() &&
                                train::datasets().contains(ds["type"].get<std::string>())),
               "train_dataloader.dataset.type must name a registered dataset (",
               [] {
                 std::string names;
                 for (const std::string& n : train::datasets().names()) names += (names.empty() ? "" : ", ") + n;
                 return names;
               }(),
               "), got ", ds.dump());
  o.custom_hooks = spec_list(c, "custom_hooks");
  o.val_evaluator = spec_list(c, "val_evaluator");
  o.test_evaluator = spec_list(c, "test_evaluator");
  o.resume_from_config = get<bool>(c, "resume");
  o.dist_timeout_s = get<double>(c, "ddp.timeout_s");
  TANDEM_CHECK(o.dist_timeout_s > 0, "config key 'ddp.timeout_s' must be > 0, got ", o.dist_timeout_s);
  o.epochs = at_least<int64_t>(c, "train.epochs", 1);
  o.max_iters = at_least<int64_t>(c, "train.max_iters", 0);
  o.seed = get<uint64_t>(c, "train.seed");
  o.log_interval = at_least<int64_t>(c, "train.log_interval", 1);
  o.eval_interval = at_least<int64_t>(c, "train.eval_interval", 0);
  o.checkpoint_interval_iters = at_least<int64_t>(c, "train.checkpoint_interval_iters", 0);
  o.checkpoint_interval_epochs = at_least<int64_t>(c, "train.checkpoint_interval_epochs", 0);
  o.max_keep_ckpts = at_least<int64_t>(c, "train.max_keep_ckpts", 0);
  o.cuda_graph = get<bool>(c, "train.cuda_graph");
  o.save_best = get<std::string>(c, "train.save_best");
  if (o.save_best == "auto") o.save_best = "accuracy";
  const Json& vis = train::get_path(c, "train.vis_backends");
  TANDEM_CHECK(vis.is_array() && std::all_of(vis.begin(), vis.end(), [](const Json& v) { return v.is_string(); }),
               "config key 'train.vis_backends' must be a list of vis backend names (LocalVisBackend, "
               "TensorboardVisBackend), got ", vis.dump());
  o.vis_backends = vis.get<std::vector<std::string>>();
  train::check_vis_backends(o.vis_backends, "config key 'train.vis_backends'");
  o.device = get<std::string>(c, "env.device");
  o.threads = at_least<int>(c, "env.threads", 0);
  o.init_weights = get<std::string>(c, "load_from");
  o.work_dir = get<std::string>(c, "work_dir");
}

std::string config_key_of_flag(const std::string& flag) {
  auto it = flag_keys().find(flag);
  return it == flag_keys().end() ? "" : it->second;
}

Json resolve_config(TrainOptions& o) {
  const Json flags = options_to_json(o);  // defaults with the given flags' values
  Json config = options_to_json(TrainOptions{});
  // A file's and --cfg-options' keys of MMEngine's shape are gathered apart and translated onto
  // tandem-mnist's tree; the rest are tandem-mnist's own keys, merged and checked as they are.
  Json mm = Json::object();
  if (!o.config_file.empty()) {
    const std::string source = "config '" + o.config_file + "'";
    Json own = Json::object();
    const Json file = train::load_config_with_bases(o.config_file);
    // A .py config's other top-level names are its variables (data_root = '...'), which MMEngine
    // keeps beside the keys it reads and its Runner ignores: so do we.
    const bool py = o.config_file.size() > 3 && o.config_file.substr(o.config_file.size() - 3) == ".py";
    for (const auto& [key, value] : file.items()) {
      const bool mm_key = is_mmengine_key(key) || key == "model" || key == "work_dir" || key == "load_from";
      if (!mm_key && py && !config.contains(key)) continue;
      check_top_level_key(source, key, config);
      (mm_key ? mm : own)[key] = value;
    }
    config = train::merge_config(config, own, source);
  }
  std::vector<std::string> own_options;
  for (const std::string& a : o.cfg_options) {
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), top = key.substr(0, key.find('.'));
    if (eq != std::string::npos) check_top_level_key("--cfg-options", top, config);
    if (eq == std::string::npos || !is_mmengine_key(top)) {
      own_options.push_back(a);
      continue;
    }
    // JSON as written, else as MMEngine's DictAction reads it (True, None, (0.9,0.999), a,b).
    Json value = Json::parse(a.substr(eq + 1), nullptr, /*allow_exceptions=*/false);
    train::set_path_free(mm, key, value.is_discarded() ? train::parse_cfg_option_value(a.substr(eq + 1)) : value);
  }
  const std::string mm_source = o.config_file.empty() ? "--cfg-options" : "config '" + o.config_file + "'";
  try {  // errors about keys the MMEngine tree set name them as the user wrote them
    config = train::merge_config(config, translate_mmengine(mm, mm_source), mm_source);
    for (const std::string& a : own_options) train::apply_override(config, a);
    for (const std::string& key : o.given_keys) train::set_path(config, key, train::get_path(flags, key), "flag");
    options_from_json(config, o);
  } catch (const Error& e) {
    throw Error(in_mmengine_terms(e.what(), mm), e.where());
  }
  return config;
}

}  // namespace tandem::app
