// The training job of tandem-mnist over train::Runner: the MNIST data sets, RunnerOptions from the
// resolved options, tandem-mnist's test hooks (--debug-*), and the refusals worded with this
// program's flags. Everything else (the loop, DDP, AMP, accumulation, clipping, checkpoints and
// exact resume, logs, the stop on SIGTERM/SIGINT) is the Runner's and its hooks'.
#include "trainer.h"

#include <spdlog/spdlog.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/profiler.h"
#include "core/thread_pool.h"
#include "data/mnist.h"
#include "dist/store/env.h"
#include "kernels/linear.h"
#include "train/models/zoo.h"
#include "train/registries.h"
#include "train/runner.h"
#include "train/stop_signal.h"
#include "train/work_dir.h"

namespace tandem::app {
namespace {

// How many times tandem-run (or torchrun) restarted this job's workers: TORCHELASTIC_RESTART_COUNT.
int restart_count() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return v ? std::atoi(v) : 0;
}

// --debug-sigterm-at / --debug-hold-at: before the stop agreement, so the signal is seen this
// iteration; --debug-sigkill-at: after the checkpoint of this iteration (first attempt only, so a
// restarted group can finish).
class DebugSignalHook : public train::Hook {
 public:
  DebugSignalHook(const TrainOptions& o, bool after_checkpoint) : o_(o), late_(after_checkpoint) {}
  std::string name() const override { return late_ ? "DebugKillHook" : "DebugSignalHook"; }
  int priority() const override { return late_ ? train::kLowest : train::kLow + 4; }
  void after_train_iter(train::Runner& r, const train::IterOutputs&) override {
    const int64_t g = r.global_iter();
    if (late_) {
      if (r.rank() == o_.debug_sigkill_rank && o_.debug_sigkill_at == g && restart_count() == 0) ::raise(SIGKILL);
      return;
    }
    if (r.rank() == 0 && o_.debug_sigterm_at == g) ::raise(SIGTERM);
    if (o_.debug_hold_at == g) {  // hold until a signal arrives (at most 120 s)
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (train::StopSignal::requested() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  const TrainOptions& o_;
  bool late_;
};

// --debug-samples-out: every rank appends "epoch iter index..." for each batch it trained on.
class DebugSamplesHook : public train::Hook {
 public:
  explicit DebugSamplesHook(std::string path) : path_(std::move(path)) {}
  std::string name() const override { return "DebugSamplesHook"; }
  void after_train_iter(train::Runner& r, const train::IterOutputs& out) override {
    if (!file_.is_open()) file_.open(path_ + ".rank" + std::to_string(r.rank()), std::ios::app);
    file_ << r.epoch() << ' ' << r.iter_in_epoch();
    for (int64_t i : out.indices) file_ << ' ' << i;
    file_ << std::endl;
  }

 private:
  std::string path_;
  std::ofstream file_;
};

std::string describe_data(const std::string& dir) {
  if (dir == kDefaultDataDir) return "Fashion-MNIST (Debian's dataset-fashion-mnist) in " + dir;
  return dir;
}

const char* optimizer_name(const std::string& type) {
  return type == "sgd" ? "SGD" : type == "adam" ? "Adam" : type == "adamw" ? "AdamW" : "Adadelta";
}

// The model_wrapper_cfg keyword arguments: the ddp.* keys, then the config's extra ones.
train::Kwargs wrapper_args(const TrainOptions& o) {
  train::Kwargs k("model_wrapper_cfg");
  k.set("find_unused_parameters", o.find_unused_parameters);
  k.set("broadcast_buffers", o.broadcast_buffers);
  k.set("bucket_cap_mb", o.bucket_cap_mb);
  k.set("first_bucket_cap_mb", o.first_bucket_cap_mb);
  k.set("gradient_as_bucket_view", o.gradient_as_bucket_view);
  k.set("static_graph", o.static_graph);
  k.set("comm_hook", o.comm_hook);
  k.set_json("powersgd_rank", std::to_string(o.powersgd_rank));
  k.set_json("powersgd_start_iter", std::to_string(o.powersgd_start_iter));
  const train::Json extra = train::Json::parse(o.model_wrapper_extra);
  for (const auto& [key, value] : extra.items()) k.set_json(key, value.dump());
  return k;
}

// {type, ...} entries (checked by options_from_json) as specs whose errors name `owner`.<type>.
template <typename Spec>
std::vector<Spec> specs_of(const std::string& json_text, const std::string& owner) {
  std::vector<Spec> out;
  for (const auto& h : train::Json::parse(json_text)) {
    Spec spec{h.at("type").get<std::string>(), train::Kwargs(owner + "." + h["type"].get<std::string>())};
    for (const auto& [key, value] : h.items())
      if (key != "type") spec.args.set_json(key, value.dump());
    out.push_back(spec);
  }
  return out;
}

train::RunnerOptions runner_options(const TrainOptions& o, const train::Json& config) {
  train::RunnerOptions r;
  r.model = o.model;
  const train::Json model_args = train::Json::parse(o.model_extra);  // (items() refers to it)
  for (const auto& [key, value] : model_args.items()) r.model_args.set_json(key, value.dump());
  r.model_wrapper = o.model_wrapper;
  r.model_wrapper_args = wrapper_args(o);
  r.optimizer = o.zero_redundancy ? "ZeroRedundancyOptimizer" : optimizer_name(o.optimizer);
  if (o.zero_redundancy) r.optimizer_args.set("optimizer_type", optimizer_name(o.optimizer));
  r.optimizer_args.set("lr", o.lr);
  r.optimizer_args.set("weight_decay", o.weight_decay);
  if (o.optimizer == "sgd") r.optimizer_args.set("momentum", o.momentum);
  const train::Json optimizer_args = train::Json::parse(o.optimizer_extra);
  for (const auto& [key, value] : optimizer_args.items()) r.optimizer_args.set_json(key, value.dump());
  if (o.lr_schedule == "list") {
    r.param_schedulers = specs_of<train::SchedulerSpec>(o.param_schedulers, "param_scheduler");
  } else if (o.lr_schedule == "cosine") {
    r.param_scheduler = "CosineAnnealingLR";
    r.param_scheduler_args.set("by_epoch", false);
  } else {
    r.param_scheduler = "StepLR";
    r.param_scheduler_args.set_json("step_size", "1");
    r.param_scheduler_args.set("gamma", o.gamma);
  }
  r.batch_size = o.batch_size;
  r.val_batch_size = o.test_batch_size;
  r.shuffle = o.shuffle;
  r.pad = o.pad;
  r.max_epochs = o.epochs;
  r.max_iters = o.max_iters;
  r.val_interval = o.eval_interval;
  r.seed = o.seed;
  r.amp = o.amp;
  r.accumulative_counts = o.accumulative_counts;
  r.clip_max_norm = o.clip_max_norm;
  r.clip_norm_type = o.clip_norm_type;
  r.auto_scale_lr_base_batch = o.auto_scale_lr_base_batch;
  r.device = o.device;
  r.threads = o.threads;
  r.launcher = o.launcher;
  r.backend = o.backend;
  r.dist_timeout_s = o.dist_timeout_s;
  r.port = o.port;
  r.sync_bn = o.sync_bn;
  r.cuda_graph = o.cuda_graph;
  r.work_dir = o.work_dir.empty() ? train::default_work_dir(o.config_file) : o.work_dir;
  r.config_name = o.config_file;
  r.config_json = config.dump();
  r.resume_keys = {"model", "data.batch_size", "data.limit", "data.shuffle", "data.pad", "optimizer.type", "schedule.type",
                   "schedule.param_scheduler", "train.seed"};
  r.log_interval = o.log_interval;
  r.checkpoint_interval_iters = o.checkpoint_interval_iters;
  r.checkpoint_interval_epochs = o.checkpoint_interval_epochs;
  r.max_keep_ckpts = o.max_keep_ckpts;
  r.save_best = o.save_best;
  r.metrics_out = o.metrics_out;
  r.vis_backends = o.vis_backends;
  r.resume = !o.resume.empty() ? o.resume : o.resume_from_config ? "auto" : "";
  // A group tandem-run restarted (--max-restarts) resumes from the work dir's last checkpoint by
  // itself, so a failure costs at most the iterations since that checkpoint. Every rank must see
  // the work dir (one node, or a shared file system), as for --resume.
  if (r.resume.empty() && restart_count() > 0 && std::filesystem::exists(r.work_dir + "/last_checkpoint")) {
    spdlog::info("restart {} of the worker group: resuming from the last checkpoint in {}", restart_count(),
                 r.work_dir);
    r.resume = "auto";
  }
  // A restarted group may have another world size (tandem-run --nnodes MIN:MAX after a node was lost).
  r.reshard_resume = o.resume_reshard || restart_count() > 0;
  r.load_from = o.init_weights;
  r.data_description = describe_data(o.data_dir);
  r.custom_hooks = specs_of<train::HookSpec>(o.custom_hooks, "custom_hooks");
  r.val_evaluator = specs_of<train::MetricSpec>(o.val_evaluator, "val_evaluator");
  r.test_evaluator = specs_of<train::MetricSpec>(o.test_evaluator, "test_evaluator");
  return r;
}

}  // namespace

void set_datasets(const TrainOptions& o, train::RunnerOptions& r) {
  const train::Json spec = train::Json::parse(o.dataset);
  if (spec.empty()) {  // the IDX files of data_dir
    auto train_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Train);
    auto test_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Test);
    if (o.limit > 0) train_set->limit(o.limit);
    if (o.test_limit > 0) test_set->limit(o.test_limit);
    r.train_dataset = train_set;
    r.val_dataset = test_set;
  } else {  // a registered dataset: its dict for train; for val without indices, or test_limit's
    const std::string type = spec["type"].get<std::string>();
    train::Kwargs train_args("train_dataloader.dataset"), val_args("val_dataloader.dataset");
    for (const auto& [key, value] : spec.items()) {
      if (key == "type") continue;
      train_args.set_json(key, value.dump());
      if (key != "indices") val_args.set_json(key, value.dump());
    }
    if (o.test_limit > 0) val_args.set_json("indices", std::to_string(o.test_limit));
    r.train_dataset = train::datasets().get(type)(train_args, "train");
    r.val_dataset = train::datasets().get(type)(val_args, "val");
    r.data_description = type + " " + spec.value("data_root", "");
  }
  r.data_description += " (" + std::to_string(r.train_dataset->size()) + " train, " +
                        std::to_string(r.val_dataset->size()) + " test samples)";
}

int run_training(const TrainOptions& o, const train::Json& config) {
  if (o.profile) profiler::set_enabled(true);
  train::RunnerOptions r = runner_options(o, config);  // the Runner decides threads, device, backend and amp
  set_datasets(o, r);
  train::Runner runner(std::move(r));
  runner.register_hook(std::make_shared<DebugSignalHook>(o, false));
  runner.register_hook(std::make_shared<DebugSignalHook>(o, true));
  if (!o.debug_samples_out.empty()) runner.register_hook(std::make_shared<DebugSamplesHook>(o.debug_samples_out));
  const int code = runner.train();
  if (code != 0) return code;
  if (!o.save_weights.empty() && runner.fsdp()) {
    runner.fsdp()->save_full(o.save_weights);  // collective: the shards gathered, rank 0 writes
    if (runner.rank() == 0) spdlog::info("weights saved: {}", o.save_weights);
  } else if (!o.save_weights.empty() && runner.rank() == 0) {
    nn::save_weights(runner.model(), o.save_weights);
    spdlog::info("weights saved: {}", o.save_weights);
  }
  if (o.profile && runner.rank() == 0) {
    profiler::set_enabled(false);
    spdlog::info("profile (wall time per op, this rank):\n{}",
                 profiler::report(kernels::measure_gemm_peak_gflops(num_threads())));
  }
  return 0;
}

int run_test(const TrainOptions& o, const train::Json& config) {
  train::RunnerOptions r = runner_options(o, config);
  set_datasets(o, r);
  r.work_dir += "/test";  // beside the training run's files, not over its config.json and logs
  r.resume.clear();
  train::Runner runner(std::move(r));
  const train::ValMetrics v = runner.test();
  if (runner.rank() == 0) {
    std::string line;
    for (const auto& [name, value] : v.values) line += fmt::format("{}{}: {:.4f}", line.empty() ? "" : " ", name, value);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace tandem::app
