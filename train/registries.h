// The Runner's registries (MMEngine's MODELS, MODEL_WRAPPERS, OPTIMIZERS, PARAM_SCHEDULERS, HOOKS)
// and their built-in entries, registered on first use:
//   models()          MnistNet, and the models library's ResNet and GPT (train/models/zoo.h)
//   model_wrappers()  MMDistributedDataParallel, DistributedDataParallel (dist::DistributedDataParallel),
//                     MMFullyShardedDataParallel, FullyShardedDataParallel (dist::FullyShardedDataParallel;
//                     train/fsdp_wrapper.cpp)
//   optimizers()      Adadelta, SGD, Adam, AdamW (PyTorch's names and keyword arguments),
//                     ZeroRedundancyOptimizer (optimizer_type: one of them, its state sharded by the Runner)
//   param_schedulers() StepLR, MultiStepLR, LinearLR, ConstantLR, ExponentialLR, CosineAnnealingLR
//   hooks()           IterTimerHook, LoggerHook, ParamSchedulerHook, CheckpointHook,
//                     DistSamplerSeedHook, StopAgreementHook, CheckInvalidLossHook, EMAHook,
//                     EarlyStoppingHook
// and, beside them, optim_wrappers() (OptimWrapper, AmpOptimWrapper; train/optim_wrapper.h),
// metric_types() (train/evaluator.h) and datasets() (train/models/zoo.h). Every built-in entry owns
// its keyword schema.
// An embedding program adds its own with register_module before it builds a Runner, e.g.
//   train::model_wrappers().register_module("MyDDP", [](const train::WrapContext& c, const train::Kwargs& k) {...});
// model_wrapper_cfg's DDP keyword arguments become dist::DDPOptions in ddp_options_from_kwargs, the
// one place that mapping lives (a wrapper factory calls it); FSDP's become dist::FSDPOptions in
// wrap_fsdp.
#pragma once

#include <memory>
#include <vector>

#include "dist/parallel/ddp.h"
#include "dist/group/process_group.h"
#include "dist/store/store.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "train/hook.h"
#include "train/param_scheduler.h"
#include "train/registry.h"

namespace tandem::train {

using ModelFactory = std::function<std::shared_ptr<nn::Module>(const Kwargs&)>;

// What a model wrapper factory is given: the model (on its device) and the job's process group.
struct WrapContext {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<dist::ProcessGroup> group;
  // For wrappers that make groups of their own (FSDP's HYBRID_SHARD: one per node and one per
  // local rank): the job's store and where this rank sits.
  std::shared_ptr<dist::Store> store;
  int local_rank = 0, local_world_size = 1;
};
// Returns the wrapped model. A wrapper that derives from dist::DistributedDataParallel gets
// accumulation through no_sync() and the reducer's numbers in the logs.
using WrapperFactory = std::function<std::shared_ptr<nn::Module>(const WrapContext&, const Kwargs&)>;
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>, const Kwargs&)>;
using HookFactory = std::function<std::shared_ptr<Hook>(const Kwargs&)>;

Registry<ModelFactory>& models();
Registry<WrapperFactory>& model_wrappers();
// MMEngine's MMFullyShardedDataParallel: sharding_strategy ('FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD',
// 'HYBRID_SHARD': shard within a node of local_world_size ranks), auto_wrap_policy
// (dict(type='transformer_auto_wrap_policy' | 'ModuleWrapPolicy', transformer_layer_cls=[names]) or
// dict(type='size_based_auto_wrap_policy', min_num_params=N); the type may carry PyTorch's module
// path), forward_prefetch, backward_prefetch ('BACKWARD_PRE', 'BACKWARD_POST' or None);
// mixed_precision=dict(param_dtype, reduce_dtype, buffer_dtype, _module_classes_to_ignore) as
// PyTorch's MixedPrecision (not with --amp), cpu_offload=True or dict(offload_params=True) (on a CPU
// run: accepted, one info line, nothing changes); docs/fsdp.md. The DDP keys are accepted at their
// defaults only (they do not apply to FSDP). `k` is checked against fsdp_schema() (the registry does).
std::shared_ptr<nn::Module> wrap_fsdp(const WrapContext& c, const Kwargs& k);
// FSDP's keyword schema (its defaults read from dist::FSDPOptions).
Schema fsdp_schema();
// ZeroRedundancyOptimizer's keyword arguments split: the optimizer_type it wraps (checked present) and
// that optimizer's own arguments (the rest, for its schema); zero_schema() is the split's schema.
Schema zero_schema();
std::pair<std::string, Kwargs> zero_inner_optimizer(const Kwargs& k);
Registry<OptimizerFactory>& optimizers();
Registry<SchedulerFactory>& param_schedulers();
Registry<HookFactory>& hooks();

// DDP's keyword arguments (model_wrapper_cfg without "type") as dist::DDPOptions. Known:
// find_unused_parameters, broadcast_buffers, bucket_cap_mb (<= 0: measured), first_bucket_cap_mb,
// gradient_as_bucket_view, static_graph, comm_hook (allreduce | fp16 | bf16 | a registered name).
// An unknown key throws naming the known ones.
dist::DDPOptions ddp_options_from_kwargs(const Kwargs& kwargs);
// DDP's keyword schema (its defaults read from dist::DDPOptions and dist::CommHookOptions).
Schema ddp_schema();
const std::vector<std::string>& ddp_kwarg_names();

}  // namespace tandem::train
