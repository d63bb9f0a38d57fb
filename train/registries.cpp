// The registries' built-in entries (see registries.h), added on first use of each registry.
#include "train/registries.h"

#include <nlohmann/json.hpp>

#include "dist/parallel/comm_hook.h"
#include "nn/models/mnist_net.h"
#include "train/hooks/builtin_hooks.h"
#include "train/models/zoo.h"

namespace tandem::train {
namespace {

std::shared_ptr<nn::Module> wrap_ddp(const WrapContext& c, const Kwargs& k) {
  return std::make_shared<dist::DistributedDataParallel>(c.model, c.group, ddp_options_from_kwargs(k));
}

std::pair<double, double> betas(const Kwargs& k) {
  const nlohmann::json v = nlohmann::json::parse(k.items().at("betas"), nullptr, false);
  TANDEM_CHECK(v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number(), k.label("betas"),
               " must be two numbers [beta1, beta2], got ", k.items().at("betas"));
  return {v[0].get<double>(), v[1].get<double>()};
}

// Keyword schemas: the defaults are the option structs' own (optim/optimizer.h, dist/parallel/*.h).
Schema adadelta_schema() {
  const optim::AdadeltaOptions d;
  return {at_least(arg_number("lr", d.lr, "learning rate"), 0),
          between(arg_number("rho", d.rho, "decay of the running averages"), 0, 1),
          at_least(arg_number("eps", d.eps, "added to the denominators"), 0),
          at_least(arg_number("weight_decay", d.weight_decay, "L2 penalty"), 0)};
}

Schema sgd_schema() {
  const optim::SGDOptions d;
  return {at_least(arg_number("lr", d.lr, "learning rate"), 0),
          at_least(arg_number("momentum", d.momentum, "momentum factor"), 0),
          at_least(arg_number("dampening", d.dampening, "dampening of the momentum"), 0),
          at_least(arg_number("weight_decay", d.weight_decay, "L2 penalty"), 0),
          arg_bool("nesterov", d.nesterov, "Nesterov momentum")};
}

Schema adam_schema(bool decoupled) {
  const optim::AdamOptions d;
  const std::string betas = nlohmann::json::array({d.beta1, d.beta2}).dump();
  return {at_least(arg_number("lr", d.lr, "learning rate"), 0),
          arg_of("betas", ArgKind::List, betas, "[beta1, beta2]: decays of the moment estimates"),
          at_least(arg_number("eps", d.eps, "added to the denominator"), 0),
          at_least(arg_number("weight_decay", decoupled ? 1e-2 : d.weight_decay,
                              decoupled ? "decoupled weight decay" : "L2 penalty"),
                   0)};
}

optim::AdamOptions adam_options(const Kwargs& k, bool decoupled) {
  optim::AdamOptions a;
  a.lr = k.number("lr");
  std::tie(a.beta1, a.beta2) = betas(k);
  a.eps = k.number("eps");
  a.weight_decay = k.number("weight_decay");
  a.decoupled_weight_decay = decoupled;
  return a;
}

}  // namespace

Schema ddp_schema() {
  const dist::DDPOptions d;
  const dist::CommHookOptions h;
  return {arg_bool("find_unused_parameters", d.reducer.find_unused_parameters,
                   "allow parameters that get no gradient in an iteration"),
          arg_bool("broadcast_buffers", d.broadcast_buffers, "broadcast rank 0's buffers at each forward"),
          at_least(arg_number("bucket_cap_mb", d.reducer.bucket_cap_mb,
                              "gradient bucket size in MiB after the first (0: measured at start-up)"),
                   0),
          above(arg_number("first_bucket_cap_mb", d.reducer.first_bucket_cap_mb, "size of the first bucket"), 0),
          arg_bool("gradient_as_bucket_view", d.reducer.gradient_as_bucket_view,
                   "gradients live in the bucket buffers"),
          arg_bool("static_graph", d.reducer.static_graph, "the same graph every iteration"),
          arg_string("comm_hook", "allreduce", {}, "allreduce, fp16, bf16, powersgd or a registered hook"),
          at_least(arg_int("powersgd_rank", h.powersgd_rank, "PowerSGD's matrix approximation rank"), 1),
          at_least(arg_int("powersgd_start_iter", h.powersgd_start_iter,
                           "PowerSGD: iterations of plain all-reduce first"),
                   0)};
}


const std::vector<std::string>& ddp_kwarg_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ArgSpec& a : ddp_schema()) out.push_back(a.key);
    return out;
  }();
  return names;
}

dist::DDPOptions ddp_options_from_kwargs(const Kwargs& given) {
  const Kwargs k = apply_schema(given, ddp_schema());
  dist::DDPOptions d;
  d.broadcast_buffers = k.boolean("broadcast_buffers");
  d.reducer.find_unused_parameters = k.boolean("find_unused_parameters");
  d.reducer.bucket_cap_mb = k.number("bucket_cap_mb");
  d.reducer.first_bucket_cap_mb = k.number("first_bucket_cap_mb");
  d.reducer.gradient_as_bucket_view = k.boolean("gradient_as_bucket_view");
  d.reducer.static_graph = k.boolean("static_graph");
  dist::CommHookOptions hook;
  hook.powersgd_rank = static_cast<int>(k.integer("powersgd_rank"));
  hook.powersgd_start_iter = k.integer("powersgd_start_iter");
  d.reducer.comm_hook = dist::comm_hook_by_name(k.string("comm_hook"), hook);
  return d;
}

Registry<ModelFactory>& models() {
  static Registry<ModelFactory>* r = [] {
    auto* reg = new Registry<ModelFactory>("model");
    reg->register_module(
        "MnistNet", [](const Kwargs&) -> std::shared_ptr<nn::Module> { return std::make_shared<nn::models::MnistNet>(); },
        Schema{});
    register_model_zoo(*reg);  // ResNet, GPT
    return reg;
  }();
  return *r;
}

Schema zero_schema() {
  return {required(arg_string("optimizer_type", "", {}, "the optimizer it wraps: Adadelta, SGD, Adam, AdamW")),
          arg_rest("the wrapped optimizer's keywords, checked against its schema")};
}

std::pair<std::string, Kwargs> zero_inner_optimizer(const Kwargs& given) {
  const Kwargs k = apply_schema(given, zero_schema());
  const std::string inner = k.string("optimizer_type");
  TANDEM_CHECK(inner != "ZeroRedundancyOptimizer", k.label("optimizer_type"),
               " must name the optimizer it wraps (Adadelta, SGD, Adam, AdamW), not ZeroRedundancyOptimizer");
  Kwargs rest(k.owner() + "." + inner);
  for (const auto& [key, value] : k.items())
    if (key != "optimizer_type") rest.set_json(key, value);
  return {inner, rest};
}

Registry<WrapperFactory>& model_wrappers() {
  static Registry<WrapperFactory>* r = [] {
    auto* reg = new Registry<WrapperFactory>("model wrapper");
    reg->register_module("MMDistributedDataParallel", wrap_ddp, ddp_schema());
    reg->register_module("DistributedDataParallel", wrap_ddp, ddp_schema());
    reg->register_module("MMFullyShardedDataParallel", wrap_fsdp, fsdp_schema());
    reg->register_module("FullyShardedDataParallel", wrap_fsdp, fsdp_schema());
    return reg;
  }();
  return *r;
}

Registry<OptimizerFactory>& optimizers() {
  static Registry<OptimizerFactory>* r = [] {
    auto* reg = new Registry<OptimizerFactory>("optimizer");
    // MMEngine's ZeroRedundancyOptimizer(optimizer_type=...): over a world of one it is the optimizer it
    // wraps (as PyTorch's is); with ranks the Runner shards that optimizer's state across them.
    reg->register_module(
        "ZeroRedundancyOptimizer",
        [](std::vector<Tensor> p, const Kwargs& k) {
          const auto [inner, rest] = zero_inner_optimizer(k);
          return optimizers().get(inner)(std::move(p), rest);
        },
        zero_schema());
    reg->register_module(
        "Adadelta",
        [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::Adadelta>(
              std::move(p), optim::AdadeltaOptions{k.number("lr"), k.number("rho"), k.number("eps"),
                                                   k.number("weight_decay")});
        },
        adadelta_schema());
    reg->register_module(
        "SGD",
        [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::SGD>(
              std::move(p), optim::SGDOptions{k.number("lr"), k.number("momentum"), k.number("dampening"),
                                              k.number("weight_decay"), k.boolean("nesterov")});
        },
        sgd_schema());
    reg->register_module(
        "Adam",
        [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::Adam>(std::move(p), adam_options(k, false));
        },
        adam_schema(false));
    reg->register_module(
        "AdamW",
        [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::AdamW>(std::move(p), adam_options(k, true));
        },
        adam_schema(true));
    return reg;
  }();
  return *r;
}

Registry<SchedulerFactory>& param_schedulers() {
  static Registry<SchedulerFactory>* r = [] {
    auto* reg = new Registry<SchedulerFactory>("param scheduler");
    register_lr_schedulers(*reg);
    return reg;
  }();
  return *r;
}

Registry<HookFactory>& hooks() {
  static Registry<HookFactory>* r = [] {
    auto* reg = new Registry<HookFactory>("hook");
    // The hooks without keyword arguments own an empty schema: any key is unknown.
    reg->register_module("IterTimerHook", make_iter_timer_hook, Schema{});
    reg->register_module("LoggerHook", make_logger_hook, logger_hook_schema());
    reg->register_module("ParamSchedulerHook", make_param_scheduler_hook, Schema{});
    reg->register_module("DistSamplerSeedHook", make_dist_sampler_seed_hook, Schema{});
    reg->register_module("StopAgreementHook", make_stop_agreement_hook, Schema{});
    reg->register_module("CheckpointHook", make_checkpoint_hook, checkpoint_hook_schema());
    reg->register_module("CheckInvalidLossHook", make_check_invalid_loss_hook, Schema{});
    reg->register_module("EMAHook", make_ema_hook, ema_hook_schema());
    reg->register_module("EarlyStoppingHook", make_early_stopping_hook, early_stopping_hook_schema());
    return reg;
  }();
  return *r;
}

}  // namespace tandem::train
