// SyncBatchNorm by its defining property: W ranks, each with its own slice of
// a batch (slices of different sizes included), give the same outputs, input
// gradients, summed weight/bias gradients and running statistics as plain
// BatchNorm2d on the whole batch in one process (the reference is computed
// inside each rank), in float64 (to 1e-10), float32 (to 1e-5) and with a bf16
// input (mixed precision: computed in f32, gradient rounded to bf16), including a
// rank with one value per channel; fewer than two values per channel over all
// ranks is an error on every rank. Also: eval mode does not communicate, convert_sync_batchnorm
// keeps MnistNet's typed pointers, and full MnistNet training steps under DDP
// with SyncBN equal single-process steps on the concatenated batch.
// Each test runs as real processes over Gloo on loopback (common/ranks.h).
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/random.h"
#include "dist/parallel/ddp.h"
#include "dist/parallel/sync_batch_norm.h"
#include "common/test_util.h"
#include "common/ranks.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

constexpr int64_t kC = 3;

// Rank r holds rows [offset(r), offset(r+1)) of a batch of [total, kC, h, w]
// images; the ranks' row counts differ.
struct Layout {
  std::vector<int64_t> rows;  // per rank
  int64_t h = 3, w = 2;
  int64_t offset(int r) const {
    int64_t o = 0;
    for (int k = 0; k < r; ++k) o += rows[k];
    return o;
  }
  int64_t total() const { return offset(static_cast<int>(rows.size())); }
};

// Rows [lo, hi) of this step's global batch: values with a non-zero mean per channel.
Tensor global_rows(const Layout& l, int step, int64_t lo, int64_t hi, DType dtype, uint64_t salt = 0) {
  Generator g(500 + 17 * step + salt);
  Tensor x = Tensor::empty({l.total(), kC, l.h, l.w}, kFloat64);
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t c = (i / (l.h * l.w)) % kC;
    p[i] = g.uniform(-1, 1) * (1.0 + c) + 0.5 * c;
  }
  return x.slice(0, lo, hi).contiguous().to(dtype);
}

void to_dtype(nn::BatchNorm2d& bn, DType dtype) {
  for (Tensor* t : {&bn.weight, &bn.bias, &bn.running_mean, &bn.running_var}) t->set_data(t->to(dtype));
}

Tensor allreduce_sum(const test::RankContext& ctx, const Tensor& t) {
  Tensor c = t.clone();
  ctx.group->allreduce(c)->wait(std::chrono::seconds(30));
  return c;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol * (1.0 + std::abs(w[i]))) << what << "[" << i << "]";
}

// dtype: of the input; f16/bf16 inputs meet f32 parameters (mixed precision), and
// their input gradients, rounded to that dtype, are compared with grad_tol.
void check_against_one_process(const test::RankContext& ctx, const Layout& l, DType dtype, double tol,
                               double grad_tol = 0) {
  ASSERT_EQ(static_cast<int>(l.rows.size()), ctx.world);
  const DType pdtype = dtype == kFloat16 || dtype == kBFloat16 ? kFloat32 : dtype;
  if (grad_tol == 0) grad_tol = tol;
  const int64_t total = l.total(), lo = l.offset(ctx.rank), hi = l.offset(ctx.rank + 1);
  nn::BatchNorm2d reference(kC);
  dist::SyncBatchNorm synced(kC, ctx.group);
  to_dtype(reference, pdtype);
  to_dtype(synced, pdtype);
  {
    Generator g(9);
    std::vector<double> w(kC), b(kC);
    for (auto& v : w) v = g.uniform(0.5, 1.5);
    for (auto& v : b) v = g.uniform(-0.5, 0.5);
    for (auto* bn : {&reference, static_cast<nn::BatchNorm2d*>(&synced)}) {
      bn->weight.copy_(Tensor::from_vector(w, {kC}));
      bn->bias.copy_(Tensor::from_vector(b, {kC}));
    }
  }
  for (int step = 0; step < 3; ++step) {
    Tensor x = global_rows(l, step, lo, hi, dtype).set_requires_grad(true);
    Tensor x_all = global_rows(l, step, 0, total, dtype).set_requires_grad(true);
    // Loss: sum(y * r) with fixed random r, so every output element gets its own gradient.
    Tensor r = global_rows(l, step, lo, hi, pdtype, 99), r_all = global_rows(l, step, 0, total, pdtype, 99);
    synced.zero_grad();
    reference.zero_grad();
    Tensor y = synced(x);
    Tensor y_all = reference(x_all);
    F::sum(F::mul(y, r)).backward();
    F::sum(F::mul(y_all, r_all)).backward();

    const std::string at = " step " + std::to_string(step);
    expect_close(y, y_all.slice(0, lo, hi), tol, "output" + at);
    ASSERT_EQ(x.grad().dtype(), dtype);
    expect_close(x.grad(), x_all.grad().slice(0, lo, hi), grad_tol, "input grad" + at);
    // Weight/bias gradients are this rank's share (DDP averages them): their sum is the reference.
    expect_close(allreduce_sum(ctx, synced.weight.grad()), reference.weight.grad(), tol, "weight grad" + at);
    expect_close(allreduce_sum(ctx, synced.bias.grad()), reference.bias.grad(), tol, "bias grad" + at);
    expect_close(synced.running_mean, reference.running_mean, tol, "running_mean" + at);
    expect_close(synced.running_var, reference.running_var, tol, "running_var" + at);
    EXPECT_EQ(synced.num_batches_tracked.item<int64_t>(), step + 1);
  }

  // Eval: running statistics, no communication (only rank 0 runs it; a
  // collective there would not match the barrier rank 1 waits in).
  synced.eval();
  reference.eval();
  if (ctx.rank == 0) {
    NoGradGuard no_grad;
    Tensor x = global_rows(l, 7, 0, total, dtype);
    expect_close(synced(x), reference(x), tol, "eval output");
  }
  ctx.group->barrier()->wait(std::chrono::seconds(30));
}

}  // namespace

TEST(SyncBatchNorm, TwoRanksEqualOneProcessFloat64) {
  if (auto ctx = child_rank()) return check_against_one_process(*ctx, Layout{{4, 2}}, kFloat64, 1e-10);
  run_ranks(2);
}

TEST(SyncBatchNorm, TwoRanksEqualOneProcessFloat32) {
  if (auto ctx = child_rank()) return check_against_one_process(*ctx, Layout{{4, 2}}, kFloat32, 1e-5);
  run_ranks(2);
}

TEST(SyncBatchNorm, ThreeRanksEqualOneProcessFloat64) {
  if (auto ctx = child_rank()) return check_against_one_process(*ctx, Layout{{4, 2, 3}}, kFloat64, 1e-10);
  run_ranks(3);
}

// Under mixed precision BatchNorm takes a bf16 activation and computes in f32.
TEST(SyncBatchNorm, TwoRanksEqualOneProcessBFloat16Input) {
  if (auto ctx = child_rank()) return check_against_one_process(*ctx, Layout{{4, 2}}, kBFloat16, 1e-5, 8e-3);
  run_ranks(2);
}

// Rank 0 has one value per channel (its own variance is undefined), rank 1 three.
TEST(SyncBatchNorm, OneValuePerChannelOnARankIsFine) {
  if (auto ctx = child_rank()) return check_against_one_process(*ctx, Layout{{1, 3}, 1, 1}, kFloat64, 1e-10);
  run_ranks(2);
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksIsAnError) {
  if (auto ctx = child_rank()) {
    dist::SyncBatchNorm bn(kC, ctx->group);
    Tensor x = Tensor::ones({ctx->rank == 0 ? 1 : 0, kC, 1, 1});
    const std::string msg = test::error_of([&] { bn(x); });
    EXPECT_HAS(msg, "more than 1 value per channel over all ranks");
    return;
  }
  run_ranks(2);
}

TEST(SyncBatchNorm, ConvertKeepsTypedPointersAndNamesTheGroup) {
  if (auto ctx = child_rank()) {
    auto model = std::make_shared<nn::models::MnistNet>();
    const auto names_before = model->state_dict();
    EXPECT_EQ(dist::convert_sync_batchnorm(*model, ctx->group), 2);
    ASSERT_NE(model->n1->stats_sync(), nullptr);
    ASSERT_NE(model->n2->stats_sync(), nullptr);
    EXPECT_EQ(model->n1->stats_sync()->name(), "SyncBatchNorm(gloo, 2 ranks)");
    const auto names_after = model->state_dict();
    ASSERT_EQ(names_after.size(), names_before.size());
    for (size_t i = 0; i < names_after.size(); ++i) {
      EXPECT_EQ(names_after[i].first, names_before[i].first);
      EXPECT_TRUE(names_after[i].second.is_same(names_before[i].second)) << names_after[i].first;
    }
    return;
  }
  run_ranks(2);
}

TEST(SyncBatchNorm, MnistNetStepsUnderDdpEqualSingleProcess) {
  if (auto ctx = child_rank()) {
    manual_seed(11);
    auto reference = std::make_shared<nn::models::MnistNet>();
    auto local = std::make_shared<nn::models::MnistNet>();
    {
      std::map<std::string, Tensor> state;
      for (auto& [n, t] : reference->state_dict()) state[n] = t.clone();
      local->load_state_dict(state);
    }
    ASSERT_EQ(dist::convert_sync_batchnorm(*local, ctx->group), 2);
    dist::DDPOptions opts;
    opts.reducer.bucket_cap_mb = 0.05;  // several buckets, interleaved with SyncBN's all-reduces
    opts.reducer.first_bucket_cap_mb = 0.05;
    dist::DistributedDataParallel ddp(local, ctx->group, opts);
    optim::Adadelta opt(ddp.parameters(), optim::AdadeltaOptions{1.0});
    optim::Adadelta opt_ref(reference->parameters(), optim::AdadeltaOptions{1.0});
    const int64_t per_rank = 4, total = per_rank * ctx->world;
    for (int step = 0; step < 3; ++step) {
      Generator g(300 + step);
      Tensor x = Tensor::empty({total, 1, 28, 28});
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 2));
      Tensor y = Tensor::empty({total}, kInt64);
      for (int64_t i = 0; i < total; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(g.below(10));
      const int64_t lo = ctx->rank * per_rank, hi = lo + per_rank;

      Tensor loss = F::nll_loss(ddp(x.slice(0, lo, hi).contiguous()), y.slice(0, lo, hi).contiguous());
      opt.zero_grad();
      loss.backward();
      opt.step();

      Tensor ref_loss = F::nll_loss((*reference)(x), y);
      opt_ref.zero_grad();
      ref_loss.backward();
      opt_ref.step();

      auto sl = local->state_dict(), sr = reference->state_dict();
      ASSERT_EQ(sl.size(), sr.size());
      for (size_t i = 0; i < sl.size(); ++i) {
        if (sl[i].second.dtype() != kFloat32) {
          EXPECT_EQ(sl[i].second.to_vector<int64_t>(), sr[i].second.to_vector<int64_t>()) << sl[i].first;
          continue;
        }
        expect_close(sl[i].second, sr[i].second, 5e-6, sl[i].first + " step " + std::to_string(step));
      }
    }
    return;
  }
  run_ranks(2);
}
