// runner_example: a program that trains its own model through train::Runner, built against the
// installed package only. It registers its model ("Mlp", with the model interface: two named
// losses), its own DDP wrapper ("CountingDDP",
// derived from dist::DistributedDataParallel, as MMEngine's MODEL_WRAPPERS.register_module) and a
// hook, then:
//   1. trains 3 epochs straight (work dir A);
//   2. trains 2 epochs (work dir B) and resumes from B's last checkpoint to epoch 3;
// and checks that both end with bit-identical parameters (the Runner's exact resume), that the
// last epoch's mean loss is under 0.75x the first loss, and under DDP that the custom wrapper ran.
// Assumes: started by tandem-run (or torchrun; launcher "pytorch"), or alone without RANK.
// Guarantees: exit 0 only when every check holds on this rank; otherwise prints why and exits 1.
// Work dirs go under $RUNNER_EXAMPLE_DIR (default /tmp/tandem-runner-example-<pid of rank 0's launcher>).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "dist/parallel/ddp.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/pointwise.h"
#include "train/model.h"
#include "train/registries.h"
#include "train/runner.h"

using namespace tandem;

namespace {

constexpr int64_t kFeatures = 16, kHidden = 32, kClasses = 4, kSamples = 512;

// [runner-model]
// The model interface (MMEngine's BaseModel): forward() is the network (what DDP runs), loss()
// names the losses of its outputs on a batch (the Runner sums them for backward and logs each),
// predict() what the evaluator reads (by default the outputs).
class Mlp : public train::BaseModel {
 public:
  Mlp() {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(kFeatures, kHidden));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kClasses));
  }
  Tensor forward(const Tensor& x) override { return F::log_softmax(fc2_->forward(F::relu(fc1_->forward(x)))); }
  train::LossList loss(const Tensor& log_probs, const train::DataBatch& batch) override {
    return {{"loss_cls", F::nll_loss(log_probs, train::batch_tensor(batch, "labels"))},
            {"loss_l2", F::scale(F::sum(F::mul(fc1_->weight, fc1_->weight)), 1e-4)}};
  }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};
// [runner-model]

// [runner-wrapper]
// A DDP wrapper of the program's own: DistributedDataParallel plus a forward counter. Deriving from
// DistributedDataParallel keeps no_sync() (gradient accumulation) and the reducer's log numbers.
class CountingDDP : public dist::DistributedDataParallel {
 public:
  using DistributedDataParallel::DistributedDataParallel;
  Tensor forward(const Tensor& x) override {
    ++forwards;
    return DistributedDataParallel::forward(x);
  }
  static inline int64_t forwards = 0;
};
// [runner-wrapper]

// A fixed synthetic classification set: label = argmax of x through a fixed "teacher" matrix.
class Synthetic : public data::Dataset {
 public:
  Synthetic() : x_(kSamples * kFeatures), y_(kSamples) {
    Generator gen(42);
    std::vector<float> teacher(kFeatures * kClasses);
    for (auto& w : teacher) w = static_cast<float>(gen.normal());
    for (auto& v : x_) v = static_cast<float>(gen.normal());
    for (int64_t i = 0; i < kSamples; ++i) {
      double best = -1e30;
      for (int64_t c = 0; c < kClasses; ++c) {
        double s = 0;
        for (int64_t f = 0; f < kFeatures; ++f) s += x_[i * kFeatures + f] * teacher[f * kClasses + c];
        if (s > best) best = s, y_[i] = c;
      }
    }
  }
  int64_t size() const override { return kSamples; }
  void get_batch_into(const std::vector<int64_t>& indices, data::Batch& out) const override {
    const int64_t n = static_cast<int64_t>(indices.size());
    std::vector<float> xs(n * kFeatures);
    std::vector<int64_t> ys(n);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&xs[i * kFeatures], &x_[indices[i] * kFeatures], sizeof(float) * kFeatures);
      ys[i] = y_[indices[i]];
    }
    out.images = Tensor::from_vector(xs, {n, kFeatures});
    out.labels = Tensor::from_vector(ys, {n});
    out.indices = indices;
  }

 private:
  std::vector<float> x_;
  std::vector<int64_t> y_;
};

// A hook of the program's own: the first training loss and the mean loss of the last epoch.
class LossWatch : public train::Hook {
 public:
  std::string name() const override { return "LossWatch"; }
  void before_train_epoch(train::Runner&) override { sum_ = 0, n_ = 0; }
  void after_train_iter(train::Runner&, const train::IterOutputs& out) override {
    if (!out.joined) TANDEM_CHECK(out.losses.size() == 2, "the Runner did not report Mlp's two named losses");
    if (first < 0) first = out.loss;
    sum_ += out.loss, ++n_;
    last = sum_ / n_;
  }
  double first = -1, last = -1;

 private:
  double sum_ = 0;
  int64_t n_ = 0;
};

void register_types() {
  // [runner-register]
  train::models().register_module("Mlp", [](const train::Kwargs&) { return std::make_shared<Mlp>(); });
  train::model_wrappers().register_module("CountingDDP", [](const train::WrapContext& c, const train::Kwargs& k) {
    return std::make_shared<CountingDDP>(c.model, c.group, train::ddp_options_from_kwargs(k));
  });
  // [runner-register]
}

// One Runner: `epochs` epochs in `dir`, resuming from its last checkpoint when `resume`.
std::vector<Tensor> train_run(const std::string& dir, int64_t epochs, bool resume, int port_offset,
                              std::shared_ptr<LossWatch>& watch) {
  // [runner-options]
  train::RunnerOptions o;
  o.model = "Mlp";
  o.model_wrapper = "CountingDDP";
  o.optimizer = "SGD";
  o.optimizer_args.set("lr", 0.2);
  o.optimizer_args.set("momentum", 0.9);
  o.param_scheduler = "StepLR";
  o.param_scheduler_args.set("gamma", 0.5);
  o.train_dataset = std::make_shared<Synthetic>();
  o.batch_size = 32;
  o.max_epochs = epochs;
  o.val_dataset = nullptr;
  o.device = "cpu";
  o.launcher = std::getenv("RANK") ? "pytorch" : "none";
  o.work_dir = dir;
  o.log_interval = 4;
  o.resume = resume ? "auto" : "";
  const char* master_port = std::getenv("MASTER_PORT");
  if (master_port) o.port = std::atoi(master_port) + port_offset;  // a fresh store for each run
  train::Runner runner(o);
  // [runner-options]
  watch = std::make_shared<LossWatch>();
  runner.register_hook(watch);
  TANDEM_CHECK(runner.train() == 0, "the run in ", dir, " did not finish");
  std::vector<Tensor> params;
  for (auto& [name, p] : runner.model().named_parameters()) params.push_back(p.detach().contiguous());
  return params;
}

int run() {
  register_types();
  const char* base_env = std::getenv("RUNNER_EXAMPLE_DIR");
  const std::string base =
      base_env ? base_env : "/tmp/tandem-runner-example-" + std::string(std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "solo");
  if (std::getenv("RANK") == nullptr || std::string(std::getenv("RANK")) == "0") std::filesystem::remove_all(base);
  std::shared_ptr<LossWatch> straight, first, resumed;
  const std::vector<Tensor> a = train_run(base + "/A", 3, false, 1, straight);
  train_run(base + "/B", 2, false, 2, first);
  const std::vector<Tensor> b = train_run(base + "/B", 3, true, 3, resumed);
  bool equal = a.size() == b.size();
  for (size_t i = 0; equal && i < a.size(); ++i)
    if (std::memcmp(a[i].data<float>(), b[i].data<float>(), sizeof(float) * a[i].numel()) != 0) {
      std::printf("parameter %zu differs between the straight run and the resumed one\n", i);
      equal = false;
    }
  bool ok = equal;
  if (!(straight->last < 0.75 * straight->first)) {
    std::printf("the loss did not fall: first %.4f, last epoch's mean %.4f\n", straight->first, straight->last);
    ok = false;
  }
  const bool ddp = std::getenv("RANK") && std::atoi(std::getenv("WORLD_SIZE")) > 1;
  if (ddp && CountingDDP::forwards == 0) {
    std::printf("the registered wrapper CountingDDP never ran\n");
    ok = false;
  }
  std::printf("runner_example: %s (loss %.4f -> last epoch's mean %.4f, %lld forwards through CountingDDP, "
              "resumed run equal: %s)\n",
              ok ? "OK" : "FAILED", straight->first, straight->last, static_cast<long long>(CountingDDP::forwards),
              equal ? "yes" : "no");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runner_example: error: %s\n", e.what());
    return 1;
  }
}
