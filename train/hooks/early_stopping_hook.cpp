// EarlyStoppingHook (MMEngine's): after each validation, compares the monitored metric with the best
// so far; `patience` validations in a row without an improvement of more than min_delta (or a
// metric that is not finite with check_finite, or one past stopping_threshold) end the run after
// that epoch, normally (train() returns 0), with a line saying why. Metrics: accuracy (also
// accuracy/top1) and loss (also test_loss). rule: greater | less, else inferred from the name as
// MMEngine does (acc, top, ... greater; loss less).
#include <spdlog/spdlog.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <optional>

#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// MMEngine's _init_rule: an exact key first, then a key inside the name; "" when none fits.
std::string infer_rule(const std::string& monitor) {
  static const std::vector<std::string> greater = {"acc", "top", "ar@", "auc", "precision", "map",
                                                   "mdice", "miou", "macc", "aacc"};
  const std::string m = lower(monitor);
  for (const auto& k : greater)
    if (m == k) return "greater";
  if (m == "loss") return "less";
  for (const auto& k : greater)
    if (m.find(k) != std::string::npos) return "greater";
  return m.find("loss") != std::string::npos ? "less" : "";
}

class EarlyStoppingHook : public Hook {
 public:
  EarlyStoppingHook(std::string monitor, bool greater, double min_delta, bool strict, bool check_finite,
                    int64_t patience, std::optional<double> threshold)
      : monitor_(std::move(monitor)), greater_(greater), min_delta_(greater ? min_delta : -min_delta),
        strict_(strict), check_finite_(check_finite), patience_(patience), threshold_(threshold),
        best_(greater ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity()) {}
  std::string name() const override { return "EarlyStoppingHook"; }
  int priority() const override { return kLowest; }

  void after_val_epoch(Runner& r, const ValMetrics& v) override {
    std::optional<double> score;
    if (monitor_ == "accuracy" || monitor_ == "accuracy/top1") score = v.accuracy;
    if (monitor_ == "loss" || monitor_ == "test_loss") score = v.loss;
    if (const double* value = v.find(monitor_); !score && value) score = *value;
    if (!score) {
      std::string available = "accuracy, loss";
      for (const auto& [name, value] : v.values) available += ", " + name;
      TANDEM_CHECK(!strict_, "custom_hooks.EarlyStoppingHook.monitor '", monitor_,
                   "' is not a validation metric (available: ", available, "); or set strict=False");
      spdlog::warn("EarlyStoppingHook: skipped, the validation has no metric '{}' (available: {})", monitor_,
                   available);
      return;
    }
    const std::string why = check(*score);
    if (why.empty()) return;
    spdlog::info("EarlyStoppingHook: {}; training stops after epoch {}", why, r.epoch());
    r.stop_training();
  }

 private:
  bool better(double a, double b) const { return greater_ ? a > b : a < b; }
  // MMEngine's _check_stop_condition: the reason to stop, or "".
  std::string check(double score) {
    if (check_finite_ && !std::isfinite(score))
      return "monitored metric " + monitor_ + " = " + std::to_string(score) + " is not finite; best was " +
             std::to_string(best_);
    if (threshold_ && better(score, *threshold_)) {
      best_ = score;
      return "stopping threshold reached: " + monitor_ + " = " + std::to_string(score) + " is " +
             (greater_ ? "greater" : "less") + " than " + std::to_string(*threshold_);
    }
    if (better(best_ + min_delta_, score)) {
      ++wait_;
      if (wait_ >= patience_)
        return "the monitored metric " + monitor_ + " did not improve in the last " + std::to_string(wait_) +
               " validations (best " + std::to_string(best_) + ", min_delta " + std::to_string(std::fabs(min_delta_)) +
               ")";
      return "";
    }
    best_ = score;
    wait_ = 0;
    return "";
  }

  std::string monitor_;
  bool greater_;
  double min_delta_;
  bool strict_, check_finite_;
  int64_t patience_, wait_ = 0;
  std::optional<double> threshold_;
  double best_;
};

}  // namespace

Schema early_stopping_hook_schema() {
  ArgSpec rule = nullable(arg_of("rule", ArgKind::String, "null", "greater | less (null: inferred from monitor)"));
  rule.choices = {"greater", "less"};
  return {required(arg_string("monitor", "", {}, "a validation metric: accuracy or loss")), rule,
          at_least(arg_number("min_delta", 0.1, "the least change that counts as an improvement"), 0),
          arg_bool("strict", false, "a monitor the validation lacks is an error (else skipped)"),
          arg_bool("check_finite", true, "stop when the metric is not finite"),
          at_least(arg_int("patience", 5, "validations without improvement before stopping"), 1),
          nullable(arg_of("stopping_threshold", ArgKind::Number, "null", "stop once the metric passes it"))};
}

std::shared_ptr<Hook> make_early_stopping_hook(const Kwargs& k) {
  const std::string monitor = k.string("monitor");
  const std::string rule = k.given("rule") ? k.string("rule") : infer_rule(monitor);
  TANDEM_CHECK(!rule.empty(), k.owner(), ": cannot infer the rule for monitor '", monitor,
               "'; set rule \"greater\" or \"less\"");
  std::optional<double> threshold;
  if (k.given("stopping_threshold")) threshold = k.number("stopping_threshold");
  return std::make_shared<EarlyStoppingHook>(monitor, rule == "greater", k.number("min_delta"),
                                             k.boolean("strict"), k.boolean("check_finite"),
                                             k.integer("patience"), threshold);
}

}  // namespace tandem::train
