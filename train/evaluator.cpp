// The evaluator and its built-in metrics (see evaluator.h).
#include "train/evaluator.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dist/group/host_values.h"

namespace tandem::train {

namespace {

// topk as MMEngine writes it: an integer, or a list/tuple of them (a tuple arrives as a JSON list).
std::vector<int64_t> read_topk(const Kwargs& k) {
  const nlohmann::json j = nlohmann::json::parse(k.items().at("topk"));
  std::vector<int64_t> out;
  for (const auto& v : j.is_array() ? j : nlohmann::json::array({j})) {
    TANDEM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, k.label("topk"),
                 " must be an integer >= 1 or a list of them, got ", j.dump());
    out.push_back(v.get<int64_t>());
  }
  TANDEM_CHECK(!out.empty(), k.label("topk"), " must name at least one k, got []");
  return out;
}

// Whether class a (score sa) ranks before class b: a higher score, a NaN above a number, the lower
// index among equals (argmax's first maximum, a NaN counting as the maximum).
bool ranks_before(float sa, int64_t a, float sb, int64_t b) {
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na || nb) return na && (!nb || a < b);
  return sa > sb || (sa == sb && a < b);
}

class Accuracy : public Metric {
 public:
  explicit Accuracy(std::vector<int64_t> topk) : topk_(std::move(topk)), hits_(topk_.size(), 0) {}
  void reset() override { std::fill(hits_.begin(), hits_.end(), 0), total_ = 0; }
  void process(const DataBatch& batch, const Tensor& predictions, double) override {
    const Tensor scores = predictions.to(Device::cpu()).to(kFloat32).contiguous();
    const Tensor& labels = batch_tensor(batch, "labels");
    const int64_t classes = scores.size(scores.dim() - 1), n = labels.numel();
    TANDEM_CHECK(scores.numel() == n * classes, "Accuracy: predictions ", scores.str(), " do not hold one row of ",
                 "class scores per label of ", labels.str());
    const std::vector<float> s = scores.to_vector<float>();
    const std::vector<int64_t> y = labels.to(Device::cpu()).contiguous().to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const float* row = s.data() + i * classes;
      const int64_t t = y[static_cast<size_t>(i)];
      TANDEM_CHECK(t >= 0 && t < classes, "Accuracy: label ", t, " is outside the ", classes, " classes");
      int64_t rank = 0;  // classes ranked before the label's (a NaN above every number, as argmax's)
      for (int64_t c = 0; c < classes; ++c) rank += ranks_before(row[c], c, row[t], t);
      for (size_t j = 0; j < topk_.size(); ++j) hits_[j] += rank < topk_[j];
    }
    total_ += n;
  }
  std::vector<double> sums() const override {
    std::vector<double> v(hits_.begin(), hits_.end());
    v.push_back(static_cast<double>(total_));
    return v;
  }
  void compute(const std::vector<double>& sums, ValMetrics& out) const override {
    const double total = sums.back();
    for (size_t j = 0; j < topk_.size(); ++j) {
      const double acc = total > 0 ? sums[j] / total : 0.0;
      out.values.emplace_back("accuracy/top" + std::to_string(topk_[j]), acc);
      if (topk_[j] == 1) out.accuracy = acc, out.correct = static_cast<int64_t>(sums[j]);
    }
    out.total = static_cast<int64_t>(total);
  }

 private:
  std::vector<int64_t> topk_;
  std::vector<int64_t> hits_;
  int64_t total_ = 0;
};

// The loss per sample: each batch's mean loss weighted by its samples (inputs' first dimension).
class LossMetric : public Metric {
 public:
  explicit LossMetric(bool perplexity) : perplexity_(perplexity) {}
  void reset() override { sum_ = 0, n_ = 0; }
  void process(const DataBatch& batch, const Tensor&, double loss) override {
    const double n = static_cast<double>(batch_tensor(batch, "inputs").size(0));
    sum_ += loss * n;
    n_ += n;
  }
  std::vector<double> sums() const override { return {sum_, n_}; }
  void compute(const std::vector<double>& sums, ValMetrics& out) const override {
    const double loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    out.values.emplace_back("loss", loss);
    out.loss = loss;
    if (perplexity_) out.values.emplace_back("perplexity", std::exp(loss));
    if (out.total == 0) out.total = static_cast<int64_t>(sums[1]);
  }

 private:
  bool perplexity_;
  double sum_ = 0, n_ = 0;
};

}  // namespace

Registry<MetricFactory>& metric_types() {
  static Registry<MetricFactory>* r = [] {
    auto* reg = new Registry<MetricFactory>("metric");
    reg->register_module(
        "Accuracy", [](const Kwargs& k) -> std::unique_ptr<Metric> { return std::make_unique<Accuracy>(read_topk(k)); },
        Schema{arg_of("topk", ArgKind::Any, "1", "k, or a list of them: accuracy/top<k> for each")});
    reg->register_module(
        "Loss",
        [](const Kwargs& k) -> std::unique_ptr<Metric> {
          return std::make_unique<LossMetric>(k.boolean("perplexity"));
        },
        Schema{arg_bool("perplexity", false, "also perplexity (exp of the loss)")});
    return reg;
  }();
  return *r;
}

std::vector<MetricSpec> default_evaluator() {
  return {{"Accuracy", Kwargs("val_evaluator.Accuracy")}, {"Loss", Kwargs("val_evaluator.Loss")}};
}

Evaluator::Evaluator(const std::vector<MetricSpec>& specs) {
  for (const MetricSpec& s : specs) {
    metrics_.push_back(metric_types().get(s.type)(s.args));
    TANDEM_CHECK(metrics_.back() != nullptr, "metric type '", s.type, "': the factory returned no metric");
  }
}

void Evaluator::reset() {
  for (auto& m : metrics_) m->reset();
}

void Evaluator::process(const DataBatch& batch, const Tensor& predictions, double loss) {
  for (auto& m : metrics_) m->process(batch, predictions, loss);
}

ValMetrics Evaluator::evaluate(dist::ProcessGroup* group) const {
  std::vector<double> all;
  std::vector<size_t> sizes;
  for (const auto& m : metrics_) {
    const std::vector<double> s = m->sums();
    sizes.push_back(s.size());
    all.insert(all.end(), s.begin(), s.end());
  }
  if (group != nullptr && !all.empty())
    all = dist::allreduce_values(*group, all, dist::ReduceOp::Sum, "the evaluation's sums");
  ValMetrics out;
  size_t at = 0;
  for (size_t i = 0; i < metrics_.size(); ++i) {
    const std::vector<double> s(all.begin() + static_cast<std::ptrdiff_t>(at),
                                all.begin() + static_cast<std::ptrdiff_t>(at + sizes[i]));
    metrics_[i]->compute(s, out);
    at += sizes[i];
  }
  return out;
}

}  // namespace tandem::train
