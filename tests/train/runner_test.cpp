// train::Runner: registries (an unknown type is one line naming the registered ones; keyword
// arguments are type-checked), hooks called at MMEngine's points in priority order, gradient
// accumulation equal to one big batch, best-checkpoint saving, and under 2-rank DDP a wrapper
// registered from outside (MODEL_WRAPPERS.register_module) that the Runner trains with, its backward
// passes inside no_sync() for all but the last iteration of each accumulation group; a launched job
// of one rank builds its group, DDP (with its reducer) and SyncBatchNorm as PyTorch does with
// world size 1, and trains bitwise as the same job without a launcher.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/ranks.h"
#include "common/test_util.h"
#include "core/error.h"
#include "core/profiler.h"
#include "core/random.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "kernels/amp.h"
#include "train/registries.h"
#include "train/runner.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::TempDir;

TEST(Registry, UnknownTypeIsOneLineNamingTheRegistered) {
  const std::string e = test::error_of([] { models().get("ResNet50"); });
  EXPECT_NE(e.find("unknown model type 'ResNet50'; registered: "), std::string::npos) << e;
  EXPECT_NE(e.find("MnistNet"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_THROW(models().register_module("MnistNet", [](const Kwargs&) { return std::shared_ptr<nn::Module>(); }),
               Error);
}

TEST(Registry, KwargsAreTypeCheckedAndUnknownOnesNamed) {
  Kwargs k("optim_wrapper.optimizer");
  k.set_json("lr", "\"fast\"");
  EXPECT_NE(test::error_of([&] { k.number("lr", 1.0); }).find("optim_wrapper.optimizer.lr must be a number"),
            std::string::npos);
  Kwargs u("optim_wrapper.optimizer");
  u.set("momentun", 0.9);
  const std::string e = test::error_of([&] { optimizers().get("SGD")({}, u); });
  EXPECT_NE(e.find("unknown argument 'momentun' (did you mean 'momentum'?); expected one of: lr, momentum"), std::string::npos) << e;
  Kwargs d("model_wrapper_cfg");
  d.set("find_unused_parameter", true);
  EXPECT_NE(test::error_of([&] { ddp_options_from_kwargs(d); }).find("unknown argument 'find_unused_parameter'"),
            std::string::npos);
  Kwargs ok("model_wrapper_cfg");
  ok.set("static_graph", true);
  ok.set("broadcast_buffers", false);
  ok.set("bucket_cap_mb", 4.0);
  const dist::DDPOptions opts = ddp_options_from_kwargs(ok);
  EXPECT_TRUE(opts.reducer.static_graph);
  EXPECT_FALSE(opts.broadcast_buffers);
  EXPECT_EQ(opts.reducer.bucket_cap_mb, 4.0);
}

TEST(Runner, UnknownWrapperFailsEvenWithoutDdp) {
  TempDir tmp("runner");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.model_wrapper = "NoSuchDDP";
  const std::string e = test::error_of([&] { Runner r(o); });
  EXPECT_NE(e.find("unknown model wrapper type 'NoSuchDDP'; registered: DistributedDataParallel, "
                   "FullyShardedDataParallel, MMDistributedDataParallel, MMFullyShardedDataParallel"),
            std::string::npos)
      << e;
}

// Records every call point with its priority.
class Recorder : public Hook {
 public:
  Recorder(std::vector<std::string>& log, int priority, std::string tag)
      : log_(log), priority_(priority), tag_(std::move(tag)) {}
  std::string name() const override { return tag_; }
  int priority() const override { return priority_; }
  void before_run(Runner&) override { log_.push_back(tag_ + ":before_run"); }
  void after_run(Runner&) override { log_.push_back(tag_ + ":after_run"); }
  void before_train_epoch(Runner& r) override { log_.push_back(tag_ + ":before_epoch" + std::to_string(r.epoch())); }
  void after_train_epoch(Runner& r) override { log_.push_back(tag_ + ":after_epoch" + std::to_string(r.epoch())); }
  void before_train_iter(Runner&) override { log_.push_back(tag_ + ":before_iter"); }
  void after_train_iter(Runner& r, const IterOutputs&) override {
    log_.push_back(tag_ + ":after_iter" + std::to_string(r.global_iter()));
  }
  void before_val_epoch(Runner&) override { log_.push_back(tag_ + ":before_val"); }
  void after_val_epoch(Runner&, const ValMetrics& v) override {
    log_.push_back(tag_ + ":after_val" + std::to_string(v.total));
  }

 private:
  std::vector<std::string>& log_;
  int priority_;
  std::string tag_;
};

// --profile's table: the ops of validation are counted under "evaluation", never as training.
TEST(Runner, ProfileCountsValidationApartFromTraining) {
  TempDir dir("runner_profile");
  RunnerOptions o = tiny_options(dir.file("w"));
  profiler::reset();
  profiler::set_enabled(true);
  Runner r(o);
  const int rc = r.train();
  profiler::set_enabled(false);
  ASSERT_EQ(rc, 0);
  int64_t train_fwd = 0, train_bwd = 0, eval_fwd = 0, eval_bwd = 0;
  for (const auto& s : profiler::snapshot()) {
    if (s.op != "linear_forward" && s.op != "linear_backward") continue;
    (s.section == "training" ? (s.backward ? train_bwd : train_fwd) : (s.backward ? eval_bwd : eval_fwd)) += s.calls;
    EXPECT_TRUE(s.section == "training" || s.section == "evaluation") << s.section;
  }
  profiler::reset();
  EXPECT_EQ(train_fwd, 4);  // 32 samples in batches of 8, one epoch
  EXPECT_GE(train_bwd, 4);
  EXPECT_EQ(eval_fwd, 1);   // 12 samples in one validation batch (val_batch_size 256)
  EXPECT_EQ(eval_bwd, 0);
}

TEST(Runner, HooksRunAtEachPointInPriorityOrder) {
  TempDir tmp("runner");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.train_dataset = std::make_shared<TinySet>(16);  // 2 iterations per epoch
  o.max_epochs = 2;
  Runner r(o);
  std::vector<std::string> log;
  r.register_hook(std::make_shared<Recorder>(log, kLow, "low"));
  r.register_hook(std::make_shared<Recorder>(log, kHigh, "high"));
  ASSERT_EQ(r.train(), 0);
  std::vector<std::string> low;
  for (const std::string& s : log)
    if (s.rfind("low:", 0) == 0) low.push_back(s.substr(4));
  const std::vector<std::string> want = {"before_run",  "before_epoch1", "before_iter", "after_iter1",
                                         "before_iter", "after_iter2",   "after_epoch1", "before_val",
                                         "after_val12", "before_epoch2", "before_iter", "after_iter3",
                                         "before_iter", "after_iter4",   "after_epoch2", "before_val",
                                         "after_val12", "after_run"};
  EXPECT_EQ(low, want);
  ASSERT_EQ(log.size(), 2 * want.size());
  for (size_t i = 0; i < log.size(); i += 2) {  // every point: high first, then low
    EXPECT_EQ(log[i].rfind("high:", 0), 0u) << i << ": " << log[i];
    EXPECT_EQ(log[i].substr(5), log[i + 1].substr(4));
  }
}

TEST(Runner, AccumulationOfTwoHalfBatchesIsOneFullBatch) {
  TempDir tmp("runner");
  RunnerOptions big = tiny_options(tmp.file("big"));
  big.batch_size = 16;  // 2 iterations, one update each
  RunnerOptions acc = tiny_options(tmp.file("acc"));
  acc.batch_size = 8;  // 4 iterations, an update every 2
  acc.accumulative_counts = 2;
  Runner a(big), b(acc);
  ASSERT_EQ(a.train(), 0);
  ASSERT_EQ(b.train(), 0);
  const std::vector<float> pa = flat_params(a), pb = flat_params(b);
  ASSERT_EQ(pa.size(), pb.size());
  double max_diff = 0;
  for (size_t i = 0; i < pa.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::fabs(pa[i] - pb[i])));
  EXPECT_LT(max_diff, 1e-6);
  // Not the same as stepping every half batch (the test can fail).
  RunnerOptions every = tiny_options(tmp.file("every"));
  every.batch_size = 8;
  Runner c(every);
  ASSERT_EQ(c.train(), 0);
  const std::vector<float> pc = flat_params(c);
  double diff_c = 0;
  for (size_t i = 0; i < pa.size(); ++i) diff_c = std::max(diff_c, static_cast<double>(std::fabs(pa[i] - pc[i])));
  EXPECT_GT(diff_c, 1e-3);
}

// Records the grad_norm of every update.
class NormWatch : public Hook {
 public:
  std::string name() const override { return "NormWatch"; }
  void after_train_iter(Runner&, const IterOutputs& out) override {
    if (out.updated) norms.push_back(out.grad_norm);
  }
  std::vector<double> norms;
};

// Under fp16 loss scaling the gradients are unscaled before the norm is taken and clipped (as
// AmpOptimWrapper does): the norms match a float32 run's, not 65536x them.
TEST(Runner, ClippingUnderFp16SeesUnscaledGradients) {
  TempDir tmp("runner");
  std::vector<double> norms[2];
  for (int fp16 = 0; fp16 < 2; ++fp16) {
    RunnerOptions o = tiny_options(tmp.file(fp16 ? "fp16" : "f32"));
    o.amp = fp16 ? "fp16" : "off";
    o.clip_max_norm = 0.05;  // clips every update here
    Runner r(o);
    auto w = std::make_shared<NormWatch>();
    r.register_hook(w);
    ASSERT_EQ(r.train(), 0);
    norms[fp16] = w->norms;
  }
  ASSERT_EQ(norms[0].size(), 4u);
  ASSERT_EQ(norms[1].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(norms[0][i], 0.05) << "update " << i << " must be clipped for the test to mean anything";
    EXPECT_NEAR(norms[1][i], norms[0][i], 0.02 * norms[0][i]) << "update " << i;
  }
}

// MMEngine's --amp alone on the CPU: bf16 where the CPU has native bf16 kernels (AVX512_BF16 or AMX
// through oneDNN), else float32, since emulated bf16 is slower than float32 (kernels/amp.h).
TEST(Runner, AmpAutoOnTheCpuChoosesBf16OnlyWhereItPays) {
  TempDir tmp("runner");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.amp = "auto";
  Runner r(o);
  ASSERT_EQ(r.train(), 0);
  EXPECT_EQ(r.options().amp, kernels::cpu_bf16_pays() ? "bf16" : "off");
}

TEST(Runner, SaveBestKeepsOnlyTheBestCheckpoint) {
  TempDir tmp("runner");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.max_epochs = 3;
  o.save_best = "loss";
  Runner r(o);
  ASSERT_EQ(r.train(), 0);
  int best = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.file("w")))
    if (e.path().filename().string().rfind("best_loss_epoch_", 0) == 0 &&
        e.path().string().find(".state.") == std::string::npos)
      ++best;
  EXPECT_EQ(best, 1);
}

// [CountingDDP] a wrapper an embedding program registers: DDP that records, per forward, whether
// the reducer will synchronise this backward.
class RecordingDDP : public dist::DistributedDataParallel {
 public:
  using DistributedDataParallel::DistributedDataParallel;
  Tensor forward(const Tensor& x) override {
    syncs.push_back(reducer().require_sync());
    return DistributedDataParallel::forward(x);
  }
  static inline std::vector<bool> syncs;
};

TEST(RunnerDdp, RegisteredWrapperTrainsWithNoSyncInsideAccumulationGroups) {
  if (auto rank = test::child_rank()) {
    register_tiny();
    if (!model_wrappers().contains("RecordingDDP"))
      model_wrappers().register_module("RecordingDDP", [](const WrapContext& c, const Kwargs& k) {
        return std::make_shared<RecordingDDP>(c.model, c.group, ddp_options_from_kwargs(k));
      });
    ::setenv("RANK", std::to_string(rank->rank).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank->rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::setenv("GROUP_RANK", "0", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", rank->param.c_str(), 1);
    RunnerOptions o = tiny_options(rank->param + "_unused");
    o.work_dir = std::string(std::getenv("TANDEM_TEST_STORE")) + ".work";
    o.launcher = "pytorch";
    o.model_wrapper = "RecordingDDP";
    o.accumulative_counts = 2;
    o.train_dataset = std::make_shared<TinySet>(80);  // 40 per rank: 5 iterations of 8
    o.dist_timeout_s = 30;
    Runner r(o);
    ASSERT_EQ(r.train(), 0);
    ASSERT_NE(r.ddp(), nullptr);
    // Groups (1,2), (3,4), (5): the last iteration of each group and of the run synchronises.
    EXPECT_EQ(RecordingDDP::syncs, (std::vector<bool>{false, true, false, true, true}));
    return;
  }
  test::run_ranks(2, std::to_string(test::free_port()));
}

// TinyNet with a BatchNorm2d over its 6 features (as [N, 6, 1, 1]) before the classifier.
class TinyBnNet : public nn::Module {
 public:
  TinyBnNet() {
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(kIn));
    fc_ = register_module("fc", std::make_shared<nn::Linear>(kIn, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    return F::log_softmax(fc_->forward(F::reshape(bn->forward(x.view({x.size(0), kIn, 1, 1})), {x.size(0), kIn})));
  }
  std::shared_ptr<nn::BatchNorm2d> bn;

 private:
  std::shared_ptr<nn::Linear> fc_;
};

// Every iteration's loss, bit for bit.
class LossLog : public Hook {
 public:
  explicit LossLog(std::vector<double>& out) : out_(out) {}
  std::string name() const override { return "LossLog"; }
  void after_train_iter(Runner&, const IterOutputs& o) override { out_.push_back(o.loss); }

 private:
  std::vector<double>& out_;
};

TEST(RunnerDdp, OneLaunchedRankBuildsGroupReducerAndSyncBnAndTrainsAsThePlainRun) {
  if (auto rank = test::child_rank()) {  // one rank, in its own process: the launcher's variables
    if (!models().contains("TinyBnNet"))
      models().register_module("TinyBnNet", [](const Kwargs&) { return std::make_shared<TinyBnNet>(); });
    auto run = [&](const std::string& launcher, std::vector<double>& losses, std::vector<double>& state) {
      RunnerOptions o = tiny_options(std::string(std::getenv("TANDEM_TEST_STORE")) + "." + launcher);
      o.model = "TinyBnNet";
      o.launcher = launcher;
      o.backend = "gloo";
      o.sync_bn = true;
      o.shuffle = true;
      o.max_epochs = 2;
      o.dist_timeout_s = 30;
      auto r = std::make_unique<Runner>(o);
      r->register_hook(std::make_shared<LossLog>(losses));
      EXPECT_EQ(r->train(), 0);
      for (auto& [name, t] : r->model().state_dict())
        for (double v : t.to(kFloat64).to_vector<double>()) state.push_back(v);
      return r;
    };
    std::vector<double> plain_losses, ddp_losses;
    std::vector<double> plain_state, ddp_state;
    auto plain = run("none", plain_losses, plain_state);
    EXPECT_EQ(plain->ddp(), nullptr) << "launcher none: no DDP";
    EXPECT_EQ(plain->host_group(), nullptr) << "launcher none: no process group";
    EXPECT_EQ(dynamic_cast<TinyBnNet&>(plain->model()).bn->stats_sync(), nullptr) << "launcher none: no SyncBN";

    ::setenv("RANK", "0", 1);
    ::setenv("LOCAL_RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
    ::setenv("LOCAL_WORLD_SIZE", "1", 1);
    ::setenv("GROUP_RANK", "0", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", rank->param.c_str(), 1);
    auto ddp = run("pytorch", ddp_losses, ddp_state);
    EXPECT_EQ(ddp->world_size(), 1);
    ASSERT_NE(ddp->ddp(), nullptr) << "one launched rank: the model is wrapped in DistributedDataParallel";
    const dist::ReducerStats& reduced = ddp->ddp()->reducer().stats();
    EXPECT_GT(reduced.buckets, 0) << "the reducer all-reduced no bucket in the last backward";
    EXPECT_GT(reduced.bucket_bytes, 0);
    ASSERT_NE(ddp->host_group(), nullptr) << "one launched rank: a process group";
    EXPECT_EQ(ddp->host_group()->size(), 1);
    EXPECT_EQ(ddp->host_group()->backend(), "gloo");
    const auto& sync = dynamic_cast<TinyBnNet&>(ddp->model()).bn->stats_sync();
    ASSERT_NE(sync, nullptr) << "one launched rank with sync_bn: the BatchNorm is synced";
    EXPECT_EQ(sync->name(), "SyncBatchNorm(gloo, 1 ranks)");
    // World size 1: the all-reduces average over one rank and SyncBatchNorm is BatchNorm, so
    // every loss and every weight and buffer equals the plain run's, bit for bit.
    ASSERT_EQ(plain_losses.size(), 8u);  // 2 epochs x 32 / 8
    EXPECT_EQ(ddp_losses, plain_losses);
    EXPECT_EQ(ddp_state, plain_state);
    return;
  }
  test::run_ranks(1, std::to_string(test::free_port()));
}

}  // namespace
}  // namespace tandem::train
