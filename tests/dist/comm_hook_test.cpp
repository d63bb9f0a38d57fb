// The comm-hook API (GradBucket, a hook with its own state) and PowerSGD, as real processes over
// Gloo (common/ranks.h): what a hook sees of each bucket, that its state persists, PowerSGD's plain
// all-reduce before its start iteration, its exactness where the averaged gradient has rank 1, its
// error feedback, and the bytes it sends.
#include <gtest/gtest.h>

#include <cmath>

#include "common/ranks.h"
#include "core/autograd.h"
#include "core/random.h"
#include "dist/parallel/ddp.h"
#include "dist/group/host_values.h"
#include "dist/parallel/powersgd.h"
#include "nn/nn.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

class TwoLayers : public nn::Module {
 public:
  TwoLayers() {
    a = register_module("a", std::make_shared<nn::Linear>(16, 32));
    b = register_module("b", std::make_shared<nn::Linear>(32, 8));
  }
  Tensor forward(const Tensor& x) override { return (*b)(F::relu((*a)(x))); }
  std::shared_ptr<nn::Linear> a, b;
};

Tensor random_batch(uint64_t seed, int64_t rows = 6) {
  Generator g(seed);
  Tensor x = Tensor::empty({rows, 16});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  return x;
}

// A Work that is already done: the hook below reduces synchronously.
class DoneWork final : public dist::Work {
 public:
  bool is_completed() override { return true; }
  void wait(dist::Millis) override {}
  std::string description() const override { return "done"; }
};

struct CountingState {
  int calls = 0;
  std::vector<std::string> seen;
};

}  // namespace

TEST(CommHook, HookSeesEachBucketWithItsParametersAndKeepsItsState) {
  if (auto ctx = child_rank()) {
    manual_seed(1);
    auto model = std::make_shared<TwoLayers>();
    auto state = std::make_shared<CountingState>();
    dist::DDPOptions opts;
    opts.reducer.bucket_cap_mb = opts.reducer.first_bucket_cap_mb = 1e-6;  // a bucket per tensor
    opts.reducer.comm_hook = dist::make_comm_hook<CountingState>(
        state, [](CountingState& s, dist::ProcessGroup& group, dist::GradBucket& bucket) -> std::shared_ptr<dist::Work> {
          ++s.calls;
          EXPECT_EQ(bucket.parameters.size(), 1u);
          EXPECT_EQ(bucket.gradients[0].shape(), bucket.parameters[0].shape());
          EXPECT_EQ(bucket.offsets[0], 0);
          EXPECT_EQ(bucket.gradients[0].storage(), bucket.buffer.storage());  // a view of the buffer
          s.seen.push_back(std::to_string(bucket.index) + (bucket.is_last ? " last" : ""));
          group.allreduce(bucket.buffer)->wait(group.timeout());
          return std::make_shared<DoneWork>();
        });
    dist::DistributedDataParallel ddp(model, ctx->group, opts);
    for (int it = 0; it < 2; ++it) F::sum(ddp(random_batch(10 + ctx->rank))).backward();
    EXPECT_EQ(state->calls, 8);
    EXPECT_EQ(state->seen, (std::vector<std::string>{"0", "1", "2", "3 last", "0", "1", "2", "3 last"}));
    return;
  }
  run_ranks(2);
}

TEST(PowerSgd, BeforeItsStartIterationItIsPlainAllReduce) {
  if (auto ctx = child_rank()) {
    manual_seed(2);
    auto plain = std::make_shared<TwoLayers>(), compressed = std::make_shared<TwoLayers>();
    compressed->load_state_dict([&] {
      std::map<std::string, Tensor> m;
      for (auto& [n, t] : plain->state_dict()) m[n] = t.clone();
      return m;
    }());
    dist::DistributedDataParallel ddp_plain(plain, ctx->group);
    dist::DDPOptions opts;
    opts.reducer.comm_hook = dist::powersgd_hook({.rank = 1, .start_iter = 2});
    dist::DistributedDataParallel ddp_c(compressed, ctx->group, opts);
    for (int it = 0; it < 2; ++it) {
      plain->zero_grad();
      compressed->zero_grad();
      F::sum(ddp_plain(random_batch(20 + ctx->rank))).backward();
      F::sum(ddp_c(random_batch(20 + ctx->rank))).backward();
      EXPECT_EQ(compressed->a->weight.grad().to_vector<float>(), plain->a->weight.grad().to_vector<float>());
      EXPECT_EQ(ddp_c.reducer().stats().bytes, ddp_plain.reducer().stats().bytes);
    }
    // From the third iteration on it compresses: a.weight [32, 16] becomes P [32, 1] + Q [16, 1].
    plain->zero_grad();
    compressed->zero_grad();
    F::sum(ddp_plain(random_batch(30 + ctx->rank))).backward();
    F::sum(ddp_c(random_batch(30 + ctx->rank))).backward();
    EXPECT_NE(compressed->a->weight.grad().to_vector<float>(), plain->a->weight.grad().to_vector<float>());
    EXPECT_LT(ddp_c.reducer().stats().bytes, ddp_plain.reducer().stats().bytes / 3);
    EXPECT_EQ(ddp_c.reducer().stats().bucket_bytes, ddp_plain.reducer().stats().bucket_bytes);
    return;
  }
  run_ranks(2);
}

// Rank r's gradient u v_r^T (same u, its own v_r) averages to u mean(v)^T, of rank 1: one power
// iteration recovers it exactly (to rounding). Driven through the hook directly.
TEST(PowerSgd, RecoversAnAverageOfRankOneAndKeepsTheErrorForTheNextStep) {
  if (auto ctx = child_rank()) {
    const int64_t rows = 24, cols = 20;
    Tensor grad = Tensor::empty({rows, cols});
    Generator gu(7), gv(100 + ctx->rank);
    std::vector<float> u(rows), v(cols), v_other(cols);
    for (auto& e : u) e = static_cast<float>(gu.uniform(-1, 1));
    for (auto& e : v) e = static_cast<float>(gv.uniform(-1, 1));
    Generator go(100 + (1 - ctx->rank));
    for (auto& e : v_other) e = static_cast<float>(go.uniform(-1, 1));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) grad.data<float>()[i * cols + j] = u[i] * v[j] / 2;  // pre-divided
    dist::GradBucket bucket;
    bucket.buffer = Tensor::empty({rows * cols + cols});
    bucket.gradients = {bucket.buffer.slice(0, 0, rows * cols).view({rows, cols}),
                        bucket.buffer.slice(0, rows * cols, rows * cols + cols)};
    bucket.gradients[0].copy_(grad);
    bucket.gradients[1].copy_(Tensor::full({cols}, 0.5 * (ctx->rank + 1)));
    bucket.is_last = true;
    dist::PowerSGDState state({.rank = 1, .start_iter = 0});
    dist::powersgd(state, *ctx->group, bucket)->wait(std::chrono::seconds(30));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_NEAR(bucket.gradients[0].data<float>()[i * cols + j], u[i] * (v[j] + v_other[j]) / 2, 1e-5)
            << i << "," << j;
    // The vector is all-reduced uncompressed: 0.5 + 1.0.
    for (float e : bucket.gradients[1].to_vector<float>()) ASSERT_FLOAT_EQ(e, 1.5f);
    // Error feedback: what this rank sent minus its share (1/world) of what came back, so the
    // errors of all ranks add up to what the approximation lost (here nothing).
    ASSERT_TRUE(state.error.count(0));
    const auto err = state.error[0].to_vector<float>();
    for (int64_t k = 0; k < rows * cols; ++k)
      ASSERT_NEAR(err[k], grad.data<float>()[k] - bucket.gradients[0].data<float>()[k] / 2, 1e-6);
    for (int64_t k = rows * cols; k < rows * cols + cols; ++k)
      ASSERT_FLOAT_EQ(err[k], 0.5f * (ctx->rank + 1) - 0.75f);
    const auto all_err = dist::allreduce_values(*ctx->group, std::vector<double>(err.begin(), err.end()),
                                                dist::ReduceOp::Sum, "errors");
    for (double e : all_err) ASSERT_NEAR(e, 0.0, 1e-5);
    EXPECT_EQ(bucket.bytes_sent, (cols + rows + cols) * 4);
    EXPECT_EQ(state.iteration, 1);
    return;
  }
  run_ranks(2);
}

TEST(PowerSgd, BadSettingsAndUnknownHookNamesAreOneLineErrors) {
  EXPECT_THROW(dist::powersgd_hook({.rank = 0}), Error);
  EXPECT_THROW(dist::powersgd_hook({.start_iter = -1}), Error);
  try {
    dist::comm_hook_by_name("powerSGD!");
    ADD_FAILURE() << "should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("powersgd"), std::string::npos) << e.what();
  }
}

// With a rank at least each matrix's smaller side, PowerSGD is exact: every step, warm start and
// error feedback included, gives plain all-reduce's gradients (to rounding).
TEST(PowerSgd, FullRankEqualsPlainAllReduceStepAfterStep) {
  if (auto ctx = child_rank()) {
    manual_seed(4);
    auto plain = std::make_shared<TwoLayers>(), compressed = std::make_shared<TwoLayers>();
    std::map<std::string, Tensor> init;
    for (auto& [n, t] : plain->state_dict()) init[n] = t.clone();
    compressed->load_state_dict(init);
    dist::DistributedDataParallel ddp_plain(plain, ctx->group);
    dist::DDPOptions opts;
    opts.reducer.comm_hook = dist::powersgd_hook({.rank = 32, .start_iter = 0, .min_compression_rate = 1e-6});
    dist::DistributedDataParallel ddp_c(compressed, ctx->group, opts);
    for (int it = 0; it < 5; ++it) {
      plain->zero_grad();
      compressed->zero_grad();
      // 40 rows: every gradient matrix has full rank, so the rank-16/8 factors span it.
      auto loss = [](const Tensor& out) { return F::sum(F::mul(out, out)); };  // rows' gradients differ
      loss(ddp_plain(random_batch(40 + 10 * ctx->rank + it, 40))).backward();
      loss(ddp_c(random_batch(40 + 10 * ctx->rank + it, 40))).backward();
      auto pp = plain->named_parameters(), pc = compressed->named_parameters();
      for (size_t i = 0; i < pp.size(); ++i) {
        const auto a = pp[i].second.grad().to_vector<float>(), b = pc[i].second.grad().to_vector<float>();
        for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(b[k], a[k], 1e-4) << "step " << it << " " << pp[i].first << "[" << k << "]";
      }
    }
    return;
  }
  run_ranks(2);
}

// PowerSGD's Gram-Schmidt with tensor ops (the way of CUDA buckets), run on the host: on a slice of
// a larger buffer (as the hook's P and Q are) the columns come out orthonormal, each spans what the
// input's first columns spanned (Q^T M is upper triangular), a zero column stays zero, and the
// buffer around the slice is untouched.
TEST(PowerSgd, TensorOpOrthogonalisationGivesOrthonormalColumns) {
  const int64_t rows = 7, cols = 4;
  std::vector<float> v(rows * cols + 3);
  Generator gen(21);
  for (float& x : v) x = static_cast<float>(gen.normal());
  for (int64_t i = 0; i < rows; ++i) v[1 + i * cols + 2] = 0.0f;  // column 2 is zero
  const Tensor buffer = Tensor::from_vector(v, {rows * cols + 3});
  Tensor m = buffer.slice(0, 1, 1 + rows * cols).view({rows, cols});
  const Tensor before = m.clone();
  dist::orthogonalize_with_tensor_ops(m);
  const std::vector<float> q = m.to_vector<float>(), in = before.to_vector<float>(), all = buffer.to_vector<float>();
  EXPECT_EQ(all.front(), v.front());
  EXPECT_EQ(all[rows * cols + 1], v[rows * cols + 1]);
  EXPECT_EQ(all.back(), v.back());
  auto at = [&](const std::vector<float>& a, int64_t i, int64_t c) { return static_cast<double>(a[i * cols + c]); };
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t k = 0; k < cols; ++k) {
      double dot = 0, proj = 0;
      for (int64_t i = 0; i < rows; ++i) {
        dot += at(q, i, c) * at(q, i, k);
        proj += at(q, i, c) * at(in, i, k);
      }
      const double want = (c == k && c != 2) ? 1.0 : 0.0;
      EXPECT_NEAR(dot, want, 1e-5) << "columns " << c << ", " << k;
      if (k < c) {
        EXPECT_NEAR(proj, 0.0, 1e-5) << "column " << c << " against input column " << k;
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(at(q, i, 2), 0.0) << "row " << i;
}
