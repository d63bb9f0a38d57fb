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
  if (!k.has("betas")) return {0.9, 0.999};
  const nlohmann::json v = nlohmann::json::parse(k.items().at("betas"), nullptr, false);
  TANDEM_CHECK(v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number(), k.owner(),
               ".betas must be two numbers [beta1, beta2], got ", k.items().at("betas"));
  return {v[0].get<double>(), v[1].get<double>()};
}

optim::AdamOptions adam_options(const Kwargs& k, bool decoupled) {
  k.check_known({"lr", "betas", "eps", "weight_decay"});
  optim::AdamOptions a;
  a.lr = k.number("lr", 1e-3);
  std::tie(a.beta1, a.beta2) = betas(k);
  a.eps = k.number("eps", 1e-8);
  a.weight_decay = k.number("weight_decay", decoupled ? 1e-2 : 0.0);
  a.decoupled_weight_decay = decoupled;
  return a;
}

}  // namespace

const std::vector<std::string>& ddp_kwarg_names() {
  static const std::vector<std::string> names = {"find_unused_parameters", "broadcast_buffers",
                                                 "bucket_cap_mb",          "first_bucket_cap_mb",
                                                 "gradient_as_bucket_view", "static_graph",
                                                 "comm_hook",              "powersgd_rank",
                                                 "powersgd_start_iter"};
  return names;
}

dist::DDPOptions ddp_options_from_kwargs(const Kwargs& k) {
  k.check_known(ddp_kwarg_names());
  dist::DDPOptions d;
  d.broadcast_buffers = k.boolean("broadcast_buffers", d.broadcast_buffers);
  d.reducer.find_unused_parameters = k.boolean("find_unused_parameters", d.reducer.find_unused_parameters);
  d.reducer.bucket_cap_mb = k.number("bucket_cap_mb", d.reducer.bucket_cap_mb);
  d.reducer.first_bucket_cap_mb = k.number("first_bucket_cap_mb", d.reducer.first_bucket_cap_mb);
  TANDEM_CHECK(d.reducer.first_bucket_cap_mb > 0, k.owner(), ".first_bucket_cap_mb must be > 0, got ",
               d.reducer.first_bucket_cap_mb);
  d.reducer.gradient_as_bucket_view = k.boolean("gradient_as_bucket_view", d.reducer.gradient_as_bucket_view);
  d.reducer.static_graph = k.boolean("static_graph", d.reducer.static_graph);
  dist::CommHookOptions hook;
  hook.powersgd_rank = static_cast<int>(k.integer("powersgd_rank", hook.powersgd_rank));
  hook.powersgd_start_iter = k.integer("powersgd_start_iter", hook.powersgd_start_iter);
  TANDEM_CHECK(hook.powersgd_rank >= 1, k.owner(), ".powersgd_rank must be >= 1, got ", hook.powersgd_rank);
  TANDEM_CHECK(hook.powersgd_start_iter >= 0, k.owner(), ".powersgd_start_iter must be >= 0, got ",
               hook.powersgd_start_iter);
  if (k.has("comm_hook")) d.reducer.comm_hook = dist::comm_hook_by_name(k.string("comm_hook", "allreduce"), hook);
  return d;
}

Registry<ModelFactory>& models() {
  static Registry<ModelFactory>* r = [] {
    auto* reg = new Registry<ModelFactory>("model");
    reg->register_module("MnistNet", [](const Kwargs& k) -> std::shared_ptr<nn::Module> {
      k.check_known({});
      return std::make_shared<nn::models::MnistNet>();
    });
    register_model_zoo(*reg);  // ResNet, GPT
    return reg;
  }();
  return *r;
}

std::pair<std::string, Kwargs> zero_inner_optimizer(const Kwargs& k) {
  const std::string inner = k.string("optimizer_type", "");
  TANDEM_CHECK(!inner.empty() && inner != "ZeroRedundancyOptimizer", k.owner(),
               ": ZeroRedundancyOptimizer needs optimizer_type (a registered optimizer: Adadelta, SGD, Adam, AdamW)");
  Kwargs rest(k.owner() + "." + inner);
  for (const auto& [key, value] : k.items())
    if (key != "optimizer_type") rest.set_json(key, value);
  return {inner, rest};
}

Registry<WrapperFactory>& model_wrappers() {
  static Registry<WrapperFactory>* r = [] {
    auto* reg = new Registry<WrapperFactory>("model wrapper");
    reg->register_module("MMDistributedDataParallel", wrap_ddp);
    reg->register_module("DistributedDataParallel", wrap_ddp);
    reg->register_module("MMFullyShardedDataParallel", wrap_fsdp);
    reg->register_module("FullyShardedDataParallel", wrap_fsdp);
    return reg;
  }();
  return *r;
}

Registry<OptimizerFactory>& optimizers() {
  static Registry<OptimizerFactory>* r = [] {
    auto* reg = new Registry<OptimizerFactory>("optimizer");
    // MMEngine's ZeroRedundancyOptimizer(optimizer_type=...): over a world of one it is the optimizer it
    // wraps (as PyTorch's is); with ranks the Runner shards that optimizer's state across them.
    reg->register_module("ZeroRedundancyOptimizer", [](std::vector<Tensor> p, const Kwargs& k) {
      const auto [inner, rest] = zero_inner_optimizer(k);
      return optimizers().get(inner)(std::move(p), rest);
    });
    reg->register_module("Adadelta", [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
      k.check_known({"lr", "rho", "eps", "weight_decay"});
      return std::make_unique<optim::Adadelta>(
          std::move(p), optim::AdadeltaOptions{k.number("lr", 1.0), k.number("rho", 0.9), k.number("eps", 1e-6),
                                               k.number("weight_decay", 0.0)});
    });
    reg->register_module("SGD", [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
      k.check_known({"lr", "momentum", "dampening", "weight_decay", "nesterov"});
      return std::make_unique<optim::SGD>(
          std::move(p), optim::SGDOptions{k.number("lr", 0.01), k.number("momentum", 0.0), k.number("dampening", 0.0),
                                          k.number("weight_decay", 0.0), k.boolean("nesterov", false)});
    });
    reg->register_module("Adam", [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::Adam>(std::move(p), adam_options(k, false));
    });
    reg->register_module("AdamW", [](std::vector<Tensor> p, const Kwargs& k) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::AdamW>(std::move(p), adam_options(k, true));
    });
    return reg;
  }();
  return *r;
}

Registry<SchedulerFactory>& param_schedulers() {
  static Registry<SchedulerFactory>* r = [] {
    auto* reg = new Registry<SchedulerFactory>("param scheduler");
    reg->register_module("StepLR", make_step_lr);
    reg->register_module("CosineAnnealingLR", make_cosine_lr);
    reg->register_module("MultiStepLR", make_multi_step_lr);
    reg->register_module("LinearLR", make_linear_lr);
    reg->register_module("ConstantLR", make_constant_lr);
    reg->register_module("ExponentialLR", make_exponential_lr);
    return reg;
  }();
  return *r;
}

Registry<HookFactory>& hooks() {
  static Registry<HookFactory>* r = [] {
    auto* reg = new Registry<HookFactory>("hook");
    reg->register_module("IterTimerHook", make_iter_timer_hook);
    reg->register_module("LoggerHook", make_logger_hook);
    reg->register_module("ParamSchedulerHook", make_param_scheduler_hook);
    reg->register_module("DistSamplerSeedHook", make_dist_sampler_seed_hook);
    reg->register_module("StopAgreementHook", make_stop_agreement_hook);
    reg->register_module("CheckpointHook", make_checkpoint_hook);
    reg->register_module("CheckInvalidLossHook", make_check_invalid_loss_hook);
    reg->register_module("EMAHook", make_ema_hook);
    reg->register_module("EarlyStoppingHook", make_early_stopping_hook);
    return reg;
  }();
  return *r;
}

}  // namespace tandem::train
