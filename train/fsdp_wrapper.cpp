// model_wrapper_cfg=dict(type='MMFullyShardedDataParallel', ...): MMEngine's keyword arguments turned
// into dist::FSDPOptions (see registries.h for the keys).
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <optional>

#include "core/error.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/fsdp.h"
#include "dist/store/prefix_store.h"
#include "train/registries.h"
#include "train/runner_internal.h"

namespace tandem::train {
namespace {

using json = nlohmann::json;

// The last component of a dotted name: 'torch.distributed.fsdp.wrap.size_based_auto_wrap_policy' ->
// 'size_based_auto_wrap_policy'.
std::string last_name(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

dist::AutoWrapPolicy wrap_policy(const Kwargs& k) {
  dist::AutoWrapPolicy p;
  if (!k.has("auto_wrap_policy")) return p;
  const std::string where = k.owner() + ".auto_wrap_policy";
  const json v = json::parse(k.items().at("auto_wrap_policy"), nullptr, false);
  if (v.is_null()) return p;
  TANDEM_CHECK(v.is_object() && v.contains("type") && v["type"].is_string(), where,
               " must be dict(type=..., ...), got ", k.items().at("auto_wrap_policy"));
  const std::string type = last_name(v["type"].get<std::string>());
  if (type == "size_based_auto_wrap_policy") {
    for (const auto& [key, value] : v.items())
      TANDEM_CHECK(key == "type" || key == "min_num_params", where, ": unknown key '", key,
                   "' for size_based_auto_wrap_policy (known: min_num_params)");
    TANDEM_CHECK(v.contains("min_num_params") && v["min_num_params"].is_number() && v["min_num_params"] >= 1, where,
                 ".min_num_params must be a number >= 1");
    p.min_num_params = static_cast<int64_t>(v["min_num_params"].get<double>());
    return p;
  }
  if (type == "transformer_auto_wrap_policy" || type == "ModuleWrapPolicy") {
    const char* key = type == "ModuleWrapPolicy" ? "module_classes" : "transformer_layer_cls";
    for (const auto& [name, value] : v.items())
      TANDEM_CHECK(name == "type" || name == key, where, ": unknown key '", name, "' for ", type, " (known: ", key,
                   ")");
    TANDEM_CHECK(v.contains(key) && v[key].is_array() && !v[key].empty(), where, ".", key,
                 " must be a non-empty list of module class names, e.g. ['Block']");
    for (const auto& c : v[key]) {
      TANDEM_CHECK(c.is_string(), where, ".", key, " holds ", c.dump(), "; expected class names as strings");
      p.module_classes.insert(last_name(c.get<std::string>()));
    }
    return p;
  }
  TANDEM_FAIL(where, ": unknown type '", v["type"].get<std::string>(),
              "'; expected size_based_auto_wrap_policy, transformer_auto_wrap_policy or ModuleWrapPolicy");
}

// mixed_precision=dict(param_dtype='bfloat16', reduce_dtype=..., buffer_dtype=..., _module_classes_to_ignore=[...])
// (PyTorch's MixedPrecision; a dtype may carry the 'torch.' prefix; None or absent: not cast).
dist::MixedPrecision mixed_precision(const Kwargs& k) {
  dist::MixedPrecision mp;
  const std::string where = k.owner() + ".mixed_precision";
  const json v = k.has("mixed_precision") ? json::parse(k.items().at("mixed_precision"), nullptr, false) : json();
  if (v.is_null() || v == false) return mp;
  TANDEM_CHECK(v.is_object(), where, " must be dict(param_dtype=..., reduce_dtype=..., buffer_dtype=...), got ",
               k.items().at("mixed_precision"));
  const std::map<std::string, std::optional<DType>*> dtypes = {
      {"param_dtype", &mp.param_dtype}, {"reduce_dtype", &mp.reduce_dtype}, {"buffer_dtype", &mp.buffer_dtype}};
  for (const auto& [key, value] : v.items()) {
    if (key == "_module_classes_to_ignore") {
      TANDEM_CHECK(value.is_array(), where, "._module_classes_to_ignore must be a list of module class names");
      mp.module_classes_to_ignore.clear();
      for (const auto& c : value) {
        TANDEM_CHECK(c.is_string(), where, "._module_classes_to_ignore holds ", c.dump(), "; expected class names");
        mp.module_classes_to_ignore.insert(last_name(c.get<std::string>()));
      }
      continue;
    }
    const auto slot = dtypes.find(key);
    TANDEM_CHECK(slot != dtypes.end(), where, ": unknown key '", key,
                 "' (known: param_dtype, reduce_dtype, buffer_dtype, _module_classes_to_ignore)");
    if (value.is_null()) continue;
    TANDEM_CHECK(value.is_string(), where, ".", key, " must be a dtype name such as 'bfloat16', got ", value.dump());
    try {
      *slot->second = dist::parse_mixed_precision_dtype(value.get<std::string>());
    } catch (const Error& e) {
      TANDEM_FAIL(where, ".", key, ": ", e.what());
    }
  }
  return mp;
}

// cpu_offload=True or dict(offload_params=True) (PyTorch's CPUOffload).
dist::CPUOffload cpu_offload(const Kwargs& k) {
  dist::CPUOffload o;
  const json v = k.has("cpu_offload") ? json::parse(k.items().at("cpu_offload"), nullptr, false) : json();
  if (v.is_boolean()) o.offload_params = v.get<bool>();
  if (v.is_null() || v.is_boolean()) return o;
  TANDEM_CHECK(v.is_object() && v.size() == 1 && v.contains("offload_params") && v["offload_params"].is_boolean(),
               k.owner(), ".cpu_offload must be True, False or dict(offload_params=True|False), got ",
               k.items().at("cpu_offload"));
  o.offload_params = v["offload_params"].get<bool>();
  return o;
}

// The DDP keys the trainer always passes: accepted only at their defaults.
void check_ddp_keys_unused(const Kwargs& k) {
  const dist::DDPOptions defaults;
  Kwargs ddp(k.owner());
  for (const std::string& name : ddp_kwarg_names())
    if (k.has(name)) ddp.set_json(name, k.items().at(name));
  const dist::DDPOptions d = ddp_options_from_kwargs(ddp);
  const bool unchanged = d.broadcast_buffers == defaults.broadcast_buffers &&
                         d.reducer.find_unused_parameters == defaults.reducer.find_unused_parameters &&
                         d.reducer.bucket_cap_mb == defaults.reducer.bucket_cap_mb &&
                         d.reducer.first_bucket_cap_mb == defaults.reducer.first_bucket_cap_mb &&
                         d.reducer.gradient_as_bucket_view == defaults.reducer.gradient_as_bucket_view &&
                         d.reducer.static_graph == defaults.reducer.static_graph &&
                         ddp.string("comm_hook", "allreduce") == "allreduce";
  TANDEM_CHECK(unchanged, k.owner(), ": the DistributedDataParallel settings (bucket_cap_mb, comm_hook, "
               "find_unused_parameters, static_graph, gradient_as_bucket_view, broadcast_buffers) do not apply to "
               "MMFullyShardedDataParallel; leave them at their defaults");
}

}  // namespace

// True for model_wrapper_cfg.state_dict_type='SHARDED_STATE_DICT' (PyTorch's StateDictType name, with or
// without 'StateDictType.') or MMEngine FSDPStrategy's state_dict_cfg=dict(state_dict_type=...);
// state_dict_cfg='full' and the default are FULL_STATE_DICT.
bool fsdp_sharded_state_dict(const Kwargs& k) {
  const std::string accepted = "'FULL_STATE_DICT' (the default: one full checkpoint written by rank 0) or "
                               "'SHARDED_STATE_DICT' (a shard file per rank)";
  auto parse = [&](const std::string& where, const std::string& given) {
    const std::string name = last_name(given);
    TANDEM_CHECK(name != "LOCAL_STATE_DICT" && name != "local", where, " '", given, "' (LOCAL_STATE_DICT) is not ",
                 "supported; use ", accepted);
    TANDEM_CHECK(name == "FULL_STATE_DICT" || name == "SHARDED_STATE_DICT" || name == "full", where, " '", given,
                 "' is not a state dict type; expected ", accepted);
    return name == "SHARDED_STATE_DICT";
  };
  std::optional<bool> type, cfg;
  if (k.has("state_dict_type")) type = parse(k.owner() + ".state_dict_type", k.string("state_dict_type"));
  if (k.has("state_dict_cfg")) {
    const std::string where = k.owner() + ".state_dict_cfg";
    const json v = json::parse(k.items().at("state_dict_cfg"), nullptr, false);
    if (v.is_string()) cfg = parse(where, v.get<std::string>());
    TANDEM_CHECK(v.is_string() || (v.is_object() && v.size() == 1 && v.contains("state_dict_type") &&
                                   v["state_dict_type"].is_string()),
                 where, " must be 'full' or dict(state_dict_type=...), got ", k.items().at("state_dict_cfg"));
    if (!cfg) cfg = parse(where + ".state_dict_type", v["state_dict_type"].get<std::string>());
  }
  TANDEM_CHECK(!type || !cfg || *type == *cfg, k.owner(), ": state_dict_type and state_dict_cfg disagree; give one");
  return type.value_or(cfg.value_or(false));
}

Schema fsdp_schema() {
  const dist::FSDPOptions d;
  ArgSpec prefetch = nullable(arg_of("backward_prefetch", ArgKind::Any, d.backward_prefetch ? "\"BACKWARD_PRE\"" : "null",
                                     "'BACKWARD_PRE', 'BACKWARD_POST' or None"));
  prefetch.choices = {"BACKWARD_PRE", "BACKWARD_POST"};
  Schema s = {arg_string("sharding_strategy", dist::sharding_strategy_name(d.sharding_strategy),
                         {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"}, "what is sharded"),
              nullable(arg_of("auto_wrap_policy", ArgKind::Dict, "null", "which submodules become FSDP units")),
              arg_bool("forward_prefetch", d.forward_prefetch, "gather the next unit during the forward"),
              prefetch,
              arg_of("mixed_precision", ArgKind::Any, "null", "dict(param_dtype, reduce_dtype, buffer_dtype)"),
              arg_of("cpu_offload", ArgKind::Any, "false", "True or dict(offload_params=True)"),
              (arg_of("state_dict_type", ArgKind::String, "", "'FULL_STATE_DICT' or 'SHARDED_STATE_DICT'")),
              arg_of("state_dict_cfg", ArgKind::Any, "", "'full' or dict(state_dict_type=...)")};
  for (ArgSpec a : ddp_schema()) {  // DDP's keys: accepted at their defaults only, not filled in
    a.default_json.clear();
    a.doc = "DistributedDataParallel's; accepted at its default only";
    s.push_back(a);
  }
  return s;
}

std::shared_ptr<nn::Module> wrap_fsdp(const WrapContext& c, const Kwargs& k) {
  check_ddp_keys_unused(k);
  if (fsdp_sharded_state_dict(k)) spdlog::info("fsdp checkpoints: SHARDED_STATE_DICT, a shard file per rank");
  dist::FSDPOptions o;
  o.mixed_precision = mixed_precision(k);
  o.cpu_offload = cpu_offload(k);
  if (o.mixed_precision.enabled()) {
    const auto name = [](const std::optional<DType>& d) { return d ? std::string(dtype_name(*d)) : std::string("None"); };
    spdlog::info("fsdp mixed precision: param_dtype {}, reduce_dtype {}, buffer_dtype {}",
                 name(o.mixed_precision.param_dtype), name(o.mixed_precision.reduce_dtype),
                 name(o.mixed_precision.buffer_dtype));
  }
  if (o.cpu_offload.offload_params && !c.model->parameters().empty() && c.model->parameters().front().device().is_cpu())
    spdlog::info("fsdp cpu_offload: the model is on the CPU, where its shards, gradients and optimizer state already "
                 "live; nothing changes");
  o.sharding_strategy = dist::parse_sharding_strategy(k.string("sharding_strategy"));
  o.auto_wrap_policy = wrap_policy(k);
  o.forward_prefetch = k.boolean("forward_prefetch");
  if (k.has("backward_prefetch")) {  // a choice (checked), None, or true/false
    const json v = json::parse(k.items().at("backward_prefetch"), nullptr, false);
    TANDEM_CHECK(v.is_null() || v.is_string() || v.is_boolean(), k.label("backward_prefetch"),
                 " must be 'BACKWARD_PRE', 'BACKWARD_POST' or None, got ", k.items().at("backward_prefetch"));
    o.backward_prefetch = v.is_boolean() ? v.get<bool>() : !v.is_null();
  }
  std::shared_ptr<dist::ProcessGroup> group = c.group;
  if (o.sharding_strategy == dist::ShardingStrategy::HybridShard) {
    const int world = c.group->size(), local = c.local_world_size;
    TANDEM_CHECK(c.store != nullptr && local >= 1 && world % local == 0, k.owner(),
                 ": HYBRID_SHARD needs nodes of equal size (", world, " ranks, ", local, " per node)");
    const int node = c.group->rank() / local, local_rank = c.group->rank() % local;
    auto in_node = std::make_shared<dist::PrefixStore>("fsdp/node" + std::to_string(node) + "/", c.store);
    auto across = std::make_shared<dist::PrefixStore>("fsdp/local" + std::to_string(local_rank) + "/", c.store);
    group = dist::make_process_group(c.group->backend(), in_node, local_rank, local, c.group->timeout(), local_rank);
    o.replicate_group =
        dist::make_process_group(c.group->backend(), across, node, world / local, c.group->timeout(), local_rank);
  }
  return std::make_shared<dist::FullyShardedDataParallel>(c.model, group, std::move(o));
}

}  // namespace tandem::train
