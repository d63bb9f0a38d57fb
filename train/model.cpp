// The model interface (see model.h).
#include "train/model.h"

#include "core/error.h"
#include "nn/functional.h"
#include "nn/pointwise.h"

namespace tandem::train {

LossList ModelTask::train_step(const DataBatch&, OptimWrapperDict&) {
  TANDEM_FAIL("this model has no train_step(batch, optim_wrapper): a model with several optimizers overrides it "
              "(and has_train_step())");
}

DataBatch DataPreprocessor::operator()(const data::Batch& batch, Device device) const {
  DataBatch out;
  Tensor inputs = batch.images.to(device);
  if (cast_inputs && is_floating(inputs.dtype())) inputs = inputs.to(*cast_inputs);
  out.emplace("inputs", std::move(inputs));
  if (batch.labels.defined()) out.emplace("labels", batch.labels.to(device));
  return out;
}

const Tensor& batch_tensor(const DataBatch& batch, const std::string& key) {
  auto it = batch.find(key);
  if (it == batch.end()) {
    std::string keys;
    for (const auto& [k, v] : batch) keys += (keys.empty() ? "" : ", ") + k;
    TANDEM_FAIL("the batch has no tensor '", key, "'; it has: ", keys.empty() ? "(none)" : keys);
  }
  return it->second;
}

Tensor sum_losses(const LossList& losses) {
  TANDEM_CHECK(!losses.empty(), "the model's loss() returned no losses");
  Tensor total = losses.front().second;
  for (size_t i = 1; i < losses.size(); ++i) total = F::add(total, losses[i].second);
  return total;
}

LossList ClassifierTask::loss(const Tensor& outputs, const DataBatch& batch) {
  return {{"loss", F::nll_loss(outputs, batch_tensor(batch, "labels"))}};
}

ModelOutputs run_model(ModelTask& task, const DataBatch& batch, Mode mode, nn::Module& net) {
  ModelOutputs out;
  out.outputs = net(batch_tensor(batch, "inputs"));
  if (mode == Mode::kLoss) out.losses = task.loss(out.outputs, batch);
  if (mode == Mode::kPredict) out.predictions = task.predict(out.outputs, batch);
  return out;
}

}  // namespace tandem::train
