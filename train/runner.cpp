// train::Runner (see runner.h): building the job, the epoch loop and the validation loop. The
// iteration itself is in runner_step.cpp, checkpoints and resume in runner_checkpoint.cpp.
#include "train/runner.h"

#include <spdlog/spdlog.h>

#include <signal.h>
#include <spdlog/sinks/basic_file_sink.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/autograd.h"
#include "core/profiler.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "data/distributed_sampler.h"
#include "data/sampler.h"
#include "dist/group/host_values.h"
#include "dist/parallel/join.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/sync_batch_norm.h"
#include "dist/parallel/zero_redundancy_optimizer.h"
#include "dist/store/tcp_store.h"
#include "kernels/amp.h"
#include "nn/amp.h"
#include "nn/functional.h"
#include "optim/clip_grad.h"
#include "train/checkpoint.h"
#include "train/sharded_checkpoint.h"
#include "train/cuda_graph_step.h"
#include "train/metrics_writer.h"
#include "train/registries.h"
#include "train/runner_internal.h"
#include "train/work_dir.h"

namespace tandem::train {

Runner::Runner(RunnerOptions options) : o_(std::move(options)) {
  TANDEM_CHECK(o_.max_epochs >= 1, "train_cfg.max_epochs must be >= 1, got ", o_.max_epochs);
  TANDEM_CHECK(o_.batch_size >= 1, "the batch size must be >= 1, got ", o_.batch_size);
  TANDEM_CHECK(o_.clip_max_norm >= 0, "optim_wrapper.clip_grad.max_norm must be > 0, got ", o_.clip_max_norm);
  TANDEM_CHECK(o_.train_dataset != nullptr, "Runner: no train_dataset given");
  TANDEM_CHECK(o_.amp == "off" || o_.amp == "fp16" || o_.amp == "bf16" || o_.amp == "auto",
               "amp must be off, fp16, bf16 or auto, got '", o_.amp, "'");
  TANDEM_CHECK(o_.threads >= 0, "env_cfg threads (--threads) must be >= 0, got ", o_.threads);
  TANDEM_CHECK(!o_.work_dir.empty(), "Runner: no work_dir given");
  TANDEM_CHECK(o_.max_iters >= 0, "train_cfg.max_iters must be >= 1, got ", o_.max_iters);
  TANDEM_CHECK(o_.val_interval >= 0, "train_cfg.val_interval must be >= 0, got ", o_.val_interval);
  TANDEM_CHECK(o_.max_iters == 0 || o_.pad, "train_cfg.by_epoch False (max_iters) needs ",
               "train_dataloader.sampler.round_up true: every rank must run the same iterations");
  // Every registered name is looked up now, so an unknown one fails before anything runs or logs.
  if (!o_.model_instance) models().get(o_.model);
  model_wrappers().get(o_.model_wrapper);
  optimizers().get(o_.optimizer);
  for (const SchedulerSpec& s : scheduler_specs(o_)) param_schedulers().get(s.type);
  for (const auto* specs : {&o_.default_hooks, &o_.custom_hooks})
    for (const HookSpec& s : *specs) hooks().get(s.type);
  for (const auto* specs : {&o_.val_evaluator, &o_.test_evaluator})
    for (const MetricSpec& s : *specs) metric_types().get(s.type);
  check_vis_backends(o_.vis_backends, "visualizer.vis_backends");
}

Runner::~Runner() = default;

void Runner::register_hook(std::shared_ptr<Hook> hook) {
  TANDEM_CHECK(hook != nullptr, "Runner::register_hook: null hook");
  auto at = std::upper_bound(hooks_.begin(), hooks_.end(), hook,
                             [](const auto& a, const auto& b) { return a->priority() < b->priority(); });
  hooks_.insert(at, std::move(hook));
}

dist::ProcessGroup* Runner::host_group() { return dist_ && dist_->active() ? dist_->host_group.get() : nullptr; }

void Runner::info(const std::string& line) { spdlog::info("{}", line); }

int64_t Runner::epoch_samples_all() const {
  if (!o_.pad && world_ > 1) return o_.train_dataset->size();
  return epoch_samples_ * world_;
}

void Runner::setup() {
  env_ = o_.launcher == "none" ? dist::DistEnv{} : dist::env_from_launcher(o_.launcher);
  if (o_.port > 0) env_.master_port = o_.port;  // dist_params.port
  if (o_.threads > 0) set_num_threads(o_.threads);
  device_ = dist::resolve_device(o_.device, env_.local_rank);
  if (device_.is_cuda()) set_cuda_device(device_.index);
  if (o_.amp == "auto") {  // torch.autocast's defaults, except where the CPU would only emulate bf16
    o_.amp = device_.is_cuda() ? "fp16" : kernels::cpu_bf16_pays() ? "bf16" : "off";
    if (o_.amp == "off") {
      spdlog::info("amp: auto runs float32 here: this CPU (or this build) has no native bf16 kernels, so bf16 "
                   "would be emulated and slower; --amp bf16 forces it");
    }
  }
  const std::string why = o_.cuda_graph ? cuda_graph_refusal(o_, device_, env_.world_size) : "";
  TANDEM_CHECK(why.empty(), why);
  if (env_.rank == 0) {  // rank 0 writes the job's files
    create_work_dir(o_.work_dir);
    const std::string stamp = run_timestamp();
    log_to_file(o_.work_dir + "/" + stamp + ".log");
    Json resolved = o_.config_json.empty() ? Json::object() : Json::parse(o_.config_json);
    resolved["work_dir"] = o_.work_dir;
    write_file_atomic(o_.work_dir + "/config.json", resolved.dump(2) + "\n");
    metrics_ = std::make_unique<MetricsWriter>();
    metrics_->add(o_.metrics_out, /*append=*/!o_.resume.empty());
    metrics_->add(o_.work_dir + "/" + stamp + ".metrics.jsonl", /*append=*/true);
  }
  setup_distributed();
  if (env_.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 speaks for the job
  manual_seed(o_.seed);
  if (!o_.resume.empty()) resume_path_ = o_.resume == "auto" ? CheckpointManager::latest(o_.work_dir) : o_.resume;
  setup_data();
  load_resume_checkpoint();
  setup_model();
  setup_optimizer();
  setup_hooks();
  resume_or_load();
  set_up_ = true;
}

void Runner::setup_distributed() {
  dist_ = std::make_unique<Distributed>();
  // A launched job is distributed whatever its size: one rank too gets its group, the model
  // wrapper (DDP's reducer) and SyncBatchNorm, as PyTorch DDP with world size 1.
  if (o_.launcher == "none") return;
  std::string backend = o_.backend;
  if (backend == "auto") backend = device_.is_cuda() ? "nccl" : "gloo";
  TANDEM_CHECK(backend != "nccl" || device_.is_cuda(), "backend nccl needs a CUDA device, got device ",
               device_.str());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.dist_timeout_s * 1000));
  dist::TCPStoreOptions so;
  so.timeout = timeout;
  so.num_workers = env_.world_size;
  dist_->store = std::make_shared<dist::TCPStore>(env_.master_addr, env_.master_port, env_.rank == 0, so);
  dist_->group = dist::make_process_group(backend, dist_->store, env_.rank, env_.world_size, timeout,
                                          device_.is_cuda() ? device_.index : -1);
  // The stop agreement runs on the host: a device group's result would wait behind the whole step.
  dist_->host_group = dist_->group->comm_device().is_cpu()
                          ? dist_->group
                          : dist::make_process_group("gloo", dist_->store, env_.rank, env_.world_size, timeout);
  world_ = env_.world_size;
}

void Runner::setup_data() {
  const auto& train_set = o_.train_dataset;
  const int rank = env_.rank;
  if (dist_->active()) {
    train_sampler_ = std::make_shared<data::DistributedSampler>(train_set->size(), world_, rank, o_.shuffle, o_.seed,
                                                                /*drop_last=*/false, o_.pad);
    if (o_.val_dataset) val_sampler_ = std::make_shared<data::ShardSampler>(o_.val_dataset->size(), world_, rank);
  } else {
    if (o_.shuffle)
      train_sampler_ = std::make_shared<data::RandomSampler>(train_set->size(), o_.seed);
    else
      train_sampler_ = std::make_shared<data::SequentialSampler>(train_set->size());
    if (o_.val_dataset) val_sampler_ = std::make_shared<data::SequentialSampler>(o_.val_dataset->size());
  }
  train_loader_ = std::make_unique<data::DataLoader>(train_set, train_sampler_, o_.batch_size);
  if (o_.val_dataset) val_loader_ = std::make_unique<data::DataLoader>(o_.val_dataset, val_sampler_, o_.val_batch_size);
  iters_ = train_loader_->num_batches();
  if (!o_.pad && dist_->active()) {  // every rank counts the longest share's batches (schedules, logs)
    const int64_t longest = data::DistributedSampler(train_set->size(), world_, 0, false, 0).num_samples();
    iters_ = (longest + o_.batch_size - 1) / o_.batch_size;
  }
  TANDEM_CHECK(iters_ >= 1, "the train dataset yields no batch (", train_set->size(), " samples)");
  if (!by_epoch()) o_.max_epochs = (o_.max_iters + iters_ - 1) / iters_;  // the epochs max_iters runs through
  val_evaluator_ = std::make_unique<Evaluator>(o_.val_evaluator.empty() ? default_evaluator() : o_.val_evaluator);
  if (!o_.data_description.empty()) info("data: " + o_.data_description);
  info("device: " + device_.str() + ", threads: " + std::to_string(num_threads()));
  info("work dir: " + o_.work_dir + (o_.config_name.empty() ? "" : " (config " + o_.config_name + ")"));
}

void Runner::setup_model() {
  net_ = o_.model_instance ? o_.model_instance : models().get(o_.model)(o_.model_args);
  TANDEM_CHECK(net_ != nullptr, "model '", o_.model, "': the factory returned no model");
  if (resume_ckpt_ && !is_sharded(*resume_ckpt_)) {  // a sharded one loads into the wrapper (resume_or_load)
    try {
      net_->load_state_dict(resume_ckpt_->weights);
    } catch (const Error& e) {
      TANDEM_FAIL("checkpoint '", resume_path_, "': ", e.what());
    }
  } else if (!o_.load_from.empty()) {
    load_weights_or_shards(*net_, o_.load_from);
    info("initial weights: " + o_.load_from);
  }
  net_->to(device_);
  net_->train();
  task_ = dynamic_cast<ModelTask*>(net_.get());
  if (!task_) {
    default_task_ = std::make_unique<ClassifierTask>();
    task_ = default_task_.get();
  }
  wrapped_ = net_;
  const WrapperFactory wrap = model_wrappers().get(o_.model_wrapper);  // an unknown name fails here, DDP or not
  if (!dist_->active()) return;
  if (o_.sync_bn) {
    const int n = dist::convert_sync_batchnorm(*net_, dist_->group);
    info("sync_bn: " + std::to_string(n) + " BatchNorm layer(s) synchronised across " + std::to_string(world_) +
         " ranks");
  }
  spdlog::info("distributed: {} ranks over {} (launcher {}), store {}:{}, wrapper {}", world_,
               dist_->group->backend(), o_.launcher, env_.master_addr, env_.master_port, o_.model_wrapper);
  wrapped_ = wrap(WrapContext{net_, dist_->group, dist_->store, env_.local_rank, env_.local_world_size},
                  o_.model_wrapper_args);
  TANDEM_CHECK(wrapped_ != nullptr, "model_wrapper_cfg.type '", o_.model_wrapper, "': the factory returned no model");
  ddp_ = dynamic_cast<dist::DistributedDataParallel*>(wrapped_.get());
  fsdp_ = dynamic_cast<dist::FullyShardedDataParallel*>(wrapped_.get());
  if (fsdp_) {
    info("fsdp: " + std::string(dist::sharding_strategy_name(fsdp_->options().sharding_strategy)) + ", " +
         std::to_string(fsdp_->units().size()) + " unit(s), this rank holds " +
         std::to_string(fsdp_->memory().shard_bytes) + " bytes of parameters");
    TANDEM_CHECK(!o_.cuda_graph, "--cuda-graph cannot capture FullyShardedDataParallel's gathers; leave it off");
    TANDEM_CHECK(o_.clip_max_norm <= 0 || o_.clip_norm_type == 2.0, "optim_wrapper.clip_grad.norm_type ",
                 o_.clip_norm_type, " with MMFullyShardedDataParallel: only the 2-norm is computed over shards");
  }
  if (ddp_) {
    if (const auto& a = ddp_->reducer().auto_bucket_cap(); a.measured)
      spdlog::info("auto bucket cap: all-reduce latency {:.0f} us, bandwidth {:.2f} GB/s -> {:.2f} MiB",
                   a.latency_us, a.bandwidth_gbps, a.cap_mb);
  }
  TANDEM_CHECK(o_.pad || ddp_, "train_dataloader.sampler.round_up false (--no-pad) needs a wrapper derived from "
               "DistributedDataParallel (its Join shadows the iterations of ranks with more batches)");
  TANDEM_CHECK(o_.pad || !o_.sync_bn, "train_dataloader.sampler.round_up false (--no-pad) cannot be combined with "
               "SyncBatchNorm (--sync-bn): its all-reduces inside forward have no one to meet on a rank out of batches");
  TANDEM_CHECK(ddp_ || fsdp_ || o_.accumulative_counts <= 1, "optim_wrapper.accumulative_counts > 1 needs a wrapper "
               "derived from DistributedDataParallel or FullyShardedDataParallel (for no_sync); model_wrapper_cfg.type '",
               o_.model_wrapper, "' is neither");
}

// optim_wrapper.optimizer: a registered optimizer over the wrapper's parameters; or MMEngine's
// ZeroRedundancyOptimizer (optimizer_type: the registered optimizer whose state it shards across the
// ranks; alone it is that optimizer, as PyTorch's is over a world of one).
std::unique_ptr<optim::Optimizer> Runner::make_optimizer(const Kwargs& args) {
  if (o_.optimizer != "ZeroRedundancyOptimizer" || !dist_->active())  // alone: the registry's entry
    return optimizers().get(o_.optimizer)(wrapped_->parameters(), args);
  const auto split = zero_inner_optimizer(args);
  const std::string inner = split.first;
  const Kwargs rest = split.second;
  TANDEM_CHECK(!fsdp_, "optim_wrapper.optimizer type ZeroRedundancyOptimizer with MMFullyShardedDataParallel: FSDP "
                       "already shards the optimizer state; use '", inner, "' itself");
  const OptimizerFactory make = optimizers().get(inner);
  std::unique_ptr<optim::Optimizer> whole = make(wrapped_->parameters(), rest);  // its groups' lr and weight decay
  auto local = [make, rest](std::vector<optim::ParamGroup> groups) {
    std::vector<Tensor> params;
    for (const auto& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
    std::unique_ptr<optim::Optimizer> o = make(params, rest);
    o->param_groups().front().lr = groups.front().lr;
    o->param_groups().front().weight_decay = groups.front().weight_decay;
    return o;
  };
  TANDEM_CHECK(whole->param_groups().size() == 1, "ZeroRedundancyOptimizer: optimizer_type '", inner,
               "' made ", whole->param_groups().size(), " parameter groups; one is supported");
  auto zero = std::make_unique<dist::ZeroRedundancyOptimizer>(whole->param_groups(), local, dist_->group);
  info("optimizer: ZeroRedundancyOptimizer over " + inner + ", this rank steps " +
       std::to_string(zero->shard(env_.rank).size()) + " of " + std::to_string(wrapped_->parameters().size()) +
       " parameters");
  return zero;
}

// optim_wrapper: OptimWrapper, or AmpOptimWrapper with the precision decided for the device, built
// through optim_wrappers() from the options' accumulation, clipping and amp.
std::unique_ptr<OptimWrapper> Runner::make_optim_wrapper(std::unique_ptr<optim::Optimizer> optimizer) {
  const amp::Precision precision = amp::parse_precision(o_.amp);
  Kwargs k("optim_wrapper");
  k.set_json("accumulative_counts", std::to_string(o_.accumulative_counts));
  if (o_.clip_max_norm > 0)
    k.set_json("clip_grad", Json{{"max_norm", o_.clip_max_norm}, {"norm_type", o_.clip_norm_type}}.dump());
  if (precision != amp::Precision::kOff) k.set("dtype", precision == amp::Precision::kFloat16 ? "float16" : "bfloat16");
  if (precision != amp::Precision::kOff && o_.loss_scale != "\"dynamic\"") k.set_json("loss_scale", o_.loss_scale);
  const bool off = precision == amp::Precision::kOff;
  const std::string type = !o_.optim_wrapper.empty() ? o_.optim_wrapper : off ? "OptimWrapper" : "AmpOptimWrapper";
  TANDEM_CHECK(type != "OptimWrapper" || off, "optim_wrapper.type 'OptimWrapper' is float32; amp ", o_.amp,
               " needs 'AmpOptimWrapper'");
  auto w = optim_wrappers().get(type)(std::move(optimizer), k);
  TANDEM_CHECK(w != nullptr, "optim_wrapper: the factory returned no wrapper");
  if (fsdp_)  // the norm needs every rank's shards
    w->set_clip([this](double max_norm, double) { return fsdp_->clip_grad_norm_(max_norm); });
  else
    w->set_clip([this](double max_norm, double norm_type) {
      return optim::clip_grad_norm_(wrapped_->parameters(), max_norm, norm_type).item<double>();
    });
  return w;
}

void Runner::add_schedulers(optim::Optimizer& opt, const std::vector<SchedulerSpec>& specs) {
  ScheduleContext sc{&opt, iters_, o_.max_epochs, {}};
  for (const auto& g : opt.param_groups()) sc.initial_lrs.push_back(g.lr);
  for (const SchedulerSpec& s : specs) {
    std::unique_ptr<ParamScheduler> built = param_schedulers().get(s.type)(sc, s.args);
    TANDEM_CHECK(built != nullptr, "param_scheduler type '", s.type, "': the factory returned no scheduler");
    schedulers_.add(std::move(built));
  }
}

void Runner::setup_optimizer() {
  if (!o_.optim_wrapper_dict.empty()) return setup_optimizer_dict();
  TANDEM_CHECK(o_.param_scheduler_dict.empty(), "param_scheduler as a dict of lists, one per optimizer, needs several "
               "optimizers (optim_wrapper with constructor='MultiOptimWrapperConstructor')");
  Kwargs args = o_.optimizer_args;
  const double lr = args.number("lr", 1.0);
  if (o_.auto_scale_lr_base_batch > 0) {
    const double scaled = lr * static_cast<double>(o_.batch_size * world_) /
                          static_cast<double>(o_.auto_scale_lr_base_batch);
    spdlog::info("auto-scale-lr: lr {} x ({} x {}) / {} = {}", lr, o_.batch_size, world_,
                 o_.auto_scale_lr_base_batch, scaled);
    args.set("lr", scaled);
  }
  optim_wrapper_ = make_optim_wrapper(make_optimizer(args));
  primary_ = optim_wrapper_.get();
  base_lr_ = optimizer().lr();
  add_schedulers(optimizer(), scheduler_specs(o_));
  const amp::Precision precision = amp::parse_precision(o_.amp);
  if (precision != amp::Precision::kOff)
    spdlog::info("amp: {} autocast{}", amp::precision_name(precision), scaler().enabled() ? " with loss scaling" : "");
  if (o_.accumulative_counts > 1 || o_.clip_max_norm > 0)
    spdlog::info("optim_wrapper: accumulative_counts {}, clip_grad {}", o_.accumulative_counts,
                 o_.clip_max_norm > 0 ? "max_norm " + std::to_string(o_.clip_max_norm) + ", norm_type " +
                                            std::to_string(o_.clip_norm_type)
                                      : std::string("off"));
  if (o_.cuda_graph) graph_step_ = std::make_unique<CudaGraphStep>(*net_, device_, o_.optimizer);
}

void Runner::setup_hooks() {
  std::vector<HookSpec> specs = o_.default_hooks.empty() ? default_hook_specs(o_) : o_.default_hooks;
  specs.insert(specs.end(), o_.custom_hooks.begin(), o_.custom_hooks.end());
  for (const HookSpec& s : specs) register_hook(hooks().get(s.type)(s.args));
}

int Runner::train() {
  TANDEM_CHECK(!set_up_, "Runner::train: already ran");
  profiler::Section section("training");  // evaluate() opens "evaluation" inside it
  setup();
  const std::string batch = std::to_string(o_.batch_size) +
                            (world_ > 1 ? " per rank x " + std::to_string(world_) + " ranks" : "");
  const std::string opt = optim_dict_ ? "optim_wrapper " + optim_dict_->names().front() + " (first of " +
                                            std::to_string(optim_dict_->size()) + ")" : o_.optimizer;
  if (!resume_path_.empty() && global_iter_ >= max_iters())
    spdlog::info("the run is finished: its last checkpoint, {}, is at global iteration {} of {}; nothing is left to "
                 "train (to train longer, raise {} and resume)", resume_path_, global_iter_, max_iters(),
                 by_epoch() ? "train_cfg.max_epochs (--epochs)" : "train_cfg.max_iters");
  else if (by_epoch())
    spdlog::info("training: {} epochs x {} iterations, batch {}, {} lr {}", o_.max_epochs, iters_, batch,
                 opt, optimizer().lr());
  else
    spdlog::info("training: {} iterations ({} per epoch), batch {}, {} lr {}", o_.max_iters, iters_, batch,
                 opt, optimizer().lr());
  call_hooks([&](Hook& h) { h.before_run(*this); });
  if (optim_dict_)
    for (const std::string& name : optim_dict_->names()) optim_dict_->at(name).initialize_count_status(global_iter_, max_iters());
  else
    optim_wrapper_->initialize_count_status(global_iter_, max_iters());
  for (epoch_ = start_epoch_; epoch_ <= o_.max_epochs && stop_ == 0 && global_iter_ < max_iters(); ++epoch_) {
    run_epoch();
    if (stop_ != 0 || stop_training_) break;  // a signal, or EarlyStoppingHook after a validation
    if (by_epoch() && val_loader_ &&
        ((o_.val_interval > 0 && epoch_ % o_.val_interval == 0) || epoch_ == o_.max_epochs))
      val();
    if (stop_training_) break;  // EarlyStoppingHook: this epoch was the last
  }
  epoch_ = std::min(epoch_, o_.max_epochs);
  return finish();
}

void Runner::run_epoch() {
  const int64_t first = epoch_ == start_epoch_ ? skip_ : 0;
  if (epoch_ != start_epoch_) epoch_offset_ = 0;
  epoch_samples_ = 0;
  call_hooks([&](Hook& h) { h.before_train_epoch(*this); });
  train_loader_->begin_epoch(sampler_epoch_, first);
  train_batches(first);
  if (stop_ != 0 || iter_ < iters_) return;  // stopped, or max_iters reached inside the epoch
  iter_ = iters_;
  call_hooks([&](Hook& h) { h.after_train_epoch(*this); });
}

void Runner::train_batches(int64_t first) {
  // Without padding the ranks' batch counts differ: the ones that run out shadow the others.
  std::optional<dist::Join> join;
  if (!o_.pad && ddp_) join.emplace(*ddp_);
  for (iter_ = first + 1;; ++iter_) {
    auto batch = train_loader_->next();
    if (!batch) break;
    call_hooks([&](Hook& h) { h.before_train_iter(*this); });
    IterOutputs out = run_iter(*batch);
    out.indices = batch->indices;
    ++global_iter_;
    epoch_samples_ += out.batch_size;
    call_hooks([&](Hook& h) { h.after_train_iter(*this, out); });
    if (stop_ != 0) break;
    if (!by_epoch() && val_loader_ && validate_after_iter()) val();
    if (!by_epoch() && (global_iter_ >= max_iters() || stop_training_)) return;
  }
  if (!join) return;
  --iter_;  // the last batch run (shadow_iter counts on from it)
  // A joined rank takes part with zeros; its own gradients from before must not add to its steps.
  optimizer().zero_grad(!o_.model_wrapper_args.boolean("gradient_as_bucket_view", false));
  const int64_t shadowed = join->join([this](bool synced) {
    if (stop_ == 0) shadow_iter(synced);
  });
  if (shadowed > 0) info("rank " + std::to_string(env_.rank) + " ran out of batches: shadowed " +
                         std::to_string(shadowed) + " iteration(s) of the others");
}

bool Runner::validate_after_iter() const {
  return (o_.val_interval > 0 && global_iter_ % o_.val_interval == 0) || global_iter_ == max_iters();
}

ValMetrics Runner::evaluate(data::DataLoader& loader, Evaluator& evaluator) {
  profiler::Section section("evaluation");
  evaluator.reset();
  // Under DDP each rank evaluates its shard with its own buffers (BatchNorm statistics moved with
  // its own last batch), as PyTorch DDP and MMEngine's ValLoop do; the checkpoint holds rank 0's.
  {
    NoGradGuard no_grad;
    // FSDP's parameters are sharded between steps: evaluation runs through the wrapper, which gathers.
    nn::Module& model = fsdp_ ? *wrapped_ : *net_;
    model.eval();
    loader.begin_epoch(0);
    const amp::Precision precision = amp::parse_precision(o_.amp);
    while (auto batch = loader.next()) {
      const DataBatch b = task_->data_preprocessor()(*batch, device_);
      Tensor outputs;
      {
        amp::AutocastGuard autocast(precision);  // the network under autocast, the heads after it
        outputs = model(batch_tensor(b, "inputs"));
      }
      evaluator.process(b, task_->predict(outputs, b), sum_losses(task_->loss(outputs, b)).item<double>());
    }
    model.train();
  }
  // Each rank evaluated its own shard: the evaluator adds up the metrics' sums.
  return evaluator.evaluate(dist_->active() ? dist_->group.get() : nullptr);
}

ValMetrics Runner::val() {
  TANDEM_CHECK(val_loader_ != nullptr, "Runner::val: no val_dataset given");
  call_hooks([&](Hook& h) { h.before_val_epoch(*this); });
  const ValMetrics r = evaluate(*val_loader_, *val_evaluator_);
  call_hooks([&](Hook& h) { h.after_val_epoch(*this, r); });
  return r;
}

ValMetrics Runner::test() {
  TANDEM_CHECK(!set_up_, "Runner::test: the Runner already ran; test on a fresh one");
  const auto& set = o_.test_dataset ? o_.test_dataset : o_.val_dataset;
  TANDEM_CHECK(set != nullptr, "Runner::test: no test_dataset (or val_dataset) given");
  TANDEM_CHECK(!o_.load_from.empty() || !o_.resume.empty(), "Runner::test: no weights to test; set load_from ",
               "(or resume) to a checkpoint");
  setup();
  std::shared_ptr<data::Sampler> sampler;
  if (dist_->active())
    sampler = std::make_shared<data::ShardSampler>(set->size(), world_, env_.rank);
  else
    sampler = std::make_shared<data::SequentialSampler>(set->size());
  data::DataLoader loader(set, sampler, o_.val_batch_size);
  Evaluator evaluator(!o_.test_evaluator.empty()   ? o_.test_evaluator
                      : !o_.val_evaluator.empty() ? o_.val_evaluator
                                                  : default_evaluator());
  const ValMetrics r = evaluate(loader, evaluator);
  std::string line = "Epoch(test) [" + std::to_string(set->size()) + " samples]";
  for (const auto& [name, value] : r.values) line += fmt::format(" {}: {:.4f}", name, value);
  info(line);
  if (dist_->active()) dist_->group->barrier()->wait(dist_->group->timeout());
  return r;
}

int Runner::finish() {
  if (stop_ != 0) {
    // Every rank waits until rank 0's checkpoint is on disk before anyone exits.
    if (dist_->active()) dist_->group->barrier()->wait(dist_->group->timeout());
    spdlog::info("stopped by signal {} ({}); resume with --resume (work dir {})", stop_,
                 stop_ == SIGTERM ? "SIGTERM" : stop_ == SIGINT ? "SIGINT" : "signal", o_.work_dir);
    return 128 + stop_;
  }
  if (graph_step_) graph_step_->report();
  call_hooks([&](Hook& h) { h.after_run(*this); });
  // Every rank returns only once rank 0's last checkpoint is on disk (a resume may follow at once).
  if (dist_->active()) dist_->group->barrier()->wait(dist_->group->timeout());
  return 0;
}

}  // namespace tandem::train
