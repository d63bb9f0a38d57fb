// Several optimizers through the Runner's loop, as MMEngine's: optim_wrapper=dict(
// constructor='MultiOptimWrapperConstructor', gen=dict(...), disc=dict(...)) builds an
// OptimWrapperDict over the model's child modules, the model's own train_step updates each part,
// checkpoints resume every wrapper's optimizer and scaler state bitwise; what is refused, in one
// line each. TwoPartNet is registered here, not in the library's model registry.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "nn/amp.h"
#include "train/checkpoint.h"
#include "train/optim_wrapper.h"
#include "train/run_config.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::error_of;

// A generator-and-discriminator pair over TinySet: `gen` maps the inputs, `disc` classifies them.
// Its train_step updates disc on gen's detached outputs, then gen through disc (MMEngine's GAN
// models' order), each through its own wrapper.
class TwoPartNet : public BaseModel {
 public:
  TwoPartNet() {
    gen_ = register_module("gen", std::make_shared<nn::Linear>(kIn, kIn));
    disc_ = register_module("disc", std::make_shared<nn::Linear>(kIn, kClasses));
  }
  Tensor forward(const Tensor& x) override { return F::log_softmax(disc_->forward(gen_->forward(x))); }
  LossList loss(const Tensor& outputs, const DataBatch& batch) override {
    return {{"loss", F::nll_loss(outputs, batch_tensor(batch, "labels"))}};
  }
  bool has_train_step() const override { return true; }
  // [model-train-step]
  LossList train_step(const DataBatch& batch, OptimWrapperDict& optim_wrapper) override {
    const Tensor& x = batch_tensor(batch, "inputs");
    const Tensor& y = batch_tensor(batch, "labels");
    OptimWrapper& disc = optim_wrapper.at("disc");
    disc.zero_grad(true);  // drop what the last generator step left in disc's gradients
    Tensor loss_disc;
    {
      amp::AutocastGuard autocast(disc.options().precision);  // MMEngine's optim_context
      loss_disc = F::nll_loss(F::log_softmax(disc_->forward(gen_->forward(x).detach())), y);
    }
    disc.update_params(loss_disc);
    OptimWrapper& gen = optim_wrapper.at("gen");
    const Tensor loss_gen = F::nll_loss(forward(x), y);
    gen.update_params(loss_gen);
    return {{"loss_disc", loss_disc}, {"loss_gen", loss_gen}};
  }
  // [model-train-step]

 private:
  std::shared_ptr<nn::Linear> gen_, disc_;
};

void register_two_part() {
  register_tiny();
  register_tiny_set();
  if (!models().contains("TwoPartNet"))
    models().register_module("TwoPartNet", [](const Kwargs&) { return std::make_shared<TwoPartNet>(); }, Schema{});
}

Json two_optimizer_tree(const std::string& work_dir) {
  // [multi-optim-config]
  Json tree = Json::parse(R"({"model": {"type": "TwoPartNet"},
      "optim_wrapper": {"constructor": "MultiOptimWrapperConstructor",
        "gen": {"optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9}},
        "disc": {"type": "AmpOptimWrapper", "dtype": "float16", "loss_scale": {"init_scale": 1024, "growth_interval": 2},
                 "optimizer": {"type": "Adam", "lr": 0.01}}},
      "param_scheduler": {"gen": [{"type": "StepLR", "step_size": 1, "gamma": 0.5}]},
      "train_cfg": {"max_epochs": 2}, "train_dataloader": {"batch_size": 8, "dataset": {"type": "TinySet"}},
      "val_dataloader": {"dataset": {"type": "TinySet"}},
      "env_cfg": {"device": "cpu"}, "default_hooks": {"checkpoint": {"interval": 3, "by_epoch": false}}})");
  // [multi-optim-config]
  tree["work_dir"] = work_dir;
  return tree;
}

std::vector<float> values(nn::Module& m) {
  std::vector<float> out;
  for (const Tensor& p : m.parameters())
    for (float v : p.detach().to_vector<float>()) out.push_back(v);
  return out;
}

TEST(OptimWrapperDict, TheRunnerTrainsEachChildThroughItsWrapperFromAConfig) {
  register_two_part();
  test::TempDir tmp("optim_dict");
  auto r = Runner::from_config(two_optimizer_tree(tmp.file("a")).dump());
  ASSERT_EQ(r->train(), 0);
  OptimWrapperDict* w = r->optim_wrapper_dict();
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->names(), std::vector<std::string>({"disc", "gen"}));
  EXPECT_EQ(w->at("gen").optimizer().param_groups()[0].params.size(), 2u) << "gen's weight and bias";
  EXPECT_EQ(w->at("gen").optimizer().lr(), 0.1 * 0.5 * 0.5) << "gen's StepLR after each of the 2 epochs";
  EXPECT_EQ(w->at("disc").optimizer().lr(), 0.01) << "disc has no schedule";
  EXPECT_EQ(w->at("gen").inner_count(), 10) << "one update per iteration, 2 epochs x 5";
  EXPECT_EQ(w->at("disc").inner_count(), 10);
  EXPECT_FALSE(w->at("gen").scaler().enabled());
  ASSERT_TRUE(w->at("disc").scaler().enabled());
  EXPECT_EQ(w->at("disc").scaler().get_scale(), 1024.0 * 32) << "the dict form's growth_interval 2: 5 growths";
  EXPECT_EQ(&r->optim_wrapper(), &w->at("disc")) << "the first by name is the Runner's optim_wrapper()";
  // config.json holds the completed wrappers and completes to itself.
  const Json written = Json::parse(test::read_file(tmp / "a" / "config.json"));
  EXPECT_EQ(written["optim_wrapper"]["gen"]["type"], "OptimWrapper") << "MMEngine's default type";
  EXPECT_EQ(written["optim_wrapper"]["gen"]["optimizer"]["dampening"], 0.0) << "SGD's schema default";
  EXPECT_EQ(written["optim_wrapper"]["disc"]["loss_scale"], Json::parse(R"({"init_scale": 1024, "growth_interval": 2})"));
  EXPECT_FALSE(written["optim_wrapper"].contains("optimizer")) << "nothing of the one-optimizer default";
  EXPECT_EQ(complete_run_config(written), written);
}

// Stopping after iteration 6 and resuming from its checkpoint gives the uninterrupted run's weights
// bit for bit: SGD's momentum, Adam's moments and step, and disc's grown scale are all restored.
TEST(OptimWrapperDict, ResumeRestoresEveryWrappersStateBitwise) {
  register_two_part();
  test::TempDir tmp("optim_dict_resume");
  auto straight = Runner::from_config(two_optimizer_tree(tmp.file("a")).dump());
  ASSERT_EQ(straight->train(), 0);
  const Checkpoint c = load_checkpoint(tmp.file("a") + "/iter_6.safetensors");
  EXPECT_EQ(c.optimizer.count("gen.state.0.momentum_buffer"), 1u);
  EXPECT_EQ(c.scaler.count("disc.scale"), 1u);
  EXPECT_EQ(c.scaler.count("gen.scale"), 0u) << "gen's scaler is off";
  RunnerOptions o = runner_options_from_config(
      complete_run_config(merge_onto_defaults(default_run_config(), two_optimizer_tree(tmp.file("b")))));
  o.resume = tmp.file("a") + "/iter_6.safetensors";
  Runner resumed(o);
  ASSERT_EQ(resumed.train(), 0);
  EXPECT_EQ(resumed.global_iter(), 10);
  EXPECT_EQ(values(resumed.model()), values(straight->model()));
  EXPECT_EQ(resumed.optim_wrapper_dict()->at("disc").scaler().get_scale(),
            straight->optim_wrapper_dict()->at("disc").scaler().get_scale());
}

// A list (not a dict) of schedulers gives every wrapper its own copy, as MMEngine's Runner does.
TEST(OptimWrapperDict, AListOfSchedulersAppliesToEveryWrapper) {
  register_two_part();
  test::TempDir tmp("optim_dict_list");
  Json tree = two_optimizer_tree(tmp.file("a"));
  tree["param_scheduler"] = Json::parse(R"([{"type": "StepLR", "step_size": 1, "gamma": 0.5}])");
  auto r = Runner::from_config(tree.dump());
  ASSERT_EQ(r->train(), 0);
  EXPECT_EQ(r->optim_wrapper_dict()->at("gen").optimizer().lr(), 0.1 * 0.25);
  EXPECT_EQ(r->optim_wrapper_dict()->at("disc").optimizer().lr(), 0.01 * 0.25);
}

TEST(OptimWrapperDict, WhatIsRefusedIsOneLine) {
  register_two_part();
  test::TempDir tmp("optim_dict_errors");
  auto run = [&](const std::function<void(Json&)>& edit) {
    Json tree = two_optimizer_tree(tmp.file("e"));
    edit(tree);
    return error_of([&] { Runner::from_config(tree.dump())->train(); });
  };
  EXPECT_HAS(run([](Json& t) { t["model"]["type"] = "TinyNet"; }),
             "model TinyNet has several optimizers (optim_wrapper disc, gen) but does not override "
             "train_step(batch, optim_wrapper)");
  EXPECT_HAS(run([](Json& t) { t["optim_wrapper"]["generator"] = t["optim_wrapper"]["gen"]; }),
             "optim_wrapper.generator: model TwoPartNet has no child module 'generator'; its children: gen, disc");
  EXPECT_HAS(run([](Json& t) { t["optim_wrapper"].erase("constructor"); }),
             "is a wrapper config but optim_wrapper has no constructor: several optimizers need "
             "constructor='MultiOptimWrapperConstructor'");
  EXPECT_HAS(run([](Json& t) { t["optim_wrapper"]["constructor"] = "DefaultOptimWrapperConstructor"; }),
             "config key 'optim_wrapper.constructor' must be 'MultiOptimWrapperConstructor'");
  EXPECT_HAS(run([](Json& t) { t["optim_wrapper"]["gen"]["optimizer"]["lrr"] = 1; }),
             "optim_wrapper.gen.optimizer: unknown argument 'lrr' (did you mean 'lr'?)");
  EXPECT_HAS(run([](Json& t) { t["optim_wrapper"]["disc"].erase("dtype"); }),
             "config key 'optim_wrapper.disc.dtype' must be 'float16' or 'bfloat16'");
  EXPECT_HAS(run([](Json& t) { t["optim_wrapper"]["disc"]["loss_scale"] = "static"; }),
             "config key 'optim_wrapper.disc.loss_scale' must be 'dynamic', a positive number or a dict");
  EXPECT_HAS(run([](Json& t) { t["param_scheduler"]["generator"] = t["param_scheduler"]["gen"]; }),
             "config key 'param_scheduler.generator': optim_wrapper has no wrapper 'generator'");
  EXPECT_HAS(run([](Json& t) { t["param_scheduler"]["gen"][0]["step"] = 1; }),
             "param_scheduler.gen[0]: unknown argument 'step'");
}

}  // namespace
}  // namespace tandem::train
