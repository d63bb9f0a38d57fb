// The Runner's evaluator, as MMEngine's: val_evaluator / test_evaluator name metrics from the
// metric registry (metric_types()); each pass feeds every batch to every metric (process), the
// evaluator adds the metrics' sums over the ranks (each rank saw its own shard) and each metric
// turns its sums into named values (compute). Built in:
//   Accuracy  topk=1 or a list (1, 5): "accuracy/top<k>" over predictions [..., C] against labels
//             [...]; a sample counts for top-k when fewer than k classes score above its label
//             (ties go to the lower class index, as argmax's first maximum);
//   Loss      the model's summed loss, averaged over samples: "loss", and "perplexity" (exp(loss))
//             when perplexity=True.
// ValMetrics.accuracy is accuracy/top1 (0 without an Accuracy metric), ValMetrics.loss is loss.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/group/process_group.h"
#include "train/hook.h"
#include "train/model.h"
#include "train/registry.h"

namespace tandem::train {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual void reset() = 0;
  // One batch: its named tensors, the model's predictions and its summed loss (mean over samples).
  virtual void process(const DataBatch& batch, const Tensor& predictions, double loss) = 0;
  // The running sums (added over the ranks before compute).
  virtual std::vector<double> sums() const = 0;
  // Named values from the summed sums, appended to out.values (and its accuracy/loss fields).
  virtual void compute(const std::vector<double>& sums, ValMetrics& out) const = 0;
};

struct MetricSpec {
  std::string type;
  Kwargs args;
};

using MetricFactory = std::function<std::unique_ptr<Metric>(const Kwargs&)>;
Registry<MetricFactory>& metric_types();

class Evaluator {
 public:
  explicit Evaluator(const std::vector<MetricSpec>& specs);
  void reset();
  void process(const DataBatch& batch, const Tensor& predictions, double loss);
  // Sums over `group` (null: this process alone), then computes every metric.
  ValMetrics evaluate(dist::ProcessGroup* group) const;
  bool empty() const { return metrics_.empty(); }

 private:
  std::vector<std::unique_ptr<Metric>> metrics_;
};

// The evaluator a Runner builds when val_evaluator is empty: Accuracy (top-1) and Loss.
std::vector<MetricSpec> default_evaluator();

}  // namespace tandem::train
