// CheckpointHook: saves resumable checkpoints into the work dir's rotation (iter_<global>.safetensors,
// last_checkpoint, at most max_keep_ckpts kept):
//   - every `interval` epochs and after the last (by_epoch true), or every `interval` iterations
//     (by_epoch false, and after the run's last iteration); plus every `interval_iters` iterations (Tandem's, 0: off);
//   - at the iteration where the ranks agreed to stop (StopAgreementHook), so a stopped run resumes;
//   - save_best "accuracy" (or "auto"), "loss" or any metric the evaluator names ("perplexity",
//     "accuracy/top5"): after each validation that beats the best so far,
//     best_<metric>_epoch_<e> (iter_<i> by iterations).safetensors (+ state, '/' written '_'), replacing the previous best
//     (rule: less for loss and perplexity, else greater, or as `rule` says).
// Saving is rank 0's; the others only count.
#include <algorithm>
#include <filesystem>

#include "train/checkpoint.h"
#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

class CheckpointHook : public Hook {
 public:
  CheckpointHook(int64_t interval, bool by_epoch, int64_t interval_iters, int64_t max_keep, std::string best,
                 std::string rule)
      : interval_(interval), by_epoch_(by_epoch), interval_iters_(interval_iters), max_keep_(max_keep),
        best_metric_(std::move(best)), rule_(std::move(rule)) {}
  std::string name() const override { return "CheckpointHook"; }
  int priority() const override { return kVeryLow; }

  void after_train_iter(Runner& r, const IterOutputs&) override {
    const int64_t g = r.global_iter();
    const bool due = (!by_epoch_ && interval_ > 0 && (g % interval_ == 0 || g == r.max_iters())) ||
                     (interval_iters_ > 0 && g % interval_iters_ == 0);
    if (r.stop() != 0 || due) r.save_checkpoint(r.epoch(), r.iter_in_epoch(), "", max_keep_);
  }

  void after_train_epoch(Runner& r) override {
    if (by_epoch_ && interval_ > 0 && (r.epoch() % interval_ == 0 || r.epoch() == r.max_epochs()))
      r.save_checkpoint(r.epoch() + 1, 0, "", max_keep_);
  }

  void after_val_epoch(Runner& r, const ValMetrics& v) override {
    if (best_metric_.empty()) return;
    const double* named = v.find(best_metric_);
    const double value = best_metric_ == "loss" ? v.loss : best_metric_ == "accuracy" ? v.accuracy : named ? *named : 0;
    TANDEM_CHECK(best_metric_ == "loss" || best_metric_ == "accuracy" || named, "default_hooks.checkpoint.save_best '",
                 best_metric_, "' is not a validation metric");
    const bool greater = rule_ == "greater";
    if (have_best_ && (greater ? value <= best_ : value >= best_)) return;
    have_best_ = true;
    best_ = value;
    std::string file_metric = best_metric_;
    std::replace(file_metric.begin(), file_metric.end(), '/', '_');
    const std::string path = r.work_dir() + "/best_" + file_metric +
                             (r.by_epoch() ? "_epoch_" + std::to_string(r.epoch())
                                           : "_iter_" + std::to_string(r.global_iter())) + ".safetensors";
    // On every rank: collective under FSDP, a no-op past rank 0 otherwise. A sharded one is <name>.sharded/.
    const std::string written = r.save_checkpoint(r.epoch() + 1, 0, path);
    if (r.rank() != 0) return;
    if (!last_best_.empty() && last_best_ != written) {
      std::error_code ec;
      std::filesystem::remove_all(last_best_, ec);
      std::filesystem::remove(state_path(last_best_), ec);
    }
    last_best_ = written;
    r.info("best " + best_metric_ + " " + std::to_string(value) + ": " + written);
  }

 private:
  int64_t interval_;
  bool by_epoch_;
  int64_t interval_iters_, max_keep_;
  std::string best_metric_, rule_, last_best_;
  bool have_best_ = false;
  double best_ = 0;
};

}  // namespace

Schema checkpoint_hook_schema() {
  ArgSpec rule = nullable(arg_of("rule", ArgKind::String, "null", "how save_best compares (null: by the metric's name)"));
  rule.choices = {"greater", "less"};
  return {at_least(arg_int("interval", 1, "epochs (by_epoch false: iterations) between checkpoints (0: off)"), 0),
          arg_bool("by_epoch", true, "interval counts epochs"),
          at_least(arg_int("interval_iters", 0, "also every N iterations (0: off)"), 0),
          at_least(arg_int("max_keep_ckpts", -1, "checkpoints kept (-1 or 0: all)"), -1),
          nullable(arg_of("save_best", ArgKind::String, "null", "also keep the best checkpoint by this metric ('auto')")),
          rule,
          arg_bool("save_last", true, "accepted: the last checkpoint is always saved")};
}

std::shared_ptr<Hook> make_checkpoint_hook(const Kwargs& k) {
  std::string best = k.given("save_best") ? k.string("save_best") : "";
  if (best == "auto") best = "accuracy";
  // Any metric of the evaluator (checked at the first validation); lower is better for losses.
  const std::string by_name = best == "loss" || best == "perplexity" ? "less" : "greater";
  const std::string rule = k.given("rule") ? k.string("rule") : by_name;
  const int64_t max_keep = k.integer("max_keep_ckpts");
  return std::make_shared<CheckpointHook>(k.integer("interval"), k.boolean("by_epoch"),
                                          k.integer("interval_iters"), max_keep < 0 ? 0 : max_keep, best, rule);
}

}  // namespace tandem::train
