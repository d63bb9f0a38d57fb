// AmpOptimWrapper's loss_scale, as MMEngine's: 'dynamic', a number (a static scale: the scale never
// grows or backs off, overflowing steps are still skipped) or a dict of GradScaler's keywords; the
// one-line errors for anything else; the config's three forms through complete_run_config,
// config.json and a Runner trained from a config.
#include <gtest/gtest.h>

#include <limits>

#include "common/test_util.h"
#include "nn/functional.h"
#include "train/optim_wrapper.h"
#include "train/run_config.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::error_of;

std::unique_ptr<OptimWrapper> fp16_wrapper(Tensor p, const std::string& loss_scale) {
  return optim_wrappers().get("AmpOptimWrapper")(
      std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{.lr = 0.125}),
      args("optim_wrapper", {{"dtype", "\"float16\""}, {"loss_scale", loss_scale.c_str()}}));
}

// One update of sum(p * factor): the gradient is factor (times the scale before unscaling).
void iteration(OptimWrapper& w, Tensor& p, float factor) {
  w.backward(F::sum(F::scale(p, factor)));
  w.step();
  w.zero_grad(true);
}

TEST(LossScale, AStaticScaleNeverMovesAndOverflowingStepsAreSkipped) {
  Tensor p = Tensor::from_vector<float>({1.f}, {1}).set_requires_grad(true);
  auto w = fp16_wrapper(p, "512.0");
  w->initialize_count_status(0, 6);
  EXPECT_EQ(w->options().loss_scale.static_scale, 512.0);
  ASSERT_TRUE(w->scaler().enabled());
  EXPECT_EQ(w->scaler().get_scale(), 512.0);
  iteration(*w, p, 8.f);  // grad 8: p = 1 - 0.125 * 8 = 0
  EXPECT_EQ(p.detach().to_vector<float>()[0], 0.f);
  EXPECT_EQ(w->scaler().get_scale(), 512.0);
  // 1e36 * 512 overflows float32: the step is skipped and a dynamic scaler would halve the scale.
  iteration(*w, p, 1e36f);
  EXPECT_EQ(p.detach().to_vector<float>()[0], 0.f) << "the overflowing step is skipped";
  EXPECT_EQ(w->scaler().get_scale(), 512.0) << "a static scale does not back off";
  for (int i = 0; i < 3; ++i) iteration(*w, p, -8.f);
  EXPECT_EQ(p.detach().to_vector<float>()[0], 3.f);
  EXPECT_EQ(w->scaler().get_scale(), 512.0) << "nor grow";

  Tensor q = Tensor::from_vector<float>({1.f}, {1}).set_requires_grad(true);
  auto dynamic = fp16_wrapper(q, "\"dynamic\"");
  dynamic->initialize_count_status(0, 1);
  iteration(*dynamic, q, 1e36f);
  EXPECT_EQ(dynamic->scaler().get_scale(), 32768.0) << "'dynamic' backs off from PyTorch's 65536";
  EXPECT_EQ(dynamic->options().loss_scale.static_scale, 0.0);
}

TEST(LossScale, TheDictFormSetsGradScalersKeywords) {
  Tensor p = Tensor::from_vector<float>({1.f}, {1}).set_requires_grad(true);
  auto w = fp16_wrapper(p, R"({"init_scale": 8, "growth_interval": 2, "growth_factor": 4.0})");
  w->initialize_count_status(0, 8);
  const std::vector<double> expected = {8, 8, 32, 32, 128};  // grows after every second clean step
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(w->scaler().get_scale(), expected[i]) << "before iteration " << i;
    iteration(*w, p, 0.f);
  }
  EXPECT_EQ(w->scaler().get_scale(), 128.0);
  EXPECT_FALSE(fp16_wrapper(p, R"({"enabled": false})")->scaler().enabled());
  const optim::GradScalerOptions d = parse_loss_scale(R"({"backoff_factor": 0.25})", "x").scaler;
  EXPECT_EQ(d.backoff_factor, 0.25);
  EXPECT_EQ(d.init_scale, 65536.0) << "PyTorch's defaults for the keys left out";
  EXPECT_EQ(d.growth_interval, 2000);
}

TEST(LossScale, AnythingElseIsAOneLineError) {
  Tensor p = Tensor::from_vector<float>({1.f}, {1}).set_requires_grad(true);
  const char* kinds = "must be 'dynamic', a positive number or a dict of GradScaler's keywords";
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, "\"static\""); }), std::string("config key 'optim_wrapper.loss_scale' ") + kinds);
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, "true"); }), kinds);
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, "[512]"); }), kinds);
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, "0"); }),
             "config key 'optim_wrapper.loss_scale' must be a positive number (finite in float32) for a static scale, got 0");
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, "-512.0"); }), "must be a positive number");
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, "1e39"); }), "must be a positive number");
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, R"({"growth_intervall": 10})"); }),
             "optim_wrapper.loss_scale: unknown argument 'growth_intervall' (did you mean 'growth_interval'?)");
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, R"({"backoff_factor": 1.5})"); }),
             "config key 'optim_wrapper.loss_scale.backoff_factor' must be in (0, 1), got 1.5");
  EXPECT_HAS(error_of([&] { fp16_wrapper(p, R"({"init_scale": 0})"); }),
             "config key 'optim_wrapper.loss_scale.init_scale' must be > 0, got 0");
}

Json tiny_tree(const Json& loss_scale, const std::string& type) {
  Json tree = Json::parse(R"({"model": {"type": "TinyNet"},
      "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.5}, "dtype": "float16"}, "param_scheduler": [],
      "train_cfg": {"max_epochs": 1}, "train_dataloader": {"batch_size": 8, "dataset": {"type": "TinySet"}},
      "val_dataloader": {"dataset": {"type": "TinySet"}},
      "env_cfg": {"device": "cpu"}, "default_hooks": {"checkpoint": {"interval": 0}}})");
  tree["optim_wrapper"]["type"] = type;
  if (!loss_scale.is_null()) tree["optim_wrapper"]["loss_scale"] = loss_scale;
  return tree;
}

Json completed(const Json& tree) { return complete_run_config(merge_onto_defaults(default_run_config(), tree));
}

TEST(LossScale, EachFormRoundTripsThroughTheConfig) {
  register_tiny();
  register_tiny_set();
  const std::vector<Json> forms = {Json("dynamic"), Json(512.0), Json::parse(R"({"init_scale": 1024, "growth_interval": 3})")};
  for (const Json& form : forms) {
    const Json done = completed(tiny_tree(form, "AmpOptimWrapper"));
    EXPECT_EQ(done["optim_wrapper"]["loss_scale"], form);
    EXPECT_EQ(complete_run_config(done), done) << form.dump();
    EXPECT_EQ(runner_options_from_config(done).loss_scale, form.dump());
  }
  EXPECT_EQ(completed(tiny_tree(Json(), "AmpOptimWrapper"))["optim_wrapper"]["loss_scale"], "dynamic")
      << "MMEngine's default";
  Json plain = tiny_tree(Json(512.0), "OptimWrapper");
  plain["optim_wrapper"].erase("dtype");
  EXPECT_HAS(error_of([&] { completed(plain); }),
             "config key 'optim_wrapper.loss_scale' needs type AmpOptimWrapper");
  EXPECT_HAS(error_of([&] { completed(tiny_tree(Json::parse(R"({"growth": 2})"), "AmpOptimWrapper")); }),
             "optim_wrapper.loss_scale: unknown argument 'growth'");
}

// A float16 run from a config with a static scale: the Runner's wrapper ends with the scale it
// started with, and the config.json it writes holds the number and builds the same run again.
TEST(LossScale, ARunnerFromAConfigKeepsTheStaticScale) {
  register_tiny();
  register_tiny_set();
  test::TempDir tmp("loss_scale");
  Json tree = tiny_tree(Json(256.0), "AmpOptimWrapper");
  tree["work_dir"] = tmp.file("a");
  auto r = Runner::from_config(tree.dump());
  ASSERT_EQ(r->train(), 0);
  EXPECT_EQ(r->scaler().get_scale(), 256.0);
  EXPECT_EQ(r->optim_wrapper().options().loss_scale.static_scale, 256.0);
  const Json written = Json::parse(test::read_file(tmp / "a" / "config.json"));
  EXPECT_EQ(written["optim_wrapper"]["loss_scale"], 256.0);
  Json again = written;
  again["work_dir"] = tmp.file("b");
  auto r2 = Runner::from_config(again.dump());
  ASSERT_EQ(r2->train(), 0);
  EXPECT_EQ(flat_params(*r2), flat_params(*r));
}

}  // namespace
}  // namespace tandem::train
