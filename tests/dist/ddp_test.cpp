// DistributedDataParallel by its defining property: N ranks x batch B make
// the same update as 1 process x batch N*B, for several bucket layouts; plus
// find_unused_parameters, no_sync, bucket rebuilding, overlap, comm hooks,
// model verification, and identical MNIST-net parameters on every rank.
// Each test runs as real processes over Gloo on loopback (common/ranks.h).
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/random.h"
#include "dist/parallel/ddp.h"
#include "common/ranks.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

// An MLP without BatchNorm, so per-rank batches change nothing but the data.
class Mlp : public nn::Module {
 public:
  explicit Mlp(bool use_b = true) : use_b_(use_b) {
    a = register_module("a", std::make_shared<nn::Linear>(12, 32));
    b = register_module("b", std::make_shared<nn::Linear>(32, 32));
    c = register_module("c", std::make_shared<nn::Linear>(32, 5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu((*a)(x));
    if (use_b_) h = F::relu((*b)(h));
    return F::log_softmax((*c)(h), -1);
  }
  bool use_b_;
  std::shared_ptr<nn::Linear> a, b, c;
};

struct Data {
  Tensor x, y;
};

// Batch `step` of the global data, rows [lo, hi).
Data global_batch(int step, int64_t lo, int64_t hi) {
  Generator g(1000 + step);
  const int64_t n = 12;  // enough rows for 3 ranks x 4
  Tensor x = Tensor::empty({n, 12});
  Tensor y = Tensor::empty({n}, kInt64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  for (int64_t i = 0; i < n; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(g.below(5));
  return {x.slice(0, lo, hi).contiguous(), y.slice(0, lo, hi).contiguous()};
}

float max_abs_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  float worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    auto va = pa[i].second.to_vector<float>(), vb = pb[i].second.to_vector<float>();
    for (size_t k = 0; k < va.size(); ++k) worst = std::max(worst, std::abs(va[k] - vb[k]));
  }
  return worst;
}

void copy_params(const nn::Module& from, nn::Module& to) {
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : from.state_dict()) state[n] = t.clone();
  to.load_state_dict(state);
}

// Trains K steps with DDP (per-rank rows) and, in the same process, a single
// model on all rows; both must end with the same parameters.
void check_equivalence(const test::RankContext& ctx, double cap_mb, bool view) {
  const int per_rank = 4, steps = 4;
  manual_seed(7);
  auto reference = std::make_shared<Mlp>();
  auto local = std::make_shared<Mlp>();
  copy_params(*reference, *local);
  dist::DDPOptions opts;
  opts.reducer.bucket_cap_mb = cap_mb;
  opts.reducer.first_bucket_cap_mb = std::min(cap_mb, 1.0);
  opts.reducer.gradient_as_bucket_view = view;
  dist::DistributedDataParallel ddp(local, ctx.group, opts);
  optim::SGD opt_ddp(ddp.parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < steps; ++s) {
    Data mine = global_batch(s, ctx.rank * per_rank, (ctx.rank + 1) * per_rank);
    Tensor loss = F::nll_loss(ddp(mine.x), mine.y);
    opt_ddp.zero_grad(/*set_to_none=*/!view);  // as bucket views, gradients are zeroed in place
    loss.backward();
    opt_ddp.step();

    Data all = global_batch(s, 0, ctx.world * per_rank);
    Tensor ref_loss = F::nll_loss((*reference)(all.x), all.y);
    opt_ref.zero_grad();
    ref_loss.backward();
    opt_ref.step();
  }
  EXPECT_LT(max_abs_diff(*local, *reference), 2e-6f) << "cap " << cap_mb << " MB, view " << view;
  EXPECT_GT(ddp.reducer().stats().buckets, 0);
}

}  // namespace

// Param: "<cap_mb> <view>"; caps: tiny (a bucket per tensor), default, one huge bucket.
#define DDP_EQUIVALENCE_TEST(NAME, WORLD, CAP, VIEW)                              \
  TEST(DdpEquivalence, NAME) {                                                    \
    if (auto ctx = child_rank()) return check_equivalence(*ctx, CAP, VIEW);       \
    run_ranks(WORLD);                                                             \
  }

DDP_EQUIVALENCE_TEST(TwoRanksTinyBuckets, 2, 0.001, false)
DDP_EQUIVALENCE_TEST(TwoRanksDefaultBuckets, 2, 25.0, false)
DDP_EQUIVALENCE_TEST(TwoRanksOneHugeBucket, 2, 1000.0, false)
DDP_EQUIVALENCE_TEST(TwoRanksTinyBucketsAsView, 2, 0.001, true)
DDP_EQUIVALENCE_TEST(TwoRanksDefaultBucketsAsView, 2, 25.0, true)
DDP_EQUIVALENCE_TEST(TwoRanksOneHugeBucketAsView, 2, 1000.0, true)
DDP_EQUIVALENCE_TEST(ThreeRanksTinyBuckets, 3, 0.001, false)
DDP_EQUIVALENCE_TEST(ThreeRanksDefaultBuckets, 3, 25.0, false)
DDP_EQUIVALENCE_TEST(ThreeRanksOneHugeBucket, 3, 1000.0, false)
DDP_EQUIVALENCE_TEST(ThreeRanksTinyBucketsAsView, 3, 0.001, true)
DDP_EQUIVALENCE_TEST(ThreeRanksDefaultBucketsAsView, 3, 25.0, true)
DDP_EQUIVALENCE_TEST(ThreeRanksOneHugeBucketAsView, 3, 1000.0, true)

TEST(Ddp, UnusedParameterWithoutTheFlagIsNamedAtTheEndOfBackward) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Mlp>(/*use_b=*/false);
    dist::DistributedDataParallel ddp(model, ctx->group);
    Data d = global_batch(0, 0, 4);
    Tensor loss = F::nll_loss(ddp(d.x), d.y);
    try {
      loss.backward();
      ADD_FAILURE() << "backward should have reported the unused parameters";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("b.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
    }
    return;
  }
  run_ranks(2);
}

TEST(Ddp, FindUnusedParametersWithABranchUsedOnSomeIterations) {
  if (auto ctx = child_rank()) {
    manual_seed(3);
    auto reference = std::make_shared<Mlp>();
    auto local = std::make_shared<Mlp>();
    copy_params(*reference, *local);
    dist::DDPOptions opts;
    opts.reducer.find_unused_parameters = true;
    opts.reducer.bucket_cap_mb = 0.001;
    opts.reducer.first_bucket_cap_mb = 0.001;
    dist::DistributedDataParallel ddp(local, ctx->group, opts);
    optim::SGD opt_ddp(ddp.parameters(), optim::SGDOptions{0.1});
    optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.1});
    for (int s = 0; s < 4; ++s) {
      const bool use_b = s % 2 == 1;  // b is skipped on even steps, on every rank
      local->use_b_ = reference->use_b_ = use_b;
      Data mine = global_batch(s, ctx->rank * 4, ctx->rank * 4 + 4);
      Tensor loss = F::nll_loss(ddp(mine.x), mine.y);
      opt_ddp.zero_grad();
      loss.backward();
      opt_ddp.step();
      Data all = global_batch(s, 0, ctx->world * 4);
      Tensor ref_loss = F::nll_loss((*reference)(all.x), all.y);
      opt_ref.zero_grad();
      ref_loss.backward();
      opt_ref.step();
    }
    EXPECT_LT(max_abs_diff(*local, *reference), 2e-6f);
    return;
  }
  run_ranks(2);
}

TEST(Ddp, NoSyncAccumulationEqualsOneBigBatch) {
  if (auto ctx = child_rank()) {
    manual_seed(5);
    auto reference = std::make_shared<Mlp>();
    auto local = std::make_shared<Mlp>();
    copy_params(*reference, *local);
    dist::DistributedDataParallel ddp(local, ctx->group);
    // Two micro-batches per rank: the first inside no_sync, the second synced.
    {
      auto guard = ddp.no_sync();
      Data m0 = global_batch(0, ctx->rank * 4, ctx->rank * 4 + 4);
      F::nll_loss(ddp(m0.x), m0.y).backward();
    }
    Data m1 = global_batch(1, ctx->rank * 4, ctx->rank * 4 + 4);
    F::nll_loss(ddp(m1.x), m1.y).backward();
    // Reference: mean loss over all ranks' first micro-batches plus the same for the second.
    Data a0 = global_batch(0, 0, ctx->world * 4), a1 = global_batch(1, 0, ctx->world * 4);
    F::add(F::nll_loss((*reference)(a0.x), a0.y), F::nll_loss((*reference)(a1.x), a1.y)).backward();
    auto pl = local->named_parameters(), pr = reference->named_parameters();
    for (size_t i = 0; i < pl.size(); ++i) {
      auto gl = pl[i].second.grad().to_vector<float>(), gr = pr[i].second.grad().to_vector<float>();
      for (size_t k = 0; k < gl.size(); ++k) ASSERT_NEAR(gl[k], gr[k], 2e-6) << pl[i].first << "[" << k << "]";
    }
    return;
  }
  run_ranks(2);
}

// Registered c, b, a but executed a, b, c: gradients arrive c, b, a... in
// reverse execution order, which is not reverse registration order.
class Shuffled : public nn::Module {
 public:
  Shuffled() {
    c = register_module("c", std::make_shared<nn::Linear>(32, 5));
    a = register_module("a", std::make_shared<nn::Linear>(12, 32));
    b = register_module("b", std::make_shared<nn::Linear>(32, 32));
  }
  Tensor forward(const Tensor& x) override {
    return F::log_softmax((*c)(F::relu((*b)(F::relu((*a)(x))))), -1);
  }
  std::shared_ptr<nn::Linear> a, b, c;
};

TEST(Ddp, BucketsAreRebuiltInArrivalOrderAtTheSecondForward) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Shuffled>();
    dist::DDPOptions opts;
    opts.reducer.bucket_cap_mb = 0.001;  // one tensor per bucket
    opts.reducer.first_bucket_cap_mb = 0.001;
    dist::DistributedDataParallel ddp(model, ctx->group, opts);
    // Registration order: c.weight 0, c.bias 1, a.weight 2, a.bias 3, b.weight 4, b.bias 5.
    auto flat = [](const std::vector<std::vector<size_t>>& buckets) {
      std::vector<size_t> out;
      for (auto& b : buckets) out.insert(out.end(), b.begin(), b.end());
      return out;
    };
    EXPECT_EQ(flat(ddp.reducer().bucket_assignment()), (std::vector<size_t>{5, 4, 3, 2, 1, 0}));
    Data d = global_batch(0, ctx->rank * 4, ctx->rank * 4 + 4);
    F::nll_loss(ddp(d.x), d.y).backward();
    // Not inside backward: at the start of the next forward, as PyTorch does.
    EXPECT_EQ(flat(ddp.reducer().bucket_assignment()), (std::vector<size_t>{5, 4, 3, 2, 1, 0}));
    EXPECT_EQ(ddp.reducer().stats().rebuilds, 0);
    F::nll_loss(ddp(d.x), d.y).backward();
    // Backward produces c first, then b, then a (bias before weight within each linear).
    auto rebuilt = flat(ddp.reducer().bucket_assignment());
    EXPECT_EQ(rebuilt, (std::vector<size_t>{1, 0, 5, 4, 3, 2}));
    EXPECT_EQ(ddp.reducer().stats().rebuilds, 1);
    return;
  }
  run_ranks(2);
}

TEST(Ddp, FirstBucketIsLaunchedBeforeBackwardReachesTheFirstLayer) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<Mlp>();
    dist::DDPOptions opts;
    opts.reducer.bucket_cap_mb = 0.001;
    opts.reducer.first_bucket_cap_mb = 0.001;
    dist::DistributedDataParallel ddp(model, ctx->group, opts);
    std::vector<std::string> events;
    ddp.reducer().set_launch_observer([&](size_t b) { events.push_back("launch " + std::to_string(b)); });
    model->a->weight.register_post_accumulate_grad_hook([&](const Tensor&) { events.push_back("a.weight ready"); });
    for (int it = 0; it < 2; ++it) {
      events.clear();
      Data d = global_batch(it, ctx->rank * 4, ctx->rank * 4 + 4);
      F::nll_loss(ddp(d.x), d.y).backward();
      auto pos = [&](const std::string& e) { return std::find(events.begin(), events.end(), e) - events.begin(); };
      ASSERT_LT(pos("launch 0"), static_cast<long>(events.size())) << "bucket 0 never launched";
      EXPECT_LT(pos("launch 0"), pos("a.weight ready")) << "iteration " << it;
    }
    return;
  }
  run_ranks(2);
}

TEST(Ddp, CompressionHooksStayWithinTheirPrecision) {
  if (auto ctx = child_rank()) {
    for (const char* name : {"fp16", "bf16"}) {
      manual_seed(11);
      auto exact = std::make_shared<Mlp>();
      auto compressed = std::make_shared<Mlp>();
      copy_params(*exact, *compressed);
      dist::DistributedDataParallel ddp_exact(exact, ctx->group);
      dist::DDPOptions opts;
      opts.reducer.comm_hook = dist::comm_hook_by_name(name);
      dist::DistributedDataParallel ddp_c(compressed, ctx->group, opts);
      Data d = global_batch(0, ctx->rank * 4, ctx->rank * 4 + 4);
      F::nll_loss(ddp_exact(d.x), d.y).backward();
      F::nll_loss(ddp_c(d.x), d.y).backward();
      const double rel = std::string(name) == "fp16" ? 2e-3 : 1.6e-2;  // 2^-10 and 2^-7 mantissas, with margin
      // Each rank's half is rounded before the sum, so the error scales with
      // the tensor's magnitude, not with the (possibly cancelling) sum.
      auto pe = exact->named_parameters(), pc = compressed->named_parameters();
      for (size_t i = 0; i < pe.size(); ++i) {
        auto ge = pe[i].second.grad().to_vector<float>(), gc = pc[i].second.grad().to_vector<float>();
        float scale = 0;
        for (float v : ge) scale = std::max(scale, std::abs(v));
        for (size_t k = 0; k < ge.size(); ++k)
          ASSERT_NEAR(gc[k], ge[k], rel * scale) << name << " " << pe[i].first << "[" << k << "]";
      }
    }
    return;
  }
  run_ranks(2);
}

TEST(Ddp, DifferentModelsOnTwoRanksAreNamed) {
  if (auto ctx = child_rank()) {
    std::shared_ptr<nn::Module> model;
    if (ctx->rank == 0)
      model = std::make_shared<nn::Linear>(4, 3);
    else
      model = std::make_shared<nn::Linear>(4, 2);
    try {
      dist::DistributedDataParallel ddp(model, ctx->group);
      ADD_FAILURE() << "construction should fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'weight'"), std::string::npos) << e.what();
    }
    return;
  }
  run_ranks(2);
}

TEST(Ddp, MnistNetParametersIdenticalOnEveryRankAfterEveryStep) {
  if (auto ctx = child_rank()) {
    manual_seed(100 + ctx->rank);  // different initial weights: DDP must broadcast rank 0's
    auto model = std::make_shared<nn::models::MnistNet>();
    dist::DistributedDataParallel ddp(model, ctx->group);
    optim::Adadelta opt(ddp.parameters(), optim::AdadeltaOptions{1.0});
    Generator g(ctx->rank);
    for (int step = 0; step < 3; ++step) {
      Tensor x = Tensor::empty({8, 1, 28, 28});
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
      Tensor y = Tensor::empty({8}, kInt64);
      for (int64_t i = 0; i < 8; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(g.below(10));
      Tensor loss = F::nll_loss(ddp(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      for (auto& [name, p] : model->state_dict()) {
        if (p.dtype() != kFloat32) continue;
        std::vector<Tensor> all;
        for (int r = 0; r < ctx->world; ++r) all.push_back(Tensor::empty(p.shape()));
        Tensor mine = p.clone();
        ctx->group->allgather(all, mine)->wait(std::chrono::seconds(30));
        // Buffers (BN running stats) differ until the next forward broadcasts them.
        if (name.find("running") != std::string::npos) continue;
        for (int r = 1; r < ctx->world; ++r)
          ASSERT_EQ(all[r].to_vector<float>(), all[0].to_vector<float>()) << name << " step " << step;
      }
    }
    return;
  }
  run_ranks(2);
}
