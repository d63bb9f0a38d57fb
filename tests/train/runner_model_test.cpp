// The Runner's model interface, evaluator and loops: a BaseModel's named losses are summed for
// backward and each reported (a one-loss BaseModel trains bitwise as the plain module); the
// evaluator's Accuracy (top-k, argmax's tie and NaN rule) and Loss (perplexity) metrics, their
// keyword checks and the sums over ranks; IterBasedTrainLoop (max_iters across epochs, validation
// every val_interval iterations, a checkpoint and resume by iteration equal to the uninterrupted run);
// TestLoop on a saved checkpoint measuring what the run's last validation measured.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/ranks.h"
#include "common/test_util.h"
#include "core/error.h"
#include "core/random.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/pointwise.h"
#include "train/evaluator.h"
#include "train/model.h"
#include "train/runner.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::TempDir;

// TinyNet's network as a BaseModel; `extra` adds a second named loss: 0.01 x the weights' sum.
class TinyModel : public BaseModel {
 public:
  explicit TinyModel(bool extra) : extra_(extra) {
    fc_ = register_module("fc", std::make_shared<nn::Linear>(kIn, kClasses));
  }
  Tensor forward(const Tensor& x) override { return F::log_softmax(fc_->forward(x)); }
  LossList loss(const Tensor& outputs, const DataBatch& batch) override {
    LossList out{{"loss_cls", F::nll_loss(outputs, batch_tensor(batch, "labels"))}};
    if (extra_) out.emplace_back("loss_reg", F::scale(F::sum(fc_->weight), 0.01));
    return out;
  }

 private:
  bool extra_;
  std::shared_ptr<nn::Linear> fc_;
};

class RecordIters : public Hook {
 public:
  std::string name() const override { return "RecordIters"; }
  void after_train_iter(Runner& r, const IterOutputs& out) override {
    outs.push_back(out);
    globals.push_back(r.global_iter());
  }
  void after_val_epoch(Runner& r, const ValMetrics& v) override {
    val_at.push_back(r.global_iter());
    last = v;
  }
  std::vector<IterOutputs> outs;
  std::vector<int64_t> globals, val_at;
  ValMetrics last;
};

TEST(RunnerModel, OneLossBaseModelTrainsBitwiseAsThePlainModule) {
  TempDir tmp("runner_model");
  RunnerOptions plain = tiny_options(tmp.file("a"));
  plain.max_epochs = 2;
  Runner a(plain);
  ASSERT_EQ(a.train(), 0);
  RunnerOptions o = tiny_options(tmp.file("b"));
  o.max_epochs = 2;
  manual_seed(o.seed);  // the same initial weights as the registry's TinyNet built after the seed
  o.model_instance = std::make_shared<TinyModel>(false);
  Runner b(o);
  ASSERT_EQ(b.train(), 0);
  EXPECT_EQ(flat_params(a), flat_params(b));
}

TEST(RunnerModel, NamedLossesAreSummedForBackwardAndEachReported) {
  TempDir tmp("runner_model");
  RunnerOptions o = tiny_options(tmp.file("w"));
  auto model = std::make_shared<TinyModel>(true);
  o.model_instance = model;
  Runner r(o);
  auto rec = std::make_shared<RecordIters>();
  r.register_hook(rec);
  ASSERT_EQ(r.train(), 0);
  ASSERT_EQ(rec->outs.size(), 4u);
  for (const IterOutputs& out : rec->outs) {
    ASSERT_EQ(out.losses.size(), 2u);
    EXPECT_EQ(out.losses[0].first, "loss_cls");
    EXPECT_EQ(out.losses[1].first, "loss_reg");
    EXPECT_NEAR(out.loss, out.losses[0].second + out.losses[1].second, 1e-6);
    EXPECT_NE(out.losses[1].second, 0.0);
  }
  EXPECT_EQ(&r.task(), static_cast<ModelTask*>(model.get()));
}

TEST(Evaluator, AccuracyTopKFollowsArgmaxTiesAndNaN) {
  Kwargs k("val_evaluator.Accuracy");
  k.set_json("topk", "[1, 2]");
  Evaluator e({{"Accuracy", k}, {"Loss", Kwargs("val_evaluator.Loss")}});
  // Rows: label 0 best (top-1); label 2 second (top-2); label 2 tied with class 1 (argmax says 1:
  // top-2); a NaN at class 0 and label 1 (argmax says 0: top-2); label 1 third (neither).
  const float nan = std::nanf("");
  const Tensor p = Tensor::from_vector<float>({3, 1, 0, 0, 1, 0.5f, 0, 2, 2, nan, 1, 0, 4, 1, 5}, {5, 3});
  const Tensor y = Tensor::from_vector<int64_t>({0, 2, 2, 1, 1}, {5});
  const DataBatch batch{{"inputs", Tensor::zeros({5, 1})}, {"labels", y}};
  e.process(batch, p, 0.5);
  e.process(batch, p, 1.5);
  const ValMetrics v = e.evaluate(nullptr);
  ASSERT_NE(v.find("accuracy/top1"), nullptr);
  EXPECT_DOUBLE_EQ(*v.find("accuracy/top1"), 2.0 / 10);
  EXPECT_DOUBLE_EQ(*v.find("accuracy/top2"), 8.0 / 10);
  EXPECT_EQ(v.correct, 2);
  EXPECT_EQ(v.total, 10);
  EXPECT_DOUBLE_EQ(v.accuracy, 0.2);
  EXPECT_DOUBLE_EQ(v.loss, 1.0);  // (0.5 x 5 + 1.5 x 5) / 10
  EXPECT_EQ(v.find("perplexity"), nullptr);
}

TEST(Evaluator, PerplexityAndKeywordChecks) {
  Kwargs k("val_evaluator.Loss");
  k.set("perplexity", true);
  Evaluator e({{"Loss", k}});
  e.process({{"inputs", Tensor::zeros({4, 2})}}, Tensor(), 2.0);
  const ValMetrics v = e.evaluate(nullptr);
  ASSERT_NE(v.find("perplexity"), nullptr);
  EXPECT_NEAR(*v.find("perplexity"), std::exp(2.0), 1e-9);
  Kwargs bad("val_evaluator.Accuracy");
  bad.set_json("topk", "[0]");
  EXPECT_HAS(test::error_of([&] { Evaluator x({{"Accuracy", bad}}); }), "val_evaluator.Accuracy.topk");
  Kwargs unknown("val_evaluator.Accuracy");
  unknown.set_json("top", "1");
  EXPECT_HAS(test::error_of([&] { Evaluator x({{"Accuracy", unknown}}); }), "top");
  EXPECT_HAS(test::error_of([&] { Evaluator x({{"F1", Kwargs()}}); }), "unknown metric type 'F1'");
}

TEST(RunnerModel, IterBasedLoopRunsMaxItersAcrossEpochsAndValidatesEveryInterval) {
  TempDir tmp("runner_model");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.max_iters = 6;  // 4 iterations per epoch: one epoch and a half
  o.val_interval = 4;
  Runner r(o);
  auto rec = std::make_shared<RecordIters>();
  r.register_hook(rec);
  ASSERT_EQ(r.train(), 0);
  EXPECT_EQ(r.global_iter(), 6);
  EXPECT_EQ(r.max_epochs(), 2);
  EXPECT_EQ(rec->val_at, (std::vector<int64_t>{4, 6}));
  EXPECT_GT(rec->last.accuracy, 0.0);
}

TEST(RunnerModel, IterBasedResumeFromAnIterationCheckpointEqualsTheUninterruptedRun) {
  TempDir tmp("runner_model");
  RunnerOptions whole = tiny_options(tmp.file("whole"));
  whole.max_iters = 7;
  whole.shuffle = true;
  Runner a(whole);
  ASSERT_EQ(a.train(), 0);
  RunnerOptions first = tiny_options(tmp.file("part"));
  first.max_iters = 3;
  first.shuffle = true;
  first.checkpoint_interval_iters = 3;
  Runner b(first);
  ASSERT_EQ(b.train(), 0);
  RunnerOptions rest = first;
  rest.max_iters = 7;
  rest.resume = "auto";
  Runner c(rest);
  ASSERT_EQ(c.train(), 0);
  EXPECT_EQ(c.global_iter(), 7);
  EXPECT_EQ(flat_params(a), flat_params(c));
}

TEST(RunnerModel, TestLoopOnTheLastCheckpointMeasuresTheLastValidation) {
  TempDir tmp("runner_model");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.max_epochs = 2;
  o.checkpoint_interval_epochs = 1;
  Kwargs topk("val_evaluator.Accuracy");
  topk.set_json("topk", "[1, 2]");
  o.val_evaluator = {{"Accuracy", topk}, {"Loss", Kwargs("val_evaluator.Loss")}};
  Runner r(o);
  auto rec = std::make_shared<RecordIters>();
  r.register_hook(rec);
  ASSERT_EQ(r.train(), 0);
  RunnerOptions t = o;
  t.work_dir = tmp.file("test");
  t.load_from = tmp.file("w") + "/iter_8.safetensors";
  ASSERT_TRUE(std::filesystem::exists(t.load_from));
  Runner tester(t);
  const ValMetrics v = tester.test();
  ASSERT_EQ(v.values.size(), 3u);
  EXPECT_EQ(v.values, rec->last.values);
  RunnerOptions none = o;
  none.work_dir = tmp.file("none");
  EXPECT_HAS(test::error_of([&] { Runner(none).test(); }), "no weights to test");
}

}  // namespace
}  // namespace tandem::train
