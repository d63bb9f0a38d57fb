// GPTModel: the GPT of gpt.h with the Runner's model interface (train/model.h): its loss is
// "loss", the cross-entropy of the logits [B, T, V] against the next-token targets [B, T]; its
// predictions are the logits (the evaluator's Accuracy reads them as next-token class scores, the
// Loss metric with perplexity=True gives exp(loss)). Its parameters are GPT's (no prefix).
#pragma once

#include "nn/losses.h"
#include "train/model.h"
#include "train/models/gpt.h"

namespace gpt {

class GPTModel : public GPT, public tandem::train::ModelTask {
 public:
  explicit GPTModel(const Config& c) : GPT(c) {}
  tandem::train::LossList loss(const Tensor& logits, const tandem::train::DataBatch& batch) override {
    const Tensor& y = tandem::train::batch_tensor(batch, "labels");
    return {{"loss", F::cross_entropy(F::reshape(logits, {-1, config.vocab_size}), F::reshape(y, {-1}))}};
  }
};

}  // namespace gpt
