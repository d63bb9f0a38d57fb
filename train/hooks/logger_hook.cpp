// LoggerHook: MMEngine's progress lines ("Epoch(train) [e][i/n] lr: ... eta: ... time: ...
// data_time: ... loss: ..."), averaged over the window since the last line; the epoch's
// throughput line; the validation line; and one metrics JSON line per iteration, epoch and
// validation (rank 0 only; the Runner's MetricsWriter).
#include <spdlog/spdlog.h>

#include <chrono>

#include "train/hooks/builtin_hooks.h"
#include "train/metrics_writer.h"
#include "train/runner.h"
#include "train/runner_internal.h"

namespace tandem::train {
namespace {

using Clock = std::chrono::steady_clock;

class LoggerHook : public Hook {
 public:
  explicit LoggerHook(int64_t interval) : interval_(interval) {}
  std::string name() const override { return "LoggerHook"; }
  int priority() const override { return kBelowNormal; }

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
    const int64_t it = r.iter_in_epoch(), iters = r.iters_per_epoch();
    if (it % interval_ != 0 && it != iters) return;
    const double avg = window_time_ / window_n_;
    const double eta = avg * static_cast<double>((iters - it) + (r.max_epochs() - r.epoch()) * iters);
    spdlog::info("Epoch(train) [{}][{}/{}] lr: {:.4e} eta: {} time: {:.3f} data_time: {:.3f} loss: {:.4f}{}",
                 r.epoch(), it, iters, out.lr, format_eta(eta), avg, window_data_ / window_n_, out.loss,
                 out.grad_norm >= 0 ? fmt::format(" grad_norm: {:.4f}", out.grad_norm) : std::string());
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
    if (MetricsWriter* m = r.metrics())
      m->write({{"type", "eval"}, {"epoch", r.epoch()}, {"test_loss", v.loss}, {"test_accuracy", v.accuracy}});
    spdlog::info("Epoch(test) [{}] test_loss: {:.4f} accuracy: {:.4f} ({}/{})", r.epoch(), v.loss, v.accuracy,
                 v.correct, v.total);
  }

 private:
  int64_t interval_;
  Clock::time_point epoch_start_ = Clock::now();
  double window_time_ = 0, window_data_ = 0;
  int64_t window_n_ = 0;
};

}  // namespace

std::shared_ptr<Hook> make_logger_hook(const Kwargs& k) {
  k.check_known({"interval"});
  const int64_t interval = k.integer("interval", 10);
  TANDEM_CHECK(interval >= 1, k.owner(), ".interval must be >= 1, got ", interval);
  return std::make_shared<LoggerHook>(interval);
}

}  // namespace tandem::train
