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

std::shared_ptr<const data::Dataset> idx_dataset(const Kwargs& k, const std::string& split, const std::string& root,
                                                 double mean, double stddev) {
  k.check_known({"data_root", "indices", "mean", "std"});
  auto set = std::make_shared<data::MnistDataset>(k.string("data_root", root),
                                                  split == "train" ? data::Split::Train : data::Split::Test,
                                                  k.number("mean", mean), k.number("std", stddev));
  const int64_t keep = k.integer("indices", 0);
  TANDEM_CHECK(keep >= 0, k.owner(), ".indices must be >= 0 (0: all), got ", keep);
  if (keep > 0) set->limit(keep);
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
  reg.register_module("ResNet", [](const Kwargs& k) -> std::shared_ptr<nn::Module> {
    k.check_known({"width", "blocks_per_stage", "num_classes"});
    return std::make_shared<resnet::ResNet>(k.integer("width", 16), k.integer("blocks_per_stage", 3),
                                            k.integer("num_classes", 10));
  });
  // [resnet-register]
  reg.register_module("GPT", [](const Kwargs& k) -> std::shared_ptr<nn::Module> {
    k.check_known({"vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout"});
    gpt::Config c;
    c.vocab_size = k.integer("vocab_size", 128);
    c.block_size = k.integer("block_size", c.block_size);
    c.n_layer = k.integer("n_layer", c.n_layer);
    c.n_head = k.integer("n_head", c.n_head);
    c.n_embd = k.integer("n_embd", c.n_embd);
    c.dropout = k.number("dropout", c.dropout);
    TANDEM_CHECK(c.vocab_size >= 1 && c.block_size >= 1 && c.n_layer >= 1 && c.n_head >= 1 && c.n_embd >= 1,
                 k.owner(), ": vocab_size, block_size, n_layer, n_head and n_embd must be >= 1");
    TANDEM_CHECK(c.n_embd % c.n_head == 0, k.owner(), ".n_embd (", c.n_embd, ") must be a multiple of n_head (",
                 c.n_head, ")");
    return std::make_shared<gpt::GPTModel>(c);
  });
}

Registry<DatasetFactory>& datasets() {
  static Registry<DatasetFactory>* r = [] {
    auto* reg = new Registry<DatasetFactory>("dataset");
    reg->register_module("MNIST", [](const Kwargs& k, const std::string& split) {
      return idx_dataset(k, split, "/usr/share/datasets/mnist", data::MnistDataset::kDefaultMean,
                         data::MnistDataset::kDefaultStd);
    });
    reg->register_module("FashionMNIST", [](const Kwargs& k, const std::string& split) {
      return idx_dataset(k, split, "/usr/share/datasets/fashion-mnist", kFashionMean, kFashionStd);
    });
    reg->register_module("CharCorpus", [](const Kwargs& k, const std::string& split) -> std::shared_ptr<const data::Dataset> {
      k.check_known({"data_root", "block_size", "val_fraction", "max_val_windows"});
      const double val_fraction = k.number("val_fraction", 0.05);
      TANDEM_CHECK(val_fraction > 0 && val_fraction < 1, k.owner(), ".val_fraction must be in (0, 1), got ",
                   val_fraction);
      return std::make_shared<gpt::CharWindows>(corpus(k.string("data_root", "/usr/share/games/fortunes"), val_fraction),
                                                k.integer("block_size", 64), split == "train",
                                                k.integer("max_val_windows", 256));
    });
    return reg;
  }();
  return *r;
}

}  // namespace tandem::train
