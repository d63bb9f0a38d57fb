// Join (dist/parallel/join.h): ranks with different numbers of batches finish without hanging, and the
// result is what the uneven data means: at each step the sum of the still-training ranks'
// gradients over the whole world size, every replica equal at the end. Real processes over Gloo
// (common/ranks.h); every wait is bounded by the group's timeout and run_ranks' limit.
#include <gtest/gtest.h>

#include <cmath>

#include "common/ranks.h"
#include "core/autograd.h"
#include "core/random.h"
#include "dist/group/host_values.h"
#include "dist/parallel/join.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

class Mlp : public nn::Module {
 public:
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(5, 16));
    b = register_module("b", std::make_shared<nn::Linear>(16, 3));
    c = register_module("c", std::make_shared<nn::Linear>(16, 3));  // used on even steps only
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu((*a)(x));
    Tensor out = (*b)(h);
    return use_c ? F::add(out, (*c)(h)) : out;
  }
  bool use_c = true;
  std::shared_ptr<nn::Linear> a, b, c;
};

Tensor batch(int rank, int step) {
  Generator g(100 * rank + step);
  Tensor x = Tensor::empty({4, 5});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  return x;
}

// Rank r has batches_of(r) batches: rank 0 five, rank 1 two, rank 2 three.
int batches_of(int rank) { return rank == 0 ? 5 : rank == 1 ? 2 : 3; }

void run_uneven(const test::RankContext& ctx, bool find_unused, bool as_view) {
  manual_seed(9);
  auto model = std::make_shared<Mlp>(), reference = std::make_shared<Mlp>();
  std::map<std::string, Tensor> init;
  for (auto& [n, t] : model->state_dict()) init[n] = t.clone();
  reference->load_state_dict(init);
  dist::DDPOptions opts;
  opts.reducer.find_unused_parameters = find_unused;
  opts.reducer.gradient_as_bucket_view = as_view;
  opts.reducer.bucket_cap_mb = opts.reducer.first_bucket_cap_mb = 1e-6;  // a bucket per tensor
  dist::DistributedDataParallel ddp(model, ctx.group, opts);
  optim::SGD opt(ddp.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  int64_t shadowed = 0;
  {
    dist::Join join(ddp);
    for (int s = 0; s < batches_of(ctx.rank); ++s) {
      model->use_c = !find_unused || s % 2 == 0;
      opt.zero_grad(/*set_to_none=*/!as_view);
      F::sum(ddp(batch(ctx.rank, s))).backward();
      opt.step();
    }
    // The joined rank steps too, with the average its .grad receives: optimizer state stays equal.
    shadowed = join.join([&](bool synced) {
      if (!synced) return;
      opt.step();
      opt.zero_grad(/*set_to_none=*/!as_view);
    });
  }
  for (auto& [name, t] : opt.state_dict()) {  // momentum buffers: equal on every rank, bit for bit
    const auto all = dist::allgather_values(*ctx.group, t.to_vector<double>(), name);
    for (int r = 1; r < ctx.world; ++r) ASSERT_EQ(all[r], all[0]) << name << " on rank " << r;
  }
  int most = 0;
  for (int r = 0; r < ctx.world; ++r) most = std::max(most, batches_of(r));
  EXPECT_EQ(shadowed, most - batches_of(ctx.rank));
  // The reference: one process, step s's loss the sum over the ranks that still had a batch,
  // divided by the world size.
  optim::SGD ref_opt(reference->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < most; ++s) {
    reference->use_c = !find_unused || s % 2 == 0;
    ref_opt.zero_grad(/*set_to_none=*/!as_view);  // zeroed gradients still move with momentum
    Tensor loss;
    for (int r = 0; r < ctx.world; ++r) {
      if (s >= batches_of(r)) continue;
      Tensor l = F::sum((*reference)(batch(r, s)));
      loss = loss.defined() ? F::add(loss, l) : l;
    }
    F::scale(loss, 1.0 / ctx.world).backward();
    ref_opt.step();
  }
  auto got = model->named_parameters(), want = reference->named_parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    const auto g = got[i].second.to_vector<float>(), w = want[i].second.to_vector<float>();
    for (size_t k = 0; k < g.size(); ++k) ASSERT_NEAR(g[k], w[k], 2e-5) << got[i].first << "[" << k << "]";
  }
}

}  // namespace

TEST(Join, UnevenInputsFinishWithTheModelTheDataDefines) {
  if (auto ctx = child_rank()) {
    run_uneven(*ctx, /*find_unused=*/false, /*as_view=*/false);
    return;
  }
  run_ranks(3);
}

TEST(Join, UnevenInputsWithUnusedParametersAndGradientAsBucketView) {
  if (auto ctx = child_rank()) {
    run_uneven(*ctx, /*find_unused=*/true, /*as_view=*/true);
    return;
  }
  run_ranks(3);
}

TEST(Join, EvenInputsShadowNothing) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Mlp>();
    dist::DistributedDataParallel ddp(model, ctx->group);
    dist::Join join(ddp);
    for (int s = 0; s < 2; ++s) F::sum(ddp(batch(ctx->rank, s))).backward();
    EXPECT_EQ(join.join(), 0);
    EXPECT_THROW(join.join(), Error);  // once per rank
    return;
  }
  run_ranks(2);
}

TEST(Join, ThrowOnEarlyTerminationStopsEveryRankWithAMessage) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Mlp>();
    dist::DistributedDataParallel ddp(model, ctx->group);
    dist::Join join(ddp, /*throw_on_early_termination=*/true);
    try {
      for (int s = 0; s < (ctx->rank == 0 ? 4 : 1); ++s) F::sum(ddp(batch(ctx->rank, s))).backward();
      join.join();
      ADD_FAILURE() << "rank " << ctx->rank << " should have thrown";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(ctx->rank == 0 ? "asked every rank to stop" : "ran out of inputs"), std::string::npos)
          << what;
    }
    return;
  }
  run_ranks(2);
}
