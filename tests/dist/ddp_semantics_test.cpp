// DistributedDataParallel where models are less regular than the MNIST net, against real PyTorch
// DDP: tests/fixtures/ddp_semantics.safetensors (tests/fixtures/make_ddp_semantics_fixtures.py,
// PyTorch 1.13, gloo, 2 processes) holds the initial weights, every rank's inputs and PyTorch's
// parameters after K steps for five scenarios: a branch unused on some ranks and some steps with
// SGD momentum + weight decay and with Adam, a module used twice per forward and two DDP forwards
// before one backward, static_graph, and gradient accumulation through no_sync. Tolerances come
// from the fixture (10x PyTorch's own drift under float64 and one-ulp weight changes).
// Also: the reducer's own rules (hooks without a prepared reduction, hook removal, when buckets
// are rebuilt, no graph walk under static_graph, the errors). Each test runs as 2 real processes
// over Gloo (common/ranks.h).
#include <gtest/gtest.h>

#include <cmath>

#include "common/ranks.h"
#include "core/autograd.h"
#include "core/safetensors.h"
#include "dist/parallel/ddp.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

const std::string kFixture = TANDEM_SOURCE_DIR "/tests/fixtures/ddp_semantics.safetensors";
constexpr int kSteps = 6;

// make_ddp_semantics_fixtures.py's Net, registered in the same order.
class Net : public nn::Module {
 public:
  explicit Net(bool with_never = true) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 8));
    mid = register_module("mid", std::make_shared<nn::Linear>(8, 8));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3));
    branch = register_module("branch", std::make_shared<nn::Linear>(8, 3));
    if (with_never) never = register_module("never", std::make_shared<nn::Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu((*fc1)(x));
    h = F::relu((*mid)(h));
    h = F::relu((*mid)(h));  // shared weights: mid twice per forward
    Tensor out = (*fc2)(h);
    if (use_branch) out = F::add(out, (*branch)(h));
    return out;
  }
  bool use_branch = true;
  std::shared_ptr<nn::Linear> fc1, mid, fc2, branch, never;
};

Tensor mse(const Tensor& out, const Tensor& y) {
  Tensor d = F::sub(out, y);
  return F::scale(F::sum(F::mul(d, d)), 1.0 / static_cast<double>(d.numel()));
}

struct ScenarioRun {
  TensorMap fixture;
  std::shared_ptr<Net> model;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<int64_t> grad_defined;  // after the last backward, before zero_grad
};

const Tensor& at(const TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end()) throw std::runtime_error("fixture has no tensor " + name);
  return it->second;
}

// One scenario on this rank, as the fixture script runs it.
ScenarioRun run_scenario(const test::RankContext& ctx, const std::string& scenario, dist::ReducerOptions reducer) {
  ScenarioRun r;
  r.fixture = load_safetensors(kFixture);
  const bool with_never = scenario != "twice";
  r.model = std::make_shared<Net>(with_never);
  std::map<std::string, Tensor> init;
  for (auto& [name, t] : r.fixture)
    if (name.rfind("init.", 0) == 0 && (with_never || name.rfind("init.never.", 0) != 0)) init[name.substr(5)] = t;
  r.model->load_state_dict(init);
  dist::DDPOptions options;
  options.reducer = reducer;
  r.ddp = std::make_unique<dist::DistributedDataParallel>(r.model, ctx.group, options);
  if (scenario == "unused_adam")
    r.opt = std::make_unique<optim::Adam>(r.ddp->parameters(), optim::AdamOptions{.lr = 0.01, .weight_decay = 0.01});
  else
    r.opt = std::make_unique<optim::SGD>(
        r.ddp->parameters(),
        optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = scenario == "twice" ? 0.0 : 0.01});
  const std::string rank = ".r" + std::to_string(ctx.rank);
  for (int s = 0; s < kSteps; ++s) {
    const std::string step = rank + ".s" + std::to_string(s);
    if (scenario == "unused_sgd" || scenario == "unused_adam" || scenario == "static") {
      r.model->use_branch = scenario == "static" ? ctx.rank == 0 : (s + ctx.rank) % 3 == 0;
      mse((*r.ddp)(at(r.fixture, "x." + scenario + step)), at(r.fixture, "y." + scenario + step)).backward();
    } else if (scenario == "twice") {
      Tensor out1 = (*r.ddp)(at(r.fixture, "x.twice" + step));
      Tensor out2 = (*r.ddp)(at(r.fixture, "x2.twice" + step));
      F::add(mse(out1, at(r.fixture, "y.twice" + step)), mse(out2, at(r.fixture, "y2.twice" + step))).backward();
    } else if (scenario == "accum") {
      for (int m = 0; m < 3; ++m) {
        r.model->use_branch = (m == 0 && ctx.rank == 0) || (m == 2 && ctx.rank == 1);
        const std::string micro = step + ".m" + std::to_string(m);
        auto loss = [&] {
          return F::scale(mse((*r.ddp)(at(r.fixture, "x.accum" + micro)), at(r.fixture, "y.accum" + micro)), 1.0 / 3);
        };
        if (m < 2) {
          auto guard = r.ddp->no_sync();
          loss().backward();
        } else {
          loss().backward();
        }
      }
    }
    r.grad_defined.clear();
    for (auto& p : r.model->parameters()) r.grad_defined.push_back(p.grad().defined() ? 1 : 0);
    r.opt->step();
    r.opt->zero_grad();
  }
  return r;
}

// Parameters within the fixture's tolerance of PyTorch's, and .grad defined where PyTorch's was.
void expect_matches_pytorch(const ScenarioRun& r, const std::string& scenario) {
  const double tol = at(r.fixture, "tol." + scenario).item<double>();
  for (auto& [name, t] : r.model->state_dict()) {
    const Tensor& ref = at(r.fixture, "final." + scenario + "." + name);
    const auto a = t.to_vector<float>(), b = ref.to_vector<float>();
    double diff = 0, norm = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      diff += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
      norm += double(b[k]) * b[k];
    }
    EXPECT_LE(std::sqrt(diff), tol * std::sqrt(norm)) << scenario << ": " << name;
  }
  EXPECT_EQ(r.grad_defined, at(r.fixture, "grad_defined." + scenario).to_vector<int64_t>()) << scenario;
  if (r.model->never) {  // no rank ever used it: no optimizer touched it, weight decay included
    EXPECT_EQ(r.model->never->weight.to_vector<float>(), at(r.fixture, "init.never.weight").to_vector<float>());
    EXPECT_FALSE(r.model->never->weight.grad().defined());
  }
}

dist::ReducerOptions find_unused() {
  dist::ReducerOptions o;
  o.find_unused_parameters = true;
  return o;
}

}  // namespace

TEST(DdpSemantics, BranchUnusedOnSomeRanksWithSgdMomentumAndWeightDecayMatchesPytorch) {
  if (auto ctx = child_rank()) {
    expect_matches_pytorch(run_scenario(*ctx, "unused_sgd", find_unused()), "unused_sgd");
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, BranchUnusedOnSomeRanksWithAdamMatchesPytorch) {
  if (auto ctx = child_rank()) {
    expect_matches_pytorch(run_scenario(*ctx, "unused_adam", find_unused()), "unused_adam");
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, UnusedParametersWithSmallBucketsAndGradientAsBucketViewMatchPytorch) {
  if (auto ctx = child_rank()) {
    dist::ReducerOptions o = find_unused();
    o.bucket_cap_mb = o.first_bucket_cap_mb = 0.0001;  // a bucket per tensor
    o.gradient_as_bucket_view = true;
    expect_matches_pytorch(run_scenario(*ctx, "unused_sgd", o), "unused_sgd");
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, ModuleUsedTwicePerForwardAndTwoForwardsBeforeOneBackwardMatchPytorch) {
  if (auto ctx = child_rank()) {
    expect_matches_pytorch(run_scenario(*ctx, "twice", {}), "twice");
    return;
  }
  run_ranks(2);
}

// PyTorch raises here (its unused-parameter search sees only the second forward's outputs);
// Tandem searches from both, so the result is the one without find_unused_parameters.
TEST(DdpSemantics, TwoForwardsBeforeOneBackwardWorkWithFindUnusedParameters) {
  if (auto ctx = child_rank()) {
    ScenarioRun r = run_scenario(*ctx, "twice", find_unused());
    expect_matches_pytorch(r, "twice");
    EXPECT_TRUE(r.ddp->reducer().unused_parameters().empty());
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, StaticGraphMatchesPytorchAndWalksNoGraph) {
  if (auto ctx = child_rank()) {
    dist::ReducerOptions o;
    o.static_graph = true;
    o.find_unused_parameters = true;  // ignored for the walk under static_graph, as in PyTorch
    ScenarioRun r = run_scenario(*ctx, "static", o);
    expect_matches_pytorch(r, "static");
    EXPECT_EQ(r.ddp->reducer().stats().graph_walks, 0);
    // Learned once: rank 1 never uses the branch, nobody uses `never` (fc1 0-1, mid 2-3, fc2 4-5).
    const std::vector<size_t> expected = ctx->rank == 0 ? std::vector<size_t>{8, 9} : std::vector<size_t>{6, 7, 8, 9};
    EXPECT_EQ(r.ddp->reducer().unused_parameters(), expected);
    EXPECT_EQ(r.ddp->reducer().stats().rebuilds, 1);  // after the second iteration, at the third forward
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, GradientAccumulationThroughNoSyncMatchesPytorch) {
  if (auto ctx = child_rank()) {
    ScenarioRun r = run_scenario(*ctx, "accum", find_unused());
    expect_matches_pytorch(r, "accum");
    EXPECT_EQ(r.ddp->reducer().stats().rebuilds, 0);  // find_unused_parameters: never rebuilt
    EXPECT_EQ(r.ddp->reducer().stats().graph_walks, kSteps);  // one per synchronised forward
    return;
  }
  run_ranks(2);
}

// A gradient accumulated under no_sync on one rank only, for a parameter that no rank reaches in
// the synchronised step, is still averaged (PyTorch 1.13 leaves the replicas different here).
TEST(DdpSemantics, GradientUsedOnlyUnderNoSyncOnOneRankIsAveraged) {
  if (auto ctx = child_rank()) {
    manual_seed(3);
    auto model = std::make_shared<Net>();
    dist::DistributedDataParallel ddp(model, ctx->group, dist::DDPOptions{find_unused(), true});
    Generator g(50 + ctx->rank);
    auto batch = [&] {
      Tensor x = Tensor::empty({4, 6});
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
      return x;
    };
    {
      auto guard = ddp.no_sync();
      model->use_branch = ctx->rank == 0;
      F::sum(ddp(batch())).backward();
    }
    Tensor local = model->branch->weight.grad().defined() ? model->branch->weight.grad().clone()
                                                          : Tensor::zeros(model->branch->weight.shape());
    model->use_branch = false;
    F::sum(ddp(batch())).backward();
    ASSERT_TRUE(model->branch->weight.grad().defined()) << "rank " << ctx->rank;
    // Expected: the mean over ranks of what each accumulated locally.
    std::vector<Tensor> all = {Tensor::empty(local.shape()), Tensor::empty(local.shape())};
    ctx->group->allgather(all, local)->wait(std::chrono::seconds(30));
    const auto got = model->branch->weight.grad().to_vector<float>();
    const auto a = all[0].to_vector<float>(), b = all[1].to_vector<float>();
    for (size_t k = 0; k < got.size(); ++k) ASSERT_NEAR(got[k], (a[k] + b[k]) / 2, 1e-6) << k;
    EXPECT_FALSE(model->never->weight.grad().defined());
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, BackwardWithoutADdpForwardSendsNothing) {
  if (auto ctx = child_rank()) {
    manual_seed(4);
    auto model = std::make_shared<Net>(false);
    dist::DistributedDataParallel ddp(model, ctx->group);
    Tensor x = Tensor::full({2, 6}, 0.5 + ctx->rank);
    F::sum((*model)(x)).backward();  // the module itself, not DDP: no reduction is prepared
    Tensor mine = model->fc1->weight.grad().clone();
    model->zero_grad();
    F::sum((*model)(x)).backward();
    // Purely local: the same gradient again, and different on the two ranks.
    EXPECT_EQ(model->fc1->weight.grad().to_vector<float>(), mine.to_vector<float>());
    std::vector<Tensor> all = {Tensor::empty(mine.shape()), Tensor::empty(mine.shape())};
    ctx->group->allgather(all, mine)->wait(std::chrono::seconds(30));
    EXPECT_NE(all[0].to_vector<float>(), all[1].to_vector<float>());
    EXPECT_EQ(ddp.reducer().stats().iteration, 0);
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, DestroyedReducerRemovesItsHooks) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Net>(false);
    const size_t before = model->fc1->weight.autograd_meta().post_accumulate_hooks.size();
    {
      dist::DistributedDataParallel ddp(model, ctx->group);
      EXPECT_EQ(model->fc1->weight.autograd_meta().post_accumulate_hooks.size(), before + 1);
    }
    EXPECT_EQ(model->fc1->weight.autograd_meta().post_accumulate_hooks.size(), before);
    F::sum((*model)(Tensor::ones({2, 6}))).backward();  // no reducer is called
    EXPECT_TRUE(model->fc1->weight.grad().defined());
    return;
  }
  run_ranks(2);
}

TEST(DdpSemantics, ParameterUsedOutsideForwardIsNamedWithTheFix) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Net>();
    dist::DistributedDataParallel ddp(model, ctx->group, dist::DDPOptions{find_unused(), true});
    Tensor out = ddp(Tensor::ones({2, 6}));
    // `never` joins the loss outside forward: DDP marked it unused, then backward reaches it.
    Tensor loss = F::add(F::sum(out), F::sum(model->never->weight));
    try {
      loss.backward();
      ADD_FAILURE() << "backward should fail";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'never.weight'"), std::string::npos) << what;
      EXPECT_NE(what.find("outside"), std::string::npos) << what;
    }
    return;
  }
  run_ranks(2);
}
