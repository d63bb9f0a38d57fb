// The automatic DDP bucket cap (ReducerOptions::bucket_cap_mb <= 0): the choice rule's arithmetic
// and clamps, and, over 2 real ranks on Gloo, that the constructor measures, that every rank ends
// up with rank 0's cap, and that gradients are still averaged exactly with the buckets it chose.
// Also the benchmark's synthetic model (nn/models/mlp): its size and names, which the PyTorch side
// of bench/ddp_buckets.py must match, and the bucket layouts the sweep's caps give it.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "core/autograd.h"
#include "core/random.h"
#include "dist/parallel/ddp.h"
#include "common/ranks.h"
#include "nn/models/mlp.h"
#include "nn/nn.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

class Wide : public nn::Module {
 public:
  Wide() {
    a = register_module("a", std::make_shared<nn::Linear>(256, 1024));
    b = register_module("b", std::make_shared<nn::Linear>(1024, 1024));
    c = register_module("c", std::make_shared<nn::Linear>(1024, 8));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu((*a)(x));
    h = F::relu((*b)(h));
    return F::log_softmax((*c)(h), -1);
  }
  std::shared_ptr<nn::Linear> a, b, c;
};

Tensor input_of(int rank) {
  Tensor x = Tensor::empty({4, 256});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(std::sin(0.01 * i + rank));
  return x;
}

Tensor labels_of(int rank) { return Tensor::from_vector<int64_t>({rank, 1, 2 + rank, 3}, {4}); }

std::map<std::string, Tensor> copy_of(const nn::NamedTensors& state) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, t] : state) m[name] = t.clone();
  return m;
}

}  // namespace

TEST(BucketAuto, RuleIsTenLatenciesOfBandwidthClamped) {
  const int64_t big = int64_t{400} << 20;  // 400 MiB of gradients: upper clamp 100 MiB
  // 100 us x 2 GB/s x 10 = 2e6 bytes.
  EXPECT_NEAR(dist::Reducer::auto_bucket_cap_mb(100.0, 2.0, big), 2e6 / kMiB, 1e-9);
  // 1 ms x 5 GB/s x 10 = 50e6 bytes = 47.7 MiB.
  EXPECT_NEAR(dist::Reducer::auto_bucket_cap_mb(1000.0, 5.0, big), 50e6 / kMiB, 1e-9);
  // Tiny latency: at least 1 MiB.
  EXPECT_DOUBLE_EQ(dist::Reducer::auto_bucket_cap_mb(1.0, 1.0, big), 1.0);
  // Slow network with high latency: at most 100 MiB ...
  EXPECT_DOUBLE_EQ(dist::Reducer::auto_bucket_cap_mb(1e5, 10.0, big), 100.0);
  // ... and at most a quarter of the gradients (40 MiB -> 10 MiB).
  EXPECT_DOUBLE_EQ(dist::Reducer::auto_bucket_cap_mb(1e5, 10.0, int64_t{40} << 20), 10.0);
  // A model under 4 MiB: the 1 MiB floor wins over the quarter.
  EXPECT_DOUBLE_EQ(dist::Reducer::auto_bucket_cap_mb(1e5, 10.0, int64_t{1} << 20), 1.0);
  // No measurement (world of one, or a NaN): the upper clamp.
  EXPECT_DOUBLE_EQ(dist::Reducer::auto_bucket_cap_mb(0.0, 0.0, int64_t{40} << 20), 10.0);
  EXPECT_DOUBLE_EQ(dist::Reducer::auto_bucket_cap_mb(std::nan(""), 1.0, big), 100.0);
}

TEST(BucketAuto, FirstBucketCapMustStillBePositive) {
  // A fake single-rank group is not needed: the check comes before any communication.
  if (auto ctx = child_rank()) {
    auto net = std::make_shared<Wide>();
    dist::DDPOptions o;
    o.reducer.bucket_cap_mb = 0;
    o.reducer.first_bucket_cap_mb = 0;
    std::string error;
    try {
      dist::DistributedDataParallel ddp(net, ctx->group, o);
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("first_bucket_cap_mb must be positive"), std::string::npos) << error;
    return;
  }
  run_ranks(1);
}

TEST(BucketAuto, TwoRanksMeasureAgreeAndAverageExactly) {
  if (auto ctx = child_rank()) {
    manual_seed(7);  // the same initial weights on both ranks (DDP broadcasts rank 0's anyway)
    auto net = std::make_shared<Wide>();
    auto reference = std::make_shared<Wide>();
    reference->load_state_dict(copy_of(net->state_dict()));
    dist::DDPOptions o;
    o.reducer.bucket_cap_mb = 0;  // auto
    dist::DistributedDataParallel ddp(net, ctx->group, o);
    const auto& a = ddp.reducer().auto_bucket_cap();
    ASSERT_TRUE(a.measured);
    EXPECT_GT(a.latency_us, 0.0);
    EXPECT_GT(a.bandwidth_gbps, 0.0);
    EXPECT_GT(a.probe_mb, 0.0);
    int64_t total = 0;
    for (auto& [n, p] : net->named_parameters()) total += static_cast<int64_t>(p.nbytes());
    const double upper = std::max(1.0, std::min(100.0, total / 4.0 / kMiB));
    EXPECT_GE(a.cap_mb, 1.0);
    EXPECT_LE(a.cap_mb, upper);
    EXPECT_EQ(ddp.reducer().bucket_cap_mb(), a.cap_mb);

    // Every rank holds rank 0's cap.
    Tensor mine = Tensor::from_vector<double>({a.cap_mb, a.latency_us, a.bandwidth_gbps}, {3});
    std::vector<Tensor> all{Tensor::empty({3}, kFloat64), Tensor::empty({3}, kFloat64)};
    ctx->group->allgather(all, mine)->wait(ctx->group->timeout());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(all[0].data<double>()[i], all[1].data<double>()[i]) << i;

    // Two steps (the first rebuilds the buckets): gradients are the mean of both ranks' own.
    for (int step = 0; step < 2; ++step) {
      ddp.zero_grad();
      F::nll_loss(ddp(input_of(ctx->rank)), labels_of(ctx->rank)).backward();
      reference->load_state_dict(copy_of(net->state_dict()));
      std::vector<std::vector<float>> sum;
      for (int r = 0; r < 2; ++r) {
        reference->zero_grad();
        F::nll_loss((*reference)(input_of(r)), labels_of(r)).backward();
        auto params = reference->parameters();
        if (sum.empty()) sum.resize(params.size());
        for (size_t i = 0; i < params.size(); ++i) {
          auto g = params[i].grad().to_vector<float>();
          if (sum[i].empty()) sum[i].assign(g.size(), 0.0f);
          for (size_t k = 0; k < g.size(); ++k) sum[i][k] += g[k];
        }
      }
      auto params = net->parameters();
      float worst = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].grad().to_vector<float>();
        for (size_t k = 0; k < g.size(); ++k) worst = std::max(worst, std::abs(g[k] - sum[i][k] / 2));
      }
      EXPECT_LT(worst, 1e-5f) << "step " << step;
      EXPECT_GT(ddp.reducer().stats().buckets, 0);
    }
    return;
  }
  run_ranks(2);
}

TEST(BenchMlp, DefaultIsTheReferenceModelWithSequentialNames) {
  nn::models::Mlp net;  // 1024 -> 2048 x6 -> 10
  const auto params = net.named_parameters();
  ASSERT_EQ(params.size(), 14u);
  EXPECT_EQ(params.front().first, "0.weight");
  EXPECT_EQ(params.back().first, "12.bias");
  int64_t total = 0;
  for (auto& [n, p] : params) total += p.numel();
  // 1024*2048+2048 + 5*(2048*2048+2048) + 2048*10+10, as torch.nn.Sequential(Linear, ReLU, ...).
  EXPECT_EQ(total, 23101450);
  EXPECT_EQ(nn::models::Mlp::parameter_count({}), total);
  EXPECT_EQ(params[0].second.shape(), (Shape{2048, 1024}));

  nn::models::Mlp small({8, 16, 2, 3});
  Tensor out = small(Tensor::ones({5, 8}));
  EXPECT_EQ(out.shape(), (Shape{5, 3}));
  EXPECT_EQ(nn::models::Mlp::parameter_count({8, 16, 2, 3}), 8 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3);
  std::string error;
  try {
    small(Tensor::ones({5, 7}));
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("expected input [N, 8]"), std::string::npos) << error;
}
