// A tiny model and data set for Runner tests: TinyNet (one Linear, log-softmax) registered as
// "TinyNet", TinySet (n deterministic samples of 6 features, 3 classes), tiny_options (SGD lr 0.5,
// no schedule, batch 8, unshuffled, one epoch on the CPU, no epoch checkpoints), args (Kwargs from JSON texts).
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/functional.h"
#include "nn/layers.h"
#include "train/models/zoo.h"
#include "train/registries.h"
#include "train/runner.h"

namespace tandem::train {

inline constexpr int64_t kIn = 6, kClasses = 3;

// Keyword arguments of the config entry `owner`, each value given as JSON text.
inline Kwargs args(const std::string& owner, std::initializer_list<std::pair<const char*, const char*>> kv) {
  Kwargs k(owner);
  for (const auto& [key, json] : kv) k.set_json(key, json);
  return k;
}

class TinyNet : public nn::Module {
 public:
  TinyNet() { fc_ = register_module("fc", std::make_shared<nn::Linear>(kIn, kClasses)); }
  Tensor forward(const Tensor& x) override { return F::log_softmax(fc_->forward(x)); }

 private:
  std::shared_ptr<nn::Linear> fc_;
};

class TinySet : public data::Dataset {
 public:
  explicit TinySet(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  void get_batch_into(const std::vector<int64_t>& idx, data::Batch& out) const override {
    const int64_t b = static_cast<int64_t>(idx.size());
    std::vector<float> x(b * kIn);
    std::vector<int64_t> y(b);
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t f = 0; f < kIn; ++f) x[i * kIn + f] = std::sin(0.7f * static_cast<float>(idx[i] * kIn + f));
      y[i] = idx[i] % kClasses;
    }
    out.images = Tensor::from_vector(x, {b, kIn});
    out.labels = Tensor::from_vector(y, {b});
    out.indices = idx;
  }

 private:
  int64_t n_;
};

inline void register_tiny() {
  if (!models().contains("TinyNet"))
    models().register_module("TinyNet", [](const Kwargs&) { return std::make_shared<TinyNet>(); }, Schema{});
}

// "TinySet" in datasets(): n (default 40) training samples, 16 for validation.
inline void register_tiny_set() {
  if (datasets().contains("TinySet")) return;
  datasets().register_module(
      "TinySet",
      [](const Kwargs& k, const std::string& split) -> std::shared_ptr<const data::Dataset> {
        return std::make_shared<TinySet>(split == "train" ? k.integer("n", 0) : 16);
      },
      {at_least(arg_int("n", 40, "training samples"), 1)});
}

inline RunnerOptions tiny_options(const std::string& work_dir) {
  register_tiny();
  RunnerOptions o;
  o.model = "TinyNet";
  o.optimizer = "SGD";
  o.optimizer_args.set("lr", 0.5);
  o.param_scheduler = "";
  o.train_dataset = std::make_shared<TinySet>(32);
  o.val_dataset = std::make_shared<TinySet>(12);
  o.batch_size = 8;
  o.shuffle = false;
  o.max_epochs = 1;
  o.device = "cpu";
  o.work_dir = work_dir;
  o.checkpoint_interval_epochs = 0;
  return o;
}

inline std::vector<float> flat_params(Runner& r) {
  std::vector<float> out;
  for (auto& [name, p] : r.model().named_parameters())
    for (float v : p.to_vector<float>()) out.push_back(v);
  return out;
}

}  // namespace tandem::train
