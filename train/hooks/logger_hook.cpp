// LoggerHook: MMEngine's progress lines ("Epoch(train) [e][i/n] base_lr: ... lr: ... eta: ...
// time: ... data_time: ... memory: ... loss: ..."), averaged over the window since the last line;
// the epoch's throughput line; the validation line; one metrics JSON line per iteration, epoch
// and validation (the Runner's MetricsWriter); and, as MMEngine's LocalVisBackend, the scalars of
// every progress line and validation in <work_dir>/vis_data/scalars.json (JSON lines, "step" the
// global iteration; appended across resumes), which tools/analyze_logs.py plots; as MMEngine's
// TensorboardVisBackend, the same records' numbers (every key but step, under its own name as the
// tag) at that step in a TensorBoard event file in vis_data (train/tensorboard_writer.h). Which of
// the two: RunnerOptions::vis_backends (MMEngine's visualizer.vis_backends). Rank 0 only.
// memory: on a CUDA device, as MMEngine's get_max_cuda_memory: the most device memory the caching
// allocator handed out at once since the previous line, in MiB (the peak is reset after each line);
// on the CPU (where MMEngine logs none), this process's peak resident set in MiB.
#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <chrono>
#include <filesystem>

#include "core/allocator.h"
#include "train/hooks/builtin_hooks.h"
#include "train/metrics_writer.h"
#include "train/runner.h"
#include "train/runner_internal.h"
#include "train/tensorboard_writer.h"

namespace tandem::train {
namespace {

using Clock = std::chrono::steady_clock;

int64_t peak_memory_mb(const Device& device) {
  if (device.is_cuda()) {
    CachingAllocator& a = cuda_allocator(device.index);
    const auto mb = static_cast<int64_t>(a.peak_allocated_bytes() / (1024 * 1024));
    a.reset_peak_allocated();
    return mb;
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss / 1024);  // ru_maxrss is in KiB on Linux
}

class LoggerHook : public Hook {
 public:
  explicit LoggerHook(int64_t interval) : interval_(interval) {}
  std::string name() const override { return "LoggerHook"; }
  int priority() const override { return kBelowNormal; }

  void before_run(Runner& r) override {
    // Rank 0 writes the job's files; no vis backends (MMEngine's visualizer without any): no vis_data.
    if (!r.metrics() || r.options().vis_backends.empty()) return;
    const std::string dir = r.work_dir() + "/vis_data";
    std::filesystem::create_directories(dir);
    for (const std::string& backend : r.options().vis_backends) {
      if (backend == "LocalVisBackend") scalars_ = std::make_unique<MetricsWriter>(dir + "/scalars.json", true);
      if (backend == "TensorboardVisBackend") events_ = std::make_unique<TensorboardWriter>(dir);
    }
  }

  void before_train_epoch(Runner&) override {
    epoch_start_ = Clock::now();
    window_time_ = window_data_ = 0;
    window_n_ = 0;
  }

  void after_train_iter(Runner& r, const IterOutputs& out) override {
    window_time_ += r.iter_time();
    window_data_ += r.data_time();
    ++window_n_;
    if (MetricsWriter* m = r.metrics()) {
      Json record = {{"type", "train"}, {"epoch", r.epoch()}, {"iter", r.iter_in_epoch()}, {"loss", out.loss},
                     {"lr", out.lr}, {"time", r.iter_time()}, {"data_time", r.data_time()}};
      if (out.grad_norm >= 0) record["grad_norm"] = out.grad_norm;
      for (const auto& [name, value] : out.losses) record[name] = value;
      if (out.joined) record["joined"] = true;  // out of batches: shadowed the others (no loss)
      if (dist::DistributedDataParallel* ddp = r.ddp()) {  // what the reducer did in this step
        const auto& st = ddp->reducer().stats();
        record["buckets"] = st.buckets;
        record["bucket_bytes"] = st.bucket_bytes;  // what plain all-reduce sends
        record["comm_bytes"] = st.bytes;           // what the comm hook sent
        record["exposed_comm_ms"] = st.exposed_comm_ms;
      }
      m->write(record);
    }
    const int64_t it = r.iter_in_epoch(), iters = r.iters_per_epoch(), g = r.global_iter();
    // By epoch: each epoch's every interval-th and last iteration; by iterations: the run's.
    if (r.by_epoch() ? it % interval_ != 0 && it != iters : g % interval_ != 0 && g != r.max_iters()) return;
    const double avg = window_time_ / window_n_;
    const double eta = avg * static_cast<double>(r.max_iters() - g);
    const int64_t memory = peak_memory_mb(r.device());
    std::string named;  // each of several named losses after their sum
    for (const auto& [name, value] : out.losses) named += fmt::format(" {}: {:.4f}", name, value);
    const std::string where = r.by_epoch() ? fmt::format("Epoch(train) [{}][{}/{}]", r.epoch(), it, iters)
                                           : fmt::format("Iter(train) [{}/{}]", g, r.max_iters());
    spdlog::info("{} base_lr: {:.4e} lr: {:.4e} eta: {} time: {:.3f} data_time: {:.3f} memory: {} loss: {:.4f}{}{}",
                 where, r.base_lr(), out.lr, format_eta(eta), avg, window_data_ / window_n_, memory, out.loss, named,
                 out.grad_norm >= 0 ? fmt::format(" grad_norm: {:.4f}", out.grad_norm) : std::string());
    if (scalars_ || events_) {
      Json s = {{"base_lr", r.base_lr()}, {"lr", out.lr}, {"data_time", window_data_ / window_n_},
                {"loss", out.loss},       {"time", avg},   {"memory", memory},
                {"epoch", r.epoch()},     {"iter", it},    {"step", r.global_iter()}};
      if (out.grad_norm >= 0) s["grad_norm"] = out.grad_norm;
      add_scalars(s);
    }
    window_time_ = window_data_ = 0;
    window_n_ = 0;
  }

  void after_train_epoch(Runner& r) override {
    const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
    const int64_t samples = r.epoch_samples_all();
    if (MetricsWriter* m = r.metrics())
      m->write({{"type", "epoch"}, {"epoch", r.epoch()}, {"samples", samples}, {"seconds", seconds},
                {"samples_per_s", samples / seconds}});
    spdlog::info("Epoch(train) [{}] done: {} samples in {:.1f} s ({:.0f} samples/s)", r.epoch(), samples, seconds,
                 samples / seconds);
  }

  void after_val_epoch(Runner& r, const ValMetrics& v) override {
    Json record = {{"type", "eval"}, {"epoch", r.epoch()}, {"test_loss", v.loss}, {"test_accuracy", v.accuracy}};
    Json scalars = {{"accuracy", v.accuracy}, {"test_loss", v.loss}, {"epoch", r.epoch()}, {"step", r.global_iter()}};
    std::string others;  // the metrics besides accuracy/top1 and loss
    for (const auto& [name, value] : v.values) {
      record[name] = value;
      // scalars.json's "loss" is the training loss of the progress lines; the validation's is test_loss.
      if (name != "loss") scalars[name] = value;
      if (name != "accuracy/top1" && name != "loss") others += fmt::format(" {}: {:.4f}", name, value);
    }
    if (!r.by_epoch()) record["iter"] = r.global_iter();
    if (MetricsWriter* m = r.metrics()) m->write(record);
    add_scalars(scalars);
    const std::string where = r.by_epoch() ? fmt::format("Epoch(test) [{}]", r.epoch())
                                           : fmt::format("Iter(val) [{}]", r.global_iter());
    spdlog::info("{} test_loss: {:.4f} accuracy: {:.4f} ({}/{}){}", where, v.loss, v.accuracy, v.correct, v.total,
                 others);
  }

 private:
  int64_t interval_;
  Clock::time_point epoch_start_ = Clock::now();
  double window_time_ = 0, window_data_ = 0;
  int64_t window_n_ = 0;
  // One vis_data record to each vis backend: scalars.json as it is; TensorBoard its numbers at "step".
  void add_scalars(const Json& record) {
    if (scalars_) scalars_->write(record);
    if (!events_) return;
    TensorboardScalars values;
    for (const auto& [key, value] : record.items())
      if (key != "step" && value.is_number()) values.emplace_back(key, value.get<float>());
    events_->add_scalars(record.at("step").get<int64_t>(), values);
  }

  std::unique_ptr<MetricsWriter> scalars_;     // <work_dir>/vis_data/scalars.json (LocalVisBackend)
  std::unique_ptr<TensorboardWriter> events_;  // vis_data/events.out.tfevents.* (TensorboardVisBackend)
};

}  // namespace

Schema logger_hook_schema() {
  return {at_least(arg_int("interval", 10, "iterations between progress lines"), 1)};
}

std::shared_ptr<Hook> make_logger_hook(const Kwargs& k) { return std::make_shared<LoggerHook>(k.integer("interval")); }

}  // namespace tandem::train
