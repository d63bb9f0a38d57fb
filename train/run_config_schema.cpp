// The top-level sections' schemas and complete_run_config (see run_config.h): each section's keys
// checked once against its schema and its defaults filled in; the registered types' dicts (model,
// model_wrapper_cfg, optim_wrapper.optimizer, param_scheduler, custom_hooks, evaluators, datasets)
// checked against the type's own schema when it has one.
#include <algorithm>

#include "core/error.h"
#include "train/evaluator.h"
#include "train/hooks/builtin_hooks.h"
#include "train/models/zoo.h"
#include "train/optim_wrapper.h"
#include "train/registries.h"
#include "train/run_config.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

ArgSpec fixed_type(const std::string& type) { return arg_string("type", type, {type}, "the hook's type"); }
ArgSpec accepted(const std::string& key, ArgKind kind, const std::string& doc) { return arg_of(key, kind, "", doc); }

// default_hooks.<name>: the registered hook's own schema with its type fixed and the Runner's
// defaults (`defaults`: key -> JSON text) in place of the hook's.
Schema hook_section(const std::string& type, const std::map<std::string, std::string>& defaults = {}) {
  Schema s = {fixed_type(type)};
  for (ArgSpec a : *hooks().schema(type)) {
    if (defaults.count(a.key)) a.default_json = defaults.at(a.key);
    s.push_back(a);
  }
  return s;
}

std::string text(int64_t v) { return std::to_string(v); }

// optim_wrapper: its type, then AmpOptimWrapper's schema (OptimWrapper's keys and dtype, loss_scale;
// dtype and loss_scale are checked against the type below).
Schema optim_wrapper_section() {
  Schema s = {arg_string("type", "OptimWrapper", optim_wrappers().names(), "AmpOptimWrapper: mixed precision")};
  for (const ArgSpec& a : *optim_wrappers().schema("AmpOptimWrapper")) s.push_back(a);
  return s;
}

// The defaults are RunnerOptions' (train/runner.h), the one place they live.
std::vector<std::pair<std::string, Schema>> make_sections() {
  const char* loops = "EpochBasedTrainLoop or IterBasedTrainLoop";
  const RunnerOptions d;
  std::string vis;
  for (const std::string& b : d.vis_backends) vis += (vis.empty() ? "" : ", ") + Json{{"type", b}}.dump();
  return {
      {"",
       {arg_string("launcher", d.launcher, {"none", "pytorch", "slurm", "mpi"}, "how the ranks were started"),
        arg_string("work_dir", "", {}, "where logs, config.json and checkpoints go (\"\": work_dirs/<config name>)"),
        nullable(arg_of("load_from", ArgKind::String, "null", "initial weights (safetensors)")),
        arg_bool("resume", false, "resume from the work dir's last checkpoint"),
        arg_of("compile", ArgKind::Any, "false", "true: capture the steady-state step as a CUDA graph"),
        arg_of("sync_bn", ArgKind::Any, "null", "'torch' (or true): SyncBatchNorm across ranks"),
        accepted("default_scope", ArgKind::Any, "accepted, not used"),
        accepted("log_level", ArgKind::Any, "accepted, not used"),
        accepted("log_processor", ArgKind::Any, "accepted, not used")}},
      {"train_cfg",
       {arg_string("type", "EpochBasedTrainLoop", {"EpochBasedTrainLoop", "IterBasedTrainLoop"}, loops),
        arg_of("by_epoch", ArgKind::Bool, "", "true: EpochBasedTrainLoop; false: IterBasedTrainLoop"),
        at_least(arg_int("max_epochs", d.max_epochs, "training epochs (EpochBasedTrainLoop)"), 1),
        at_least(arg_of("max_iters", ArgKind::Int, "", "training iterations (IterBasedTrainLoop)"), 1),
        at_least(arg_int("val_interval", d.val_interval, "epochs (iterations) between validations (0: only at the end)"), 0),
        accepted("val_begin", ArgKind::Int, "accepted, not used")}},
      {"val_cfg", {arg_string("type", "ValLoop", {"ValLoop"}, "the validation loop")}},
      {"test_cfg", {arg_string("type", "TestLoop", {"TestLoop"}, "the test loop")}},
      {"train_dataloader",
       {at_least(arg_int("batch_size", d.batch_size, "training batch size per rank"), 1),
        arg_of("dataset", ArgKind::Dict, "", "the dataset: a registered type and its keywords"),
        arg_of("sampler", ArgKind::Dict, "", "DefaultSampler's shuffle and round_up"),
        accepted("num_workers", ArgKind::Int, "accepted: batches are loaded in the training process"),
        accepted("persistent_workers", ArgKind::Bool, "accepted, not used")}},
      {"train_dataloader.sampler",
       {arg_string("type", "DefaultSampler", {"DefaultSampler"}, "the sampler"),
        arg_bool("shuffle", d.shuffle, "shuffle the samples each epoch"),
        arg_bool("round_up", d.pad, "pad every rank's share to one length (false: no repeats, Join)")}},
      {"val_dataloader",
       {at_least(arg_int("batch_size", d.val_batch_size, "evaluation batch size"), 1),
        arg_of("dataset", ArgKind::Dict, "", "the train dataset's dict without indices, these keys on top"),
        arg_of("sampler", ArgKind::Dict, "", "DefaultSampler"),
        accepted("num_workers", ArgKind::Int, "accepted: batches are loaded in the training process"),
        accepted("persistent_workers", ArgKind::Bool, "accepted, not used")}},
      {"val_dataloader.sampler",
       {arg_string("type", "DefaultSampler", {"DefaultSampler"}, "the sampler"),
        arg_bool("shuffle", false, "validation visits the samples in order")}},
      {"optim_wrapper", optim_wrapper_section()},
      {"optim_wrapper.clip_grad", clip_grad_schema()},
      {"default_hooks.timer", hook_section("IterTimerHook")},
      {"default_hooks.logger", hook_section("LoggerHook", {{"interval", text(d.log_interval)}})},
      {"default_hooks.param_scheduler", hook_section("ParamSchedulerHook")},
      {"default_hooks.sampler_seed", hook_section("DistSamplerSeedHook")},
      {"default_hooks.checkpoint",
       hook_section("CheckpointHook", {{"interval", text(d.checkpoint_interval_epochs)},
                                       {"interval_iters", text(d.checkpoint_interval_iters)},
                                       {"max_keep_ckpts", text(d.max_keep_ckpts)}})},
      {"env_cfg",
       {arg_bool("cudnn_benchmark", false, "accepted, not used"),
        accepted("mp_cfg", ArgKind::Dict, "accepted, not used"),
        arg_of("dist_cfg", ArgKind::Dict, "", "backend and timeout of the process group"),
        arg_string("device", d.device, {}, "auto, cpu, cuda or cuda:N"),
        at_least(arg_int("threads", d.threads, "CPU threads (0: OMP_NUM_THREADS or every core)"), 0)}},
      {"env_cfg.dist_cfg",
       {arg_string("backend", d.backend, {"auto", "gloo", "nccl"}, "collectives (auto: nccl on GPUs, gloo on CPUs)"),
        above(arg_number("timeout", d.dist_timeout_s, "seconds any distributed wait may take"), 0)}},
      {"dist_params",
       {accepted("backend", ArgKind::String, "accepted (env_cfg.dist_cfg.backend decides)"),
        between(arg_int("port", d.port, "rank 0's store port (0: MASTER_PORT)"), 0, 65535)}},
      {"auto_scale_lr",
       {arg_bool("enable", false, "lr *= (batch size x world size) / base_batch_size"),
        at_least(arg_int("base_batch_size", 64, "the batch the lr was tuned for"), 1)}},
      {"randomness",
       {nullable(at_least(arg_int("seed", static_cast<int64_t>(d.seed), "seed of weights and shuffling"), 0)),
        arg_bool("deterministic", true, "accepted: Tandem's kernels are deterministic"),
        arg_bool("diff_rank_seed", false, "every rank uses one seed here (true is refused)")}},
      {"visualizer",
       {arg_string("type", "Visualizer", {}, "any *Visualizer (Tandem draws no images)"),
        accepted("name", ArgKind::String, "accepted, not used"),
        arg_of("vis_backends", ArgKind::Any, "[" + vis + "]",
               "LocalVisBackend, TensorboardVisBackend")}},
  };
}

// The top-level keys the Runner reads besides the sections': the registered types' dicts.
const Schema& section_schema(const std::string& path) {
  for (const auto& [p, schema] : run_config_sections())
    if (p == path) return schema;
  TANDEM_FAIL("no config section '", path, "'");
}

const std::vector<std::string> kTypedKeys = {"model", "model_wrapper_cfg", "optim_wrapper", "param_scheduler",
                                             "custom_hooks", "val_evaluator", "test_evaluator", "default_hooks"};

Json* node_at(Json& tree, const std::string& path) {
  Json* node = &tree;
  size_t start = 0;
  while (!path.empty()) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node;
}

std::string join_path(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

[[noreturn]] void unknown_key(const std::string& path, const std::string& key, const Schema& s, const Origins& o,
                              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> names = extra;
  for (const ArgSpec& a : s) names.push_back(a.key);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  const std::string full = join_path(path, key), guess = closest_key(key, names);
  auto it = o.find(full);
  TANDEM_FAIL(it == o.end() ? "" : it->second + ": ", path.empty() ? "unknown config key '" : "unknown key '", full,
              "'", guess.empty() ? "" : " (did you mean '" + join_path(path, guess) + "'?)", "; ",
              path.empty() ? "known keys" : path + " takes", ": ", list);
}

// The dict at `path` checked against `s` and completed in place.
void complete_section(Json& tree, const std::string& path, const Schema& s, const Origins& o,
                      const std::vector<std::string>& extra_keys = {}) {
  Json* node = node_at(tree, path);
  if (node->is_null()) *node = Json::object();
  TANDEM_CHECK(node->is_object(), key_label(path, o), " must be a dict, got ", node->dump());
  Kwargs k(path);
  for (const auto& [key, value] : node->items()) {
    if (std::find(extra_keys.begin(), extra_keys.end(), key) != extra_keys.end()) continue;
    const std::string& name = key;  // a structured binding cannot be captured before C++20 in clang 14
    if (std::none_of(s.begin(), s.end(), [&](const ArgSpec& a) { return a.key == name; }))
      unknown_key(path, key, s, o, extra_keys);
    k.set_json(key, value.dump());
    if (o.count(join_path(path, key))) k.set_origin(key, o.at(join_path(path, key)));
  }
  const Kwargs done = apply_schema(k, s);
  for (const auto& [key, text] : done.items()) (*node)[key] = Json::parse(text);
}

// A registered type's dict at `path`: its type checked, then its schema applied when it has one.
template <typename Factory>
void complete_typed(Json& dict, const std::string& path, const Registry<Factory>& reg, const Origins& o,
                    const char* what) {
  TANDEM_CHECK(dict.is_object() && dict.contains("type") && dict["type"].is_string(), key_label(path, o),
               " must be a dict with a \"type\" (a registered ", what, "), got ", dict.dump());
  const std::string type = dict["type"].get<std::string>();
  if (!reg.contains(type)) {
    std::string known;
    for (const std::string& n : reg.names()) known += (known.empty() ? "" : ", ") + n;
    const std::string guess = closest_key(type, reg.names());
    TANDEM_FAIL(key_label(join_path(path, "type"), o), " '", type, "' is not a registered ", what,
                guess.empty() ? "" : " (did you mean '" + guess + "'?)", " (registered: ", known, ")");
  }
  const Schema* s = reg.schema(type);
  if (!s) return;
  const Kwargs done = apply_schema(kwargs_at(dict, path, o), *s);
  for (const auto& [key, text] : done.items()) dict[key] = Json::parse(text);
}

// One dict or a list of them (MMEngine allows both) as a list, each entry a registered type.
template <typename Factory>
void complete_typed_list(Json& tree, const std::string& key, const Registry<Factory>& reg, const Origins& given,
                         const char* what) {
  Json& v = tree[key];
  if (v.is_null()) v = Json::array();
  Origins o = given;
  if (v.is_object()) {  // the single dict is the list's entry 0, in errors too
    v = Json::array({v});
    for (const auto& [path, source] : given)
      if (path.rfind(key + ".", 0) == 0) o[key + "[0]" + path.substr(key.size())] = source;
  }
  TANDEM_CHECK(v.is_array(), key_label(key, o), " must be a list of dicts with a \"type\", got ", v.dump());
  for (size_t i = 0; i < v.size(); ++i) complete_typed(v[i], key + "[" + std::to_string(i) + "]", reg, o, what);
}

void complete_optimizer(Json& tree, const Origins& o) {
  Json& opt = tree["optim_wrapper"]["optimizer"];
  const std::string path = "optim_wrapper.optimizer";
  if (opt.is_object() && opt.value("type", "") == "ZeroRedundancyOptimizer") {
    // MMEngine's ZeroRedundancyOptimizer(optimizer_type=...): the wrapped optimizer's schema applies.
    TANDEM_CHECK(opt.contains("optimizer_type") && opt["optimizer_type"].is_string(), key_label(path, o),
                 " type ZeroRedundancyOptimizer needs optimizer_type (Adadelta, SGD, Adam or AdamW)");
    Json inner = opt;
    inner.erase("optimizer_type");
    inner["type"] = opt["optimizer_type"];
    complete_typed(inner, path, optimizers(), o, "optimizer");
    inner["optimizer_type"] = inner["type"];
    inner["type"] = "ZeroRedundancyOptimizer";
    opt = inner;
    return;
  }
  TANDEM_CHECK(!opt.is_object() || !opt.contains("optimizer_type"), key_label(path + ".optimizer_type", o),
               " is only for type ZeroRedundancyOptimizer");
  complete_typed(opt, path, optimizers(), o, "optimizer");
}

// MMEngine's optim_wrapper for several optimizers: constructor='MultiOptimWrapperConstructor' and one
// wrapper config per child module of the model (type OptimWrapper unless given), each completed
// against its wrapper's and its optimizer's schemas. A dict of wrapper configs without the
// constructor is refused, as MMEngine's Runner refuses it. Returns whether the config is one.
bool complete_optim_wrapper_dict(Json& tree, const Origins& o) {
  Json& w = tree["optim_wrapper"];
  if (!w.is_object()) return false;
  if (!w.contains("constructor")) {
    for (const auto& [key, value] : w.items())
      TANDEM_CHECK(key == "optimizer" || !value.is_object() || !value.contains("optimizer"),
                   key_label("optim_wrapper." + key, o), " is a wrapper config but optim_wrapper has no constructor: "
                   "several optimizers need constructor='MultiOptimWrapperConstructor' (MMEngine's Runner refuses "
                   "them without it)");
    return false;
  }
  TANDEM_CHECK(w["constructor"] == "MultiOptimWrapperConstructor", key_label("optim_wrapper.constructor", o),
               " must be 'MultiOptimWrapperConstructor' (one optimizer needs no constructor), got ",
               w["constructor"].dump());
  TANDEM_CHECK(!w.contains("optimizer") && !w.contains("modules"), key_label("optim_wrapper", o),
               ": MultiOptimWrapperConstructor's one-optimizer form (optimizer=..., modules=[...]) is not supported; "
               "give one wrapper config per child module, e.g. gen=dict(type='OptimWrapper', optimizer=...)");
  int n = 0;
  for (auto& [name, child] : w.items()) {
    if (name == "constructor") continue;
    const std::string path = "optim_wrapper." + name;
    TANDEM_CHECK(child.is_object() && child.contains("optimizer"), key_label(path, o),
                 " must be dict(type='OptimWrapper', optimizer=dict(type=..., ...), ...) for the child module '",
                 name, "', got ", child.dump());
    TANDEM_CHECK(!child.contains("modules") && !child.contains("paramwise_cfg"), key_label(path, o),
                 ": modules and paramwise_cfg are not supported; the key names the child module");
    if (!child.contains("type")) child["type"] = "OptimWrapper";
    complete_typed(child, path, optim_wrappers(), o, "optim wrapper");
    complete_typed(child["optimizer"], path + ".optimizer", optimizers(), o, "optimizer");
    if (child.contains("clip_grad") && !child["clip_grad"].is_null())
      complete_section(tree, path + ".clip_grad", clip_grad_schema(), o);
    if (child["type"] == "AmpOptimWrapper") {
      TANDEM_CHECK(!child["dtype"].is_null(), key_label(path + ".dtype", o), " must be 'float16' or 'bfloat16' "
                   "(with several optimizers the Runner does not choose it by device)");
      parse_loss_scale(child["loss_scale"].dump(), path + ".loss_scale");
    }
    ++n;
  }
  TANDEM_CHECK(n > 0, key_label("optim_wrapper", o), " names no wrapper beside its constructor");
  return true;
}

// With several optimizers, MMEngine's param_scheduler=dict(gen=[...], disc=[...]): one list per
// wrapper (a name left out has none); a list or one scheduler applies to every wrapper as given.
void complete_param_scheduler_dict(Json& tree, const Origins& o) {
  Json& ps = tree["param_scheduler"];
  if (!ps.is_object() || ps.contains("type")) return;
  for (auto& [name, list] : ps.items()) {
    const std::string path = "param_scheduler." + name;
    TANDEM_CHECK(tree["optim_wrapper"].contains(name) && name != "constructor", key_label(path, o),
                 ": optim_wrapper has no wrapper '", name, "'");
    if (list.is_object()) list = Json::array({list});
    TANDEM_CHECK(list.is_array(), key_label(path, o), " must be a list of dicts with a \"type\", got ", list.dump());
    for (size_t i = 0; i < list.size(); ++i)
      complete_typed(list[i], path + "[" + std::to_string(i) + "]", param_schedulers(), o, "param scheduler");
  }
}

void complete_train_cfg(Json& tree, const Origins& o) {
  Json& t = tree["train_cfg"];
  const bool iter_type = t.is_object() && t.value("type", "") == "IterBasedTrainLoop";
  const bool iter_flag = t.is_object() && t.contains("by_epoch") && t["by_epoch"] == false;
  if (t.is_object() && (iter_type || iter_flag)) {
    TANDEM_CHECK(!t.contains("by_epoch") || t["by_epoch"] == false, key_label("train_cfg.by_epoch", o),
                 " contradicts train_cfg.type 'IterBasedTrainLoop'");
    TANDEM_CHECK(!o.count("train_cfg.type") || iter_type, key_label("train_cfg.by_epoch", o),
                 " false contradicts train_cfg.type '", t.value("type", ""), "'");
    TANDEM_CHECK(t.contains("max_iters"), key_label("train_cfg", o),
                 ": by_epoch=False counts iterations: give max_iters (and no max_epochs)");
    TANDEM_CHECK(!o.count("train_cfg.max_epochs"), key_label("train_cfg.max_epochs", o),
                 " does not apply to IterBasedTrainLoop (train_cfg.max_iters counts the run)");
    t.erase("max_epochs");  // the defaults' epochs; the iterations decide
    t["type"] = "IterBasedTrainLoop";
  } else if (t.is_object()) {
    TANDEM_CHECK(!t.contains("max_iters"), key_label("train_cfg.max_iters", o),
                 " needs by_epoch=False (IterBasedTrainLoop)");
  }
  complete_section(tree, "train_cfg", section_schema("train_cfg"), o);
  t["by_epoch"] = t["type"] == "EpochBasedTrainLoop";
  if (!t["by_epoch"].get<bool>()) t.erase("max_epochs");  // the schema's default epochs do not apply
}

// val_dataloader.dataset: the train dataset's dict without its indices, the val dict's keys on top
// (a val dict of another type stands alone).
void complete_datasets(Json& tree, const Origins& o) {
  Json& train = tree["train_dataloader"]["dataset"];
  complete_typed(train, "train_dataloader.dataset", datasets(), o, "dataset");
  Json& val = tree["val_dataloader"]["dataset"];
  if (val.is_null()) val = Json::object();
  TANDEM_CHECK(val.is_object(), key_label("val_dataloader.dataset", o), " must be a dict, got ", val.dump());
  if (!val.contains("type") || val["type"] == train["type"]) {
    Json merged = train;
    merged.erase("indices");
    for (const auto& [key, value] : val.items()) merged[key] = value;
    val = merged;
  }
  complete_typed(val, "val_dataloader.dataset", datasets(), o, "dataset");
}

void complete_default_hooks(Json& tree, const Origins& o) {
  Json& h = tree["default_hooks"];
  if (h.is_null()) h = Json::object();
  TANDEM_CHECK(h.is_object(), key_label("default_hooks", o), " must be a dict of hooks, got ", h.dump());
  const std::vector<std::string> names = {"timer", "logger", "param_scheduler", "checkpoint", "sampler_seed",
                                          "visualization"};
  for (const auto& [name, spec] : h.items())
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown_key("default_hooks", name, {}, o, names);
  for (const auto& [path, schema] : run_config_sections())
    if (path.rfind("default_hooks.", 0) == 0 && !(h.contains(path.substr(14)) && h[path.substr(14)].is_null()))
      complete_section(tree, path, schema, o);
}

void complete_cross_checks(Json& tree, const Origins& o, bool optim_dict) {
  const Json& w = tree["optim_wrapper"];
  if (!optim_dict) {
    TANDEM_CHECK(w["type"] == "AmpOptimWrapper" || w["dtype"].is_null(), key_label("optim_wrapper.dtype", o),
                 " needs type AmpOptimWrapper");
    TANDEM_CHECK(w["type"] == "AmpOptimWrapper" || w["loss_scale"] == "dynamic", key_label("optim_wrapper.loss_scale", o),
                 " needs type AmpOptimWrapper");
    parse_loss_scale(w["loss_scale"].dump(), "optim_wrapper.loss_scale");
    if (!w["clip_grad"].is_null()) complete_section(tree, "optim_wrapper.clip_grad", section_schema("optim_wrapper.clip_grad"), o);
  }
  TANDEM_CHECK(!tree["randomness"]["diff_rank_seed"].get<bool>(), key_label("randomness.diff_rank_seed", o),
               ": every rank uses one seed here");
  if (tree["load_from"] == "") tree["load_from"] = nullptr;  // no weights, as null
  const Json& sync = tree["sync_bn"];
  TANDEM_CHECK(sync.is_null() || sync.is_boolean() || sync == "torch", key_label("sync_bn", o),
               " must be 'torch', true, false or null, got ", sync.dump());
  Json& vis = tree["visualizer"]["vis_backends"];
  if (vis.is_object()) vis = Json::array({vis});
  TANDEM_CHECK(vis.is_array(), key_label("visualizer.vis_backends", o), " must be a list of dicts with a type, got ",
               vis.dump());
  std::vector<std::string> names;
  for (size_t i = 0; i < vis.size(); ++i) {
    const std::string at = "visualizer.vis_backends[" + std::to_string(i) + "]";
    TANDEM_CHECK(vis[i].is_object() && vis[i].size() == 1 && vis[i].contains("type") && vis[i]["type"].is_string(),
                 key_label(at, o), " must be a dict with only a type (LocalVisBackend or TensorboardVisBackend), got ",
                 vis[i].dump());
    names.push_back(vis[i]["type"].get<std::string>());
  }
  auto it = o.find("visualizer.vis_backends");
  check_vis_backends(names, (it == o.end() ? "" : it->second + ": ") + std::string("visualizer.vis_backends"));
  const std::string vtype = tree["visualizer"]["type"].get<std::string>();
  TANDEM_CHECK(vtype.size() >= 10 && vtype.compare(vtype.size() - 10, 10, "Visualizer") == 0,
               key_label("visualizer.type", o), " must be Visualizer (or a downstream *Visualizer), got '", vtype, "'");
}

}  // namespace

bool is_run_config_key(const std::string& key) {
  if (std::find(kTypedKeys.begin(), kTypedKeys.end(), key) != kTypedKeys.end()) return true;
  for (const auto& [path, schema] : run_config_sections()) {
    if (path == key) return true;
    if (path.empty() && std::any_of(schema.begin(), schema.end(), [&](const ArgSpec& a) { return a.key == key; }))
      return true;
  }
  return false;
}

const std::vector<std::pair<std::string, Schema>>& run_config_sections() {
  static const std::vector<std::pair<std::string, Schema>> sections = make_sections();
  return sections;
}

std::string key_label(const std::string& path, const Origins& origins) {
  const size_t dot = path.rfind('.');
  Kwargs k(dot == std::string::npos ? "" : path.substr(0, dot));
  const std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  if (origins.count(path)) k.set_origin(key, origins.at(path));
  return k.label(key);
}

Kwargs kwargs_at(const Json& dict, const std::string& path, const Origins& origins) {
  Kwargs k(path);
  for (const auto& [key, value] : dict.items()) {
    if (key == "type") continue;
    k.set_json(key, value.dump());
    if (origins.count(path + "." + key)) k.set_origin(key, origins.at(path + "." + key));
  }
  return k;
}

Json complete_run_config(const Json& given, const Origins& o) {
  Json tree = given;
  TANDEM_CHECK(tree.is_object(), "a config must be a dict of keys, got ", tree.dump());
  std::vector<std::string> top = kTypedKeys;
  for (const auto& [path, schema] : run_config_sections())
    if (!path.empty() && path.find('.') == std::string::npos && path != "optim_wrapper") top.push_back(path);
  tree.erase("_base_");
  complete_section(tree, "", section_schema(""), o, top);
  tree.erase("_base_");
  complete_train_cfg(tree, o);
  const bool optim_dict = complete_optim_wrapper_dict(tree, o);
  for (const auto& [path, schema] : run_config_sections())
    if (!path.empty() && path != "train_cfg" && path.rfind("default_hooks.", 0) != 0 &&
        path.rfind("optim_wrapper", 0) != 0)
      complete_section(tree, path, schema, o);
  if (!optim_dict) complete_section(tree, "optim_wrapper", section_schema("optim_wrapper"), o);
  complete_default_hooks(tree, o);
  complete_cross_checks(tree, o, optim_dict);
  complete_typed(tree["model"], "model", models(), o, "model");
  complete_typed(tree["model_wrapper_cfg"], "model_wrapper_cfg", model_wrappers(), o, "model wrapper");
  if (!optim_dict) complete_optimizer(tree, o);
  const bool scheduler_dict = tree["param_scheduler"].is_object() && !tree["param_scheduler"].contains("type");
  if (optim_dict && scheduler_dict)
    complete_param_scheduler_dict(tree, o);
  else
    complete_typed_list(tree, "param_scheduler", param_schedulers(), o, "param scheduler");
  complete_typed_list(tree, "custom_hooks", hooks(), o, "hook");
  complete_typed_list(tree, "val_evaluator", metric_types(), o, "metric");
  complete_typed_list(tree, "test_evaluator", metric_types(), o, "metric");
  complete_datasets(tree, o);
  return tree;
}

}  // namespace tandem::train
