// The Runner's parameter schedulers (train/param_scheduler.h) against real PyTorch 1.13: the lr of
// every iteration of seven MMEngine-shaped param_scheduler lists (warm-up then MultiStepLR by epoch,
// windows [begin, end), convert_to_iter_based, two param groups), from
// tests/fixtures/scheduler_lrs.json (make_scheduler_fixtures.py drives torch's schedulers as
// MMEngine's Runner drives its own). Also: begin/end by hand, exact resume from state_dict, and
// the registry's one-line refusals of bad keyword arguments.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "common/test_util.h"
#include "optim/optimizer.h"
#include "train/registries.h"

namespace tandem::train {
namespace {

using Json = nlohmann::json;
using test::error_of;

std::unique_ptr<optim::SGD> sgd(const std::vector<double>& lrs) {
  std::vector<optim::ParamGroup> groups;
  for (double lr : lrs) {
    Tensor p = Tensor::from_vector(std::vector<float>{0.f}, {1});
    p.set_requires_grad(true);
    groups.push_back({{p}, lr, 0.0});
  }
  return std::make_unique<optim::SGD>(groups, optim::SGDOptions{lrs.at(0)});
}

Kwargs kwargs_of(const Json& entry) {
  Kwargs k("param_scheduler." + entry.at("type").get<std::string>());
  for (const auto& [key, value] : entry.items())
    if (key != "type") k.set_json(key, value.dump());
  return k;
}

SchedulerList build(optim::Optimizer& opt, const Json& list, int64_t iters_per_epoch, int64_t max_epochs) {
  SchedulerList out;
  const ScheduleContext c{&opt, iters_per_epoch, max_epochs, {}};
  for (const Json& e : list) out.add(param_schedulers().get(e.at("type").get<std::string>())(c, kwargs_of(e)));
  return out;
}

// The lrs of every iteration (every group), stepping as ParamSchedulerHook does.
std::vector<std::vector<double>> drive(optim::Optimizer& opt, SchedulerList& s, int64_t iters, int64_t epochs) {
  std::vector<std::vector<double>> lrs;
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t i = 0; i < iters; ++i) {
      lrs.emplace_back();
      for (const auto& g : opt.param_groups()) lrs.back().push_back(g.lr);
      s.step_iter();
    }
    s.step_epoch();
  }
  return lrs;
}

Json warmup_without_end_list() { return Json::array({Json{{"type", "LinearLR"}, {"by_epoch", false}}}); }

Json fixture() {
  std::ifstream f(TANDEM_SOURCE_DIR "/tests/fixtures/scheduler_lrs.json");
  EXPECT_TRUE(f.good()) << "run tests/fixtures/make_scheduler_fixtures.py";
  return Json::parse(f);
}

TEST(ParamScheduler, EveryFixtureListGivesPyTorchsLrsPerIteration) {
  const Json cases = fixture().at("cases");
  ASSERT_EQ(cases.size(), 7u);
  for (const Json& c : cases) {
    const auto lrs0 = c.at("lrs").get<std::vector<double>>();
    const int64_t iters = c.at("iters_per_epoch"), epochs = c.at("max_epochs");
    auto opt = sgd(lrs0);
    SchedulerList s = build(*opt, c.at("param_scheduler"), iters, epochs);
    const auto got = drive(*opt, s, iters, epochs);
    const auto want = c.at("per_iteration_lrs").get<std::vector<std::vector<double>>>();
    ASSERT_EQ(got.size(), want.size()) << c.at("name");
    for (size_t i = 0; i < want.size(); ++i)
      for (size_t g = 0; g < want[i].size(); ++g)  // float64 drift only (the same formulas, in the same order)
        ASSERT_NEAR(got[i][g], want[i][g], 1e-12 * std::fabs(want[i][g]))
            << c.at("name") << ", iteration " << i << ", group " << g;
  }
}

// MMEngine's ranges, which plain PyTorch schedulers lack, worked out by hand (lr 1, one group):
// ConstantLR(factor 0.5, begin 2, end 6) is idle at steps 0 and 1, applies x0.5 at step 2 (its
// last_step 0), keeps it, restores x2 at its last_step end - begin - 1 = 3 (step 5), then is idle.
// LinearLR(start 0.5, begin 1, end 5): total_iters 3; step 1: x0.5, then x(1 + 0.5 / (1.5 + k x 0.5))
// for last_step k + 1: 0.5 x 4/3, x 5/4, x 6/5 = 1 at step 4, idle after.
TEST(ParamScheduler, BeginAndEndBoundTheActiveStepsByHand) {
  auto opt = sgd({1.0});
  SchedulerList constant = build(*opt, Json::parse(R"([{"type": "ConstantLR", "by_epoch": false, "factor": 0.5,
                                                        "begin": 2, "end": 6}])"), 10, 1);
  const auto c = drive(*opt, constant, 8, 1);
  const std::vector<double> want_c = {1, 1, 0.5, 0.5, 0.5, 1, 1, 1};
  for (size_t i = 0; i < want_c.size(); ++i) EXPECT_EQ(c[i][0], want_c[i]) << i;
  auto opt2 = sgd({1.0});
  SchedulerList linear = build(*opt2, Json::parse(R"([{"type": "LinearLR", "by_epoch": false, "start_factor": 0.5,
                                                      "begin": 1, "end": 5}])"), 10, 1);
  const auto l = drive(*opt2, linear, 7, 1);
  const std::vector<double> want_l = {1, 0.5, 0.5 * 4 / 3, 0.5 * 4 / 3 * 5 / 4, 1, 1, 1};
  for (size_t i = 0; i < want_l.size(); ++i) EXPECT_NEAR(l[i][0], want_l[i], 1e-15) << i;
}

TEST(ParamScheduler, ResumedListContinuesBitForBit) {
  const Json list = Json::parse(R"([
      {"type": "LinearLR", "start_factor": 0.001, "by_epoch": false, "begin": 0, "end": 7},
      {"type": "CosineAnnealingLR", "by_epoch": true, "T_max": 3, "eta_min": 0.001, "convert_to_iter_based": true},
      {"type": "MultiStepLR", "by_epoch": true, "milestones": [2, 3], "gamma": 0.5}])");
  auto a = sgd({0.1, 0.02});
  SchedulerList sa = build(*a, list, 4, 4);
  const auto straight = drive(*a, sa, 4, 4);
  auto b = sgd({0.1, 0.02});
  SchedulerList sb = build(*b, list, 4, 4);
  drive(*b, sb, 4, 2);  // two epochs, then "save"
  const auto opt_state = b->state_dict();
  const auto sched_state = sb.state_dict();
  auto c = sgd({0.1, 0.02});
  SchedulerList sc = build(*c, list, 4, 4);  // a new run: its constructor steps, then the checkpoint
  c->load_state_dict(opt_state);
  sc.load_state_dict(sched_state);
  const auto resumed = drive(*c, sc, 4, 2);
  ASSERT_EQ(resumed.size(), 8u);
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], straight[8 + i]) << i;
  EXPECT_NE(straight[8], straight[15]);  // the lr moves over the compared part
  auto e = sgd({0.1, 0.02});
  SchedulerList longer = build(*e, list, 4, 6);  // max_epochs raised: only default ends move
  EXPECT_NO_THROW(longer.load_state_dict(sched_state));
  SchedulerList warmup_without_end = build(*e, warmup_without_end_list(), 4, 4);  // its values depend on end
  EXPECT_HAS(error_of([&] { warmup_without_end.load_state_dict(build(*e, warmup_without_end_list(), 4, 6).state_dict()); }),
             "LinearLR: the saved schedule has end = 24 but this one has 16");
  auto d = sgd({0.1, 0.02});
  Json other = list;
  other[2]["milestones"] = Json::array({2, 4});
  SchedulerList sd = build(*d, other, 4, 4);
  EXPECT_HAS(error_of([&] { sd.load_state_dict(sched_state); }), "MultiStepLR: the saved schedule has milestone.1 = 3");
  SchedulerList two = build(*d, Json::array({list[0], list[1]}), 4, 4);
  EXPECT_HAS(error_of([&] { two.load_state_dict(sched_state); }), "state for scheduler '2' but this run has 2");
}

TEST(ParamScheduler, BadKeywordArgumentsAreOneLineErrorsNamingTheKey) {
  auto opt = sgd({0.1});
  const auto err = [&](const char* entry) {
    return error_of([&] { build(*opt, Json::array({Json::parse(entry)}), 10, 2); });
  };
  std::string e = err(R"({"type": "MultiStepLR", "milestone": [1]})");
  EXPECT_HAS(e, "param_scheduler.MultiStepLR: unknown argument 'milestone' (did you mean 'milestones'?); "
                "expected one of: by_epoch, begin, end, convert_to_iter_based, milestones, gamma");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_HAS(err(R"({"type": "MultiStepLR"})"), "config key 'param_scheduler.MultiStepLR.milestones' is required");
  EXPECT_HAS(err(R"({"type": "MultiStepLR", "milestones": [1, "x"]})"), "config key 'param_scheduler.MultiStepLR.milestones' must be a list of integers >= 0, got [1,\"x\"]");
  EXPECT_HAS(err(R"({"type": "LinearLR", "start_factor": 2})"), "config key 'param_scheduler.LinearLR.start_factor' must be in (0, 1], got 2");
  EXPECT_HAS(err(R"({"type": "ConstantLR", "by_epoch": false, "convert_to_iter_based": true})"),
             "config key 'param_scheduler.ConstantLR.convert_to_iter_based' needs by_epoch true");
  EXPECT_HAS(err(R"({"type": "StepLR", "begin": 3, "end": 3})"), "config key 'param_scheduler.StepLR.end' must be > begin (3)");
  EXPECT_HAS(err(R"({"type": "ExponentialLR"})"), "config key 'param_scheduler.ExponentialLR.gamma' is required");
  EXPECT_HAS(err(R"({"type": "CosineAnnealingLR", "eta_min": 0, "eta_min_ratio": 0.1})"), "not both");
  EXPECT_HAS(err(R"({"type": "LinearLR", "end": "5"})"), "config key 'param_scheduler.LinearLR.end' must be an integer (or null), got \"5\"");
  EXPECT_HAS(err(R"({"type": "StepLR", "gamma": 0})"), "config key 'param_scheduler.StepLR.gamma' must be > 0, got 0");
}

}  // namespace
}  // namespace tandem::train
