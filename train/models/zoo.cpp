// The models library's registrations (see zoo.h).
#include "train/models/zoo.h"

#include <map>
#include <mutex>

#include "data/mnist.h"
#include "train/models/char_windows.h"
#include "train/models/gpt_model.h"
#include "train/models/resnet.h"

namespace tandem::train {
namespace {

// MNIST's and FashionMNIST's keywords, with each data set's own root and normalisation as defaults.
Schema idx_schema(const std::string& root, double mean, double stddev) {
  return {arg_string("data_root", root, {}, "the directory of the IDX files"),
          at_least(arg_int("indices", 0, "keep the first N samples (0: all)"), 0),
          arg_number("mean", mean, "pixel mean (of pixel / 255) subtracted"),
          above(arg_number("std", stddev, "pixel standard deviation divided by"), 0)};
}

std::shared_ptr<const data::Dataset> idx_dataset(const Kwargs& k, const std::string& split) {
  auto set = std::make_shared<data::MnistDataset>(k.string("data_root"),
                                                  split == "train" ? data::Split::Train : data::Split::Test,
                                                  k.number("mean"), k.number("std"));
  if (const int64_t keep = k.integer("indices"); keep > 0) set->limit(keep);
  return set;
}

// One corpus per (path, val_fraction), shared by the train and val datasets of a run.
std::shared_ptr<const gpt::CharCorpus> corpus(const std::string& path, double val_fraction) {
  static std::mutex mu;
  static std::map<std::pair<std::string, double>, std::shared_ptr<const gpt::CharCorpus>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = cache[{path, val_fraction}];
  if (!c) c = std::make_shared<gpt::CharCorpus>(path, val_fraction);
  return c;
}

}  // namespace

void register_model_zoo(Registry<ModelFactory>& reg) {
  // [resnet-register]
  reg.register_module(
      "ResNet",
      [](const Kwargs& k) -> std::shared_ptr<nn::Module> {
        return std::make_shared<resnet::ResNet>(k.integer("width"), k.integer("blocks_per_stage"),
                                                k.integer("num_classes"));
      },
      Schema{at_least(arg_int("width", 16, "channels of the first stage (doubled at each)"), 1),
             at_least(arg_int("blocks_per_stage", 3, "residual blocks per stage"), 1),
             at_least(arg_int("num_classes", 10, "output classes"), 1)});
  // [resnet-register]
  const gpt::Config d;
  reg.register_module(
      "GPT",
      [](const Kwargs& k) -> std::shared_ptr<nn::Module> {
        gpt::Config c;
        c.vocab_size = k.integer("vocab_size");
        c.block_size = k.integer("block_size");
        c.n_layer = k.integer("n_layer");
        c.n_head = k.integer("n_head");
        c.n_embd = k.integer("n_embd");
        c.dropout = k.number("dropout");
        TANDEM_CHECK(c.n_embd % c.n_head == 0, k.label("n_embd"), " (", c.n_embd, ") must be a multiple of n_head (",
                     c.n_head, ")");
        return std::make_shared<gpt::GPTModel>(c);
      },
      Schema{at_least(arg_int("vocab_size", 128, "tokens (128: every ASCII byte)"), 1),
             at_least(arg_int("block_size", d.block_size, "the longest context"), 1),
             at_least(arg_int("n_layer", d.n_layer, "transformer blocks"), 1),
             at_least(arg_int("n_head", d.n_head, "attention heads"), 1),
             at_least(arg_int("n_embd", d.n_embd, "embedding width (a multiple of n_head)"), 1),
             below(at_least(arg_number("dropout", d.dropout, "dropout probability"), 0), 1)});
}

Registry<DatasetFactory>& datasets() {
  static Registry<DatasetFactory>* r = [] {
    auto* reg = new Registry<DatasetFactory>("dataset");
    reg->register_module("MNIST", idx_dataset,
                         idx_schema("/usr/share/datasets/mnist", data::MnistDataset::kDefaultMean,
                                    data::MnistDataset::kDefaultStd));
    reg->register_module("FashionMNIST", idx_dataset,
                         idx_schema("/usr/share/datasets/fashion-mnist", kFashionMean, kFashionStd));
    reg->register_module(
        "CharCorpus",
        [](const Kwargs& k, const std::string& split) -> std::shared_ptr<const data::Dataset> {
          return std::make_shared<gpt::CharWindows>(corpus(k.string("data_root"), k.number("val_fraction")),
                                                    k.integer("block_size"), split == "train",
                                                    k.integer("max_val_windows"));
        },
        Schema{arg_string("data_root", "/usr/share/games/fortunes", {}, "a text file or a directory of fortune files"),
               at_least(arg_int("block_size", 64, "characters per window"), 1),
               below(above(arg_number("val_fraction", 0.05, "the corpus's held-out share"), 0), 1),
               at_least(arg_int("max_val_windows", 256, "validation windows at most"), 1)});
    return reg;
  }();
  return *r;
}

}  // namespace tandem::train
