// train::Runner: MMEngine's Runner for Tandem. It builds a training job from RunnerOptions through
// the registries (train/registries.h): the model, its wrapper under DDP, the optimizer (with AMP,
// gradient accumulation and clipping, as MMEngine's OptimWrapper), the parameter schedulers, the
// evaluators (train/evaluator.h) and the hooks; then runs MMEngine's EpochBasedTrainLoop (or, with
// max_iters > 0, its IterBasedTrainLoop) with a ValLoop, calling the hooks (train/hook.h) at
// MMEngine's points; test() is the TestLoop. The model follows the model interface of
// train/model.h: a BaseModel's named losses (summed for backward, each logged) and predictions; a
// plain nn::Module is a classifier of log-probabilities (nll_loss). The default hooks (MMEngine's default_hooks, plus Tandem's stop agreement
// and loss check) are: IterTimerHook, LoggerHook, ParamSchedulerHook, CheckpointHook,
// DistSamplerSeedHook, StopAgreementHook, CheckInvalidLossHook.
//
// Resume contract: a checkpoint names the next position to run (epoch E, batches already done in
// it); everything that decides later losses (weights, BN buffers, optimizer and scaler state,
// schedule, default RNG, the epoch's sample order via (seed, epoch), the batches to skip) is
// restored, so a resumed run's per-iteration losses are bitwise those of an uninterrupted one (at an
// accumulation group's boundary, when accumulative_counts > 1).
//
// Distributed: launcher none | pytorch | slurm | mpi (dist::env_from_launcher); rank 0 hosts the
// TCP store at MASTER_PORT, or at `port` when set (MMEngine's dist_params.port). Every rank stops at
// the same iteration on SIGTERM/SIGINT (StopAgreementHook), after rank 0 saved a checkpoint.
// Errors are tandem::Error; train() returns 0, or 128 + signal after a stop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/data_loader.h"
#include "data/dataset.h"
#include "dist/parallel/ddp.h"
#include "dist/parallel/fsdp.h"
#include "dist/store/env.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/evaluator.h"
#include "train/hook.h"
#include "train/model.h"
#include "train/optim_wrapper.h"
#include "train/param_scheduler.h"
#include "train/registry.h"

namespace tandem::train {

struct HookSpec {
  std::string type;
  Kwargs args;
};

// Every default here is also the config's: the sections' schemas (train/run_config_schema.cpp) read
// them from RunnerOptions{}, so a config that leaves a key out and a RunnerOptions that leaves the
// field alone run alike (tested). The trainer's default config adds its recipe on top (the MNIST
// example's StepLR gamma 0.7 and Fashion-MNIST; train::default_run_config).
struct RunnerOptions {
  // What to build, by registry name with keyword arguments (MMEngine's `type` + the rest).
  std::string model = "MnistNet";
  Kwargs model_args{"model"};
  std::shared_ptr<nn::Module> model_instance;  // when set, used instead of building `model`
  std::string model_wrapper = "MMDistributedDataParallel";
  Kwargs model_wrapper_args{"model_wrapper_cfg"};  // DDP's keyword arguments
  std::string optimizer = "Adadelta";
  Kwargs optimizer_args{"optim_wrapper.optimizer"};  // lr, momentum, weight_decay, ...
  std::string param_scheduler = "StepLR";            // "" for none
  Kwargs param_scheduler_args{"param_scheduler"};
  // MMEngine's param_scheduler as a list (applied in order, see param_scheduler.h); when not empty
  // it is the schedule and param_scheduler / param_scheduler_args are not used.
  std::vector<SchedulerSpec> param_schedulers;
  // Data: batches reach the model as named tensors through its data preprocessor (train/model.h).
  std::shared_ptr<const data::Dataset> train_dataset, val_dataset;  // val may be null
  std::shared_ptr<const data::Dataset> test_dataset;  // test(): the test loop's (null: val_dataset)
  // val_evaluator / test_evaluator: metrics by registry name (empty: Accuracy and Loss; test: val's).
  std::vector<MetricSpec> val_evaluator, test_evaluator;
  int64_t batch_size = 64, val_batch_size = 256;
  bool shuffle = true;
  // MMEngine's sampler round_up: pad every rank's share to the same length by repeating samples.
  // false: no sample twice; ranks with fewer batches shadow the others' DDP iterations under
  // dist::Join (their optimizer takes the same steps), so every rank ends each epoch equal.
  bool pad = true;
  // train_cfg / val_cfg. max_iters > 0: MMEngine's IterBasedTrainLoop (train_cfg by_epoch=False):
  // max_iters iterations over as many epochs of the data as that takes (max_epochs is then derived),
  // validating every val_interval iterations and after the last; else val_interval counts epochs.
  int64_t max_epochs = 14;
  int64_t max_iters = 0;
  int64_t val_interval = 1;  // epochs (or iterations) between validations (0: only at the end)
  uint64_t seed = 1;
  // optim_wrapper: amp off | fp16 (loss scaling) | bf16 | auto (MMEngine's --amp: fp16 on a CUDA
  // device, bf16 on a CPU with native bf16 kernels, else off; decided once the device is known);
  // accumulative_counts; clip_grad (0: off).
  std::string amp = "off";
  // optim_wrapper.type: a registered optimizer wrapper (train/optim_wrapper.h) given amp, the
  // accumulation and clipping below as keywords; "": OptimWrapper, or AmpOptimWrapper when amp is on.
  std::string optim_wrapper;
  // AmpOptimWrapper's loss_scale as JSON text: "\"dynamic\"", a number, or a dict of GradScaler's
  // keywords (train/optim_wrapper.h); used with float16.
  std::string loss_scale = "\"dynamic\"";
  // Several optimizers (MMEngine's MultiOptimWrapperConstructor): child module name -> its wrapper's
  // config as JSON text (dict(type=..., optimizer=dict(type=..., ...), ...)). When not empty the
  // Runner builds an OptimWrapperDict over the children's parameters and trains through the model's
  // train_step (train/model.h); optimizer, amp and the accumulation / clipping fields are not used.
  std::map<std::string, std::string> optim_wrapper_dict;
  // With several optimizers, MMEngine's param_scheduler=dict(gen=[...], ...): each wrapper's own
  // schedule (a name left out has none). Empty: param_schedulers (or param_scheduler) applies to
  // every wrapper, each its own copy, as MMEngine's Runner does with a list.
  std::map<std::string, std::vector<SchedulerSpec>> param_scheduler_dict;
  int64_t accumulative_counts = 1;
  double clip_max_norm = 0.0;
  double clip_norm_type = 2.0;
  int64_t auto_scale_lr_base_batch = 0;  // 0: off; else lr *= batch x world / this
  // env_cfg, launcher, dist_params. The Runner decides each once, in setup: the device from `device`
  // and the rank's LOCAL_RANK, the backend from it (auto: nccl on CUDA, gloo on the CPU), the threads.
  std::string device = "auto";
  int threads = 0;  // CPU threads of the kernels (0: OMP_NUM_THREADS, else every core)
  std::string launcher = "none";
  std::string backend = "auto";  // auto | gloo | nccl
  double dist_timeout_s = 300.0;
  int port = 0;  // 0: MASTER_PORT
  bool sync_bn = false;
  bool cuda_graph = false;  // capture the steady-state step (CUDA, one rank; see cuda_graph_step.h)
  // Work dir, logs, checkpoints (MMEngine's default_hooks; used when default_hooks is empty).
  std::string work_dir = "work_dirs/run";
  std::string config_name;     // shown in the log
  std::string config_json;     // the resolved config as JSON text: work_dir/config.json and checkpoints
  std::vector<std::string> resume_keys;  // config keys a resumed run must share with the checkpoint's
  int64_t log_interval = 100;
  int64_t checkpoint_interval_iters = 0;   // 0: off
  int64_t checkpoint_interval_epochs = 1;  // 0: off
  int64_t max_keep_ckpts = 3;              // 0: all
  std::string save_best;                   // "" | "accuracy" | "loss": also keep the best checkpoint
  std::string metrics_out;                 // extra JSON-lines file
  // MMEngine's visualizer.vis_backends: where the LoggerHook's scalars go, in <work_dir>/vis_data:
  // "LocalVisBackend" (scalars.json), "TensorboardVisBackend" (event files); each at most once.
  std::vector<std::string> vis_backends = {"LocalVisBackend"};
  std::string resume;     // "": no; "auto": the work dir's last checkpoint; else a checkpoint path
  // Resume a checkpoint written by another number of ranks: the samples its epoch already consumed
  // (iterations x batch x its world size) stay consumed, the rest of that epoch's order is sharded over
  // this run's ranks, later epochs shard normally. Off: such a checkpoint is refused.
  bool reshard_resume = false;
  std::string load_from;  // initial weights (safetensors), when not resuming
  std::string data_description;  // logged at the start
  std::vector<HookSpec> default_hooks;  // empty: the defaults above
  std::vector<HookSpec> custom_hooks;
};

// The vis backends RunnerOptions::vis_backends may name.
inline const std::vector<std::string> kVisBackends = {"LocalVisBackend", "TensorboardVisBackend"};
// Throws, naming `where` ("visualizer.vis_backends"), for a name outside kVisBackends or one given twice.
void check_vis_backends(const std::vector<std::string>& names, const std::string& where);

class MetricsWriter;
struct Checkpoint;
class CudaGraphStep;
struct Distributed;

class Runner {
 public:
  explicit Runner(RunnerOptions options);
  // The Runner of a config tree in MMEngine's shape, given as JSON text (train/run_config.h: merged
  // onto the built-in defaults, checked against the schemas, defaults filled in, datasets built from
  // the registered dataset types).
  static std::unique_ptr<Runner> from_config(const std::string& config_json);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Adds a hook (before train()); hooks run in ascending priority, ties in registration order.
  void register_hook(std::shared_ptr<Hook> hook);
  // Builds everything, resumes or loads weights, trains; returns 0 or 128 + the stopping signal.
  int train();
  // One validation pass over val_dataset (every rank's shard, summed); calls the val hooks.
  ValMetrics val();
  // MMEngine's TestLoop: builds the job without training (the model's weights from load_from, or
  // the resumed checkpoint's), evaluates test_dataset (else val_dataset) with test_evaluator (else
  // val_evaluator) and logs the metrics. Instead of train(), on a fresh Runner.
  ValMetrics test();

  // State for hooks.
  const RunnerOptions& options() const { return o_; }
  int64_t epoch() const { return epoch_; }            // 1-based, the epoch running
  int64_t iter_in_epoch() const { return iter_; }      // 1-based, the iteration just run
  int64_t global_iter() const { return global_iter_; }  // iterations done in the whole run
  int64_t iters_per_epoch() const { return iters_; }
  int64_t max_epochs() const { return o_.max_epochs; }
  bool by_epoch() const { return o_.max_iters <= 0; }
  // Iterations of the whole run: train_cfg.max_iters, or max_epochs x iterations per epoch.
  int64_t max_iters() const { return by_epoch() ? o_.max_epochs * iters_ : o_.max_iters; }
  double base_lr() const { return base_lr_; }  // the first group's lr before any schedule (MMEngine's base_lr)
  int64_t epoch_samples() const { return epoch_samples_; }  // this rank's samples this epoch
  // Every rank's samples this epoch: world x this rank's when shares are padded to one length;
  // without padding the dataset's size (a whole epoch; a resumed one counts as whole too).
  int64_t epoch_samples_all() const;
  int rank() const { return env_.rank; }
  int world_size() const { return world_; }
  const std::string& work_dir() const { return o_.work_dir; }
  Device device() const { return device_; }
  nn::Module& model() { return *net_; }  // unwrapped
  nn::Module& wrapped_model() { return *wrapped_; }
  // The model's loss and predict heads: the model itself when it is a BaseModel, else ClassifierTask.
  ModelTask& task() { return *task_; }
  dist::DistributedDataParallel* ddp() { return ddp_; }  // null without DDP or for another wrapper
  dist::FullyShardedDataParallel* fsdp() { return fsdp_; }  // null unless the wrapper is FSDP
  // The optimizer wrapper built through optim_wrappers() (AMP, accumulation, clipping) and its parts;
  // with several optimizers, the first of optim_wrapper_dict() by name (the lr the log shows).
  OptimWrapper& optim_wrapper() { return *primary_; }
  optim::Optimizer& optimizer() { return primary_->optimizer(); }
  optim::GradScaler& scaler() { return primary_->scaler(); }
  // The wrappers of several optimizers (RunnerOptions::optim_wrapper_dict); null with one.
  OptimWrapperDict* optim_wrapper_dict() { return optim_dict_.get(); }
  SchedulerList& schedulers() { return schedulers_; }  // empty without param_scheduler
  data::DataLoader& train_loader() { return *train_loader_; }
  MetricsWriter* metrics() { return metrics_.get(); }
  dist::ProcessGroup* host_group();  // the group of the per-iteration stop agreement, or null
  // DistSamplerSeedHook sets the epoch the sampler shuffles with (default 0: the same order each epoch).
  void set_sampler_epoch(int64_t e) { sampler_epoch_ = e; }
  // The timings IterTimerHook measured for the current iteration (seconds).
  void set_times(double data_time, double iter_time) { data_time_ = data_time, iter_time_ = iter_time; }
  double data_time() const { return data_time_; }
  double iter_time() const { return iter_time_; }
  // The agreed stop signal (StopAgreementHook); 0 while training goes on.
  void set_stop(int sig) { stop_ = sig; }
  int stop() const { return stop_; }
  // MMEngine's train_loop.stop_training (EarlyStoppingHook): the run ends, normally, after the
  // current epoch's validation; train() returns 0.
  void stop_training() { stop_training_ = true; }
  bool training_stopped() const { return stop_training_; }
  // Saves the position "epoch `epoch`, `done` batches of it finished" (rank 0 writes; others return "").
  // Call it on every rank: under FSDP it first gathers the weights and the optimizer state (collective).
  // `path` "": into the work dir's rotation (iter_<global>, keeping max_keep; -1: the options'
  // max_keep_ckpts); else exactly there, outside the rotation.
  std::string save_checkpoint(int64_t epoch, int64_t done, const std::string& path = "", int64_t max_keep = -1);
  void info(const std::string& line);  // rank 0's log (console and the work dir's log file)

 private:
  void setup();
  void setup_distributed();
  void setup_data();
  void setup_model();
  void setup_optimizer();
  void setup_optimizer_dict();  // several optimizers (runner_optim_dict.cpp)
  // Builds `specs` in order over `opt` (each applies its first value) into schedulers_.
  void add_schedulers(optim::Optimizer& opt, const std::vector<SchedulerSpec>& specs);
  IterOutputs dict_step(const DataBatch& batch);  // the model's train_step through the dict
  void save_optim_state(Checkpoint& c);           // every wrapper's optimizer and scaler state
  void load_optim_state(const Checkpoint& c);
  std::unique_ptr<optim::Optimizer> make_optimizer(const Kwargs& args);
  std::unique_ptr<OptimWrapper> make_optim_wrapper(std::unique_ptr<optim::Optimizer> optimizer);
  void setup_hooks();
  void load_resume_checkpoint();
  void resume_or_load();
  void reshard_epoch(const Checkpoint& c);  // applies a resumed epoch's offset (epoch_offset_) to the sampler
  void run_epoch();
  IterOutputs run_iter(const data::Batch& batch);
  IterOutputs eager_step(const DataBatch& batch);
  void step_optimizer(IterOutputs& out, bool to_none);  // clipping, AMP, the step (eager_step's end)
  void train_batches(int64_t first);  // the epoch's batches, then (pad false) Join's shadowing
  void shadow_iter(bool synced);      // a joined rank's part in one iteration of the others
  // The summed loss of the batch (named losses into `named` when given), under autocast.
  Tensor forward_loss(const DataBatch& batch, IterOutputs* named = nullptr);
  ValMetrics evaluate(data::DataLoader& loader, Evaluator& evaluator);  // val()'s and test()'s pass
  bool validate_after_iter() const;  // IterBasedTrainLoop: a validation is due after this iteration
  int finish();
  template <typename F>
  void call_hooks(F&& f) {
    for (auto& h : hooks_) f(*h);
  }

  RunnerOptions o_;
  dist::DistEnv env_;
  int world_ = 1;
  double base_lr_ = 0;
  Device device_ = Device::cpu();
  std::unique_ptr<Distributed> dist_;
  std::shared_ptr<data::Sampler> train_sampler_, val_sampler_;
  std::unique_ptr<data::DataLoader> train_loader_, val_loader_;
  std::shared_ptr<nn::Module> net_, wrapped_;
  ModelTask* task_ = nullptr;
  std::unique_ptr<ModelTask> default_task_;  // a plain module's (ClassifierTask)
  std::unique_ptr<Evaluator> val_evaluator_;
  dist::DistributedDataParallel* ddp_ = nullptr;
  dist::FullyShardedDataParallel* fsdp_ = nullptr;
  std::unique_ptr<OptimWrapper> optim_wrapper_;
  std::unique_ptr<OptimWrapperDict> optim_dict_;
  OptimWrapper* primary_ = nullptr;  // optim_wrapper_, or the dict's first
  SchedulerList schedulers_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<CudaGraphStep> graph_step_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  std::string resume_path_;
  std::unique_ptr<Checkpoint> resume_ckpt_;  // the checkpoint being resumed from, until applied
  int64_t epoch_ = 1, iter_ = 0, global_iter_ = 0, iters_ = 0, start_epoch_ = 1, skip_ = 0;
  int64_t epoch_samples_ = 0, sampler_epoch_ = 0;
  // Positions of the current epoch's common order consumed before this run's sharding of it (a
  // re-sharded resume; 0 otherwise). Saved with a mid-epoch checkpoint.
  int64_t epoch_offset_ = 0;
  double data_time_ = 0, iter_time_ = 0;
  int stop_ = 0;
  bool stop_training_ = false;
  bool set_up_ = false;
};

}  // namespace tandem::train
