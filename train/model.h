// The Runner's model interface, as MMEngine's BaseModel: one network, three modes.
//   tensor   forward(inputs): the network's raw outputs; what a model wrapper (DDP, FSDP) runs;
//   loss     loss(outputs, batch): named losses; the Runner sums them for backward and logs each;
//   predict  predict(outputs, batch): what the evaluator's metrics read (default: the outputs).
// forward(batch, mode, net) runs the network through `net` (this model, or the wrapper around it)
// and then the mode's head, as MMEngine's model(**data, mode=mode).
//
// A batch reaches the model as named tensors (DataBatch): the data preprocessor (MMEngine's
// data_preprocessor) turns the dataset's data::Batch into {"inputs", "labels"} on the Runner's
// device, casting floating inputs when `cast_inputs` is set. "inputs" is what forward() is given.
//
// A model with several optimizers (MMEngine's GAN models; optim_wrapper built by
// MultiOptimWrapperConstructor into an OptimWrapperDict) overrides train_step(batch, optim_wrapper),
// MMEngine's override point: it runs its forwards and updates each part through its named wrapper
// (OptimWrapper::update_params) and returns the losses to log; has_train_step() says it does.
//
// A plain nn::Module (not a BaseModel) is a classifier of log-probabilities: one loss, "loss",
// nll_loss(outputs, labels); predictions are the outputs (ClassifierTask below).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"
#include "nn/module.h"

namespace tandem::train {

// A batch as named tensors: "inputs" (the network's input), "labels" (targets), any others.
using DataBatch = std::map<std::string, Tensor>;
// Named losses, in the order the model lists them (each a 0-D tensor).
using LossList = std::vector<std::pair<std::string, Tensor>>;

enum class Mode { kTensor, kLoss, kPredict };

class OptimWrapperDict;

// What forward(batch, mode, net) returns: losses in loss mode, predictions in predict mode, the
// network's outputs in every mode.
struct ModelOutputs {
  Tensor outputs;
  LossList losses;
  Tensor predictions;
};

// MMEngine's BaseDataPreprocessor: to the device; floating inputs cast to `cast_inputs` when set.
struct DataPreprocessor {
  std::optional<DType> cast_inputs;
  DataBatch operator()(const data::Batch& batch, Device device) const;
};

// The loss and predict heads, apart from the network (so a plain nn::Module gets one too).
class ModelTask {
 public:
  virtual ~ModelTask() = default;
  // Named losses of the network's `outputs` on `batch`; at least one.
  virtual LossList loss(const Tensor& outputs, const DataBatch& batch) = 0;
  virtual Tensor predict(const Tensor& outputs, const DataBatch& /*batch*/) { return outputs; }
  // MMEngine's train_step(data, optim_wrapper) for several optimizers (see above); a model that
  // overrides it returns true from has_train_step(). The default throws.
  virtual bool has_train_step() const { return false; }
  virtual LossList train_step(const DataBatch& batch, OptimWrapperDict& optim_wrapper);
  DataPreprocessor& data_preprocessor() { return preprocessor_; }

 private:
  DataPreprocessor preprocessor_;
};

// A classifier of log-probabilities [N, C]: nll_loss against "labels" [N], named "loss".
class ClassifierTask : public ModelTask {
 public:
  LossList loss(const Tensor& outputs, const DataBatch& batch) override;
};

// MMEngine's model(**data, mode=mode) for any task: `net` runs the network on batch["inputs"],
// then the mode's head.
ModelOutputs run_model(ModelTask& task, const DataBatch& batch, Mode mode, nn::Module& net);

class BaseModel : public nn::Module, public ModelTask {
 public:
  using nn::Module::forward;
  // MMEngine's forward(batch, mode): `net` runs the network (this model or its wrapper).
  ModelOutputs forward(const DataBatch& batch, Mode mode, nn::Module& net) {
    return run_model(*this, batch, mode, net);
  }
  ModelOutputs forward(const DataBatch& batch, Mode mode) { return run_model(*this, batch, mode, *this); }
};

// The tensor named `key` of `batch`; a missing one throws naming the batch's keys.
const Tensor& batch_tensor(const DataBatch& batch, const std::string& key);
// The losses' sum (the first loss itself when there is one, so its value is bitwise the loss's).
Tensor sum_losses(const LossList& losses);

}  // namespace tandem::train
