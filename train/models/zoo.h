// The models library: the networks the examples and the apps share, registered in the Runner's
// MODELS registry (train::models()) with their model interface, and the datasets they train on in
// DATASETS (train::datasets()), by the names a config gives as model.type and
// train_dataloader.dataset.type:
//   models    MnistNet                       (nn/models/mnist_net.h; log-probabilities, nll_loss)
//             ResNet   width, blocks_per_stage, num_classes   (resnet.h; log-probabilities, nll_loss)
//             GPT      vocab_size (128: every ASCII byte), block_size, n_layer, n_head, n_embd, dropout
//                      (gpt_model.h: cross-entropy "loss", logits as predictions)
//   datasets  MNIST, FashionMNIST   data_root (the IDX files), indices (keep the first N; 0: all),
//                                   mean, std (defaults: each data set's own)
//             CharCorpus            data_root (a text file or a directory of fortune files),
//                                   block_size, val_fraction, max_val_windows (char_windows.h)
// A dataset factory is given its split: "train", "val" or "test" (the IDX test split serves val and
// test; CharCorpus's held-out part serves both).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "train/registries.h"

namespace tandem::train {

using DatasetFactory = std::function<std::shared_ptr<const data::Dataset>(const Kwargs&, const std::string& split)>;
Registry<DatasetFactory>& datasets();

// Adds ResNet and GPT to `reg` (models() calls it when it is first used).
void register_model_zoo(Registry<ModelFactory>& reg);

// Fashion-MNIST's training-set pixel mean and standard deviation (of pixel / 255).
inline constexpr double kFashionMean = 0.2860, kFashionStd = 0.3530;

}  // namespace tandem::train
