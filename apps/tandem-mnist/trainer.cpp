// The training job of tandem-mnist over train::Runner: RunnerOptions from the completed config tree
// (train::runner_options_from_config), the outputs and resume request of the command line, and
// tandem-mnist's test hooks (--debug-*). Everything else (the loop, DDP, AMP, accumulation, clipping, checkpoints and
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
#include "dist/store/env.h"
#include "kernels/linear.h"
#include "train/runner.h"
#include "train/stop_signal.h"

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
  DebugSignalHook(const AppOptions& o, bool after_checkpoint) : o_(o), late_(after_checkpoint) {}
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
  const AppOptions& o_;
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

// RunnerOptions of the completed config plus what is not config: the config's name, the outputs
// and the resume request.
train::RunnerOptions runner_options(const AppOptions& o, const ResolvedConfig& config) {
  train::RunnerOptions r = train::runner_options_from_config(config.tree, config.origins);
  r.config_name = o.config_file;
  r.metrics_out = o.metrics_out;
  if (!o.resume.empty()) r.resume = o.resume;
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
  return r;
}

}  // namespace

int run_training(const AppOptions& o, const ResolvedConfig& config) {
  if (o.profile) profiler::set_enabled(true);
  // The Runner decides threads, device, backend and amp.
  train::Runner runner(runner_options(o, config));
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
                 kernels::profile_report(runner.device(), num_threads()));
  }
  return 0;
}

int run_test(const AppOptions& o, const ResolvedConfig& config) {
  train::RunnerOptions r = runner_options(o, config);
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
