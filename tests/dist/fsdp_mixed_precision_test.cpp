// FullyShardedDataParallel's mixed precision (dist/parallel/fsdp.h: MixedPrecision) against a
// single-process reference that does the same casts by hand: one float32 master model; each step, for
// each rank's micro-batches in turn, a copy of the model whose parameters are the master rounded to
// param_dtype runs forward and backward (its param_dtype gradients accumulating across micro-batches);
// each rank's gradient is scaled by 1/world and rounded to reduce_dtype, the ranks' contributions are
// summed in reduce_dtype in the order the process groups sum them, and the sum, widened to float32, is
// the master's gradient for an unchanged optimizer.
// The comparison is bitwise. The sums' order is the groups' own: shared memory sums in rank order
// (((r0 + r1) + r2) ...); HYBRID_SHARD sums inside each node of 2 ranks, then the nodes' sums
// ((r0 + r1) + (r2 + r3)), and the reference does exactly that. A sum of two is the same in either
// order (IEEE addition commutes), so no other order can enter. Over TCP (TANDEM_SHM=0) the
// reduce-scatters still sum in rank order, but Gloo's ring all-reduce of NO_SHARD does not: with 3
// ranks that case asks for shared memory.
// Covered: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD; SGD with momentum and AdamW;
// accumulation under no_sync; 2, 3 and 4 ranks; bfloat16 and float16; reduce_dtype float32 and the
// default (param_dtype); float32 compute with a bfloat16 reduction; batch norm kept in float32 as
// its own unit; the errors that name the fix.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cctype>
#include <cstring>
#include <sstream>

#include "common/ranks.h"
#include "common/test_util.h"
#include "dist/fsdp_fixtures.h"
#include "dist/group/process_group_factory.h"
#include "dist/group/process_group_gloo.h"
#include "dist/parallel/fsdp.h"
#include "nn/amp.h"
#include "nn/models/mnist_net.h"

using namespace tandem;
using namespace tandem::test::fsdp;

namespace {

struct MpSetup {
  std::string strategy, optimizer;
  int micro = 1;
  std::string param_dtype, reduce_dtype;  // "-": none
};

MpSetup parse_mp(const std::string& text) {
  MpSetup s;
  std::istringstream in(text);
  in >> s.strategy >> s.optimizer >> s.micro >> s.param_dtype >> s.reduce_dtype;
  return s;
}

std::optional<DType> dtype_of(const std::string& name) {
  if (name == "-") return std::nullopt;
  return dist::parse_mixed_precision_dtype(name);
}

// One element of a float32, bfloat16 or float16 tensor, as float / rounded from float.
float get(const Tensor& t, int64_t i) {
  if (t.dtype() == kBFloat16) return static_cast<float>(static_cast<const Eigen::bfloat16*>(t.raw_data())[i]);
  if (t.dtype() == kFloat16) return static_cast<float>(static_cast<const Eigen::half*>(t.raw_data())[i]);
  return t.data<float>()[i];
}
void set(Tensor& t, int64_t i, float v) {
  if (t.dtype() == kBFloat16)
    static_cast<Eigen::bfloat16*>(t.raw_data())[i] = Eigen::bfloat16(v);
  else if (t.dtype() == kFloat16)
    static_cast<Eigen::half*>(t.raw_data())[i] = Eigen::half(v);
  else
    t.data<float>()[i] = v;
}

// r's gradient scaled by 1/world, rounded to `reduce`.
Tensor contribution(const Tensor& g, DType reduce, int world) {
  Tensor c = Tensor::empty(g.shape(), reduce);
  const float scale = static_cast<float>(1.0 / world);
  for (int64_t i = 0; i < g.numel(); ++i) set(c, i, get(g, i) * scale);
  return c;
}

// a + b, rounded to a's dtype.
Tensor plus(const Tensor& a, const Tensor& b) {
  Tensor c = Tensor::empty(a.shape(), a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i) set(c, i, get(a, i) + get(b, i));
  return c;
}

// The reference: the parameters after kSteps, by name.
std::map<std::string, Tensor> reference(const MpSetup& s, int world) {
  const DType param = dtype_of(s.param_dtype).value_or(kFloat32);
  const DType reduce = dtype_of(s.reduce_dtype).value_or(param);
  manual_seed(11);
  Net master;
  auto opt = make_optimizer(s.optimizer, master.parameters());
  const auto named = master.named_parameters();
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    std::vector<std::vector<Tensor>> per_rank;  // [rank][parameter]: the contributions
    for (int r = 0; r < world; ++r) {
      Net low;  // the master rounded to param_dtype
      const auto low_named = low.named_parameters();
      for (size_t i = 0; i < named.size(); ++i)
        const_cast<Tensor&>(low_named[i].second).set_data(named[i].second.detach().to(param));
      for (int m = 0; m < s.micro; ++m) {
        const Batch b = batch(step, m, r);
        F::nll_loss(low.forward(b.x), b.y).backward();
      }
      per_rank.emplace_back();
      for (auto& [name, p] : low_named) per_rank.back().push_back(contribution(p.grad(), reduce, world));
    }
    for (size_t i = 0; i < named.size(); ++i) {
      Tensor sum;
      if (s.strategy == "HYBRID_SHARD") {  // in each node of 2, then across the nodes
        sum = plus(per_rank[0][i], per_rank[1][i]);
        for (int node = 1; node < world / 2; ++node)
          sum = plus(sum, plus(per_rank[2 * node][i], per_rank[2 * node + 1][i]));
      } else {
        sum = per_rank[0][i];
        for (int r = 1; r < world; ++r) sum = plus(sum, per_rank[r][i]);
      }
      const_cast<Tensor&>(named[i].second).set_grad(sum.to(kFloat32));
    }
    opt->step();
  }
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : named) out[n] = t.detach().clone();
  return out;
}

void check_against_reference(const test::RankContext& ctx) {
  const MpSetup s = parse_mp(ctx.param);
  manual_seed(11);
  auto net = std::make_shared<Net>();
  dist::FSDPOptions o;
  o.auto_wrap_policy.module_classes = {"Block"};
  o.mixed_precision.param_dtype = dtype_of(s.param_dtype);
  o.mixed_precision.reduce_dtype = dtype_of(s.reduce_dtype);
  auto group = groups(ctx, s.strategy, o, "mp");
  if (s.strategy == "NO_SHARD" && ctx.world > 2) {
    const auto* gloo = dynamic_cast<const dist::ProcessGroupGloo*>(group.get());
    ASSERT_TRUE(gloo && gloo->allreduce_transport().rfind("shared memory", 0) == 0)
        << "NO_SHARD's all-reduce of 3 ranks sums in rank order only through shared memory (Gloo's TCP ring "
           "sums in its own order); run the ranks on one host without TANDEM_SHM=0";
  }
  dist::FullyShardedDataParallel fsdp(net, group, o);
  const DType param = o.mixed_precision.param_dtype.value_or(kFloat32);
  for (auto& u : fsdp.units()) {
    EXPECT_EQ(u.param_dtype, param);
    EXPECT_EQ(u.reduce_dtype, o.mixed_precision.reduce_dtype.value_or(param));
  }
  EXPECT_EQ(net->b0->fc1->weight.dtype(), param) << "the module computes with param_dtype parameters";
  for (auto& p : fsdp.parameters()) EXPECT_EQ(p.dtype(), kFloat32) << "the shards stay float32 masters";
  auto opt = make_optimizer(s.optimizer, fsdp.parameters());
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    for (int m = 0; m < s.micro; ++m) {
      const Batch b = batch(step, m, ctx.rank);
      auto guard = m + 1 < s.micro ? fsdp.no_sync() : nullptr;
      F::nll_loss(fsdp.forward(b.x), b.y).backward();
    }
    for (auto& p : fsdp.parameters()) ASSERT_EQ(p.grad().dtype(), kFloat32);
    opt->step();
  }
  std::map<std::string, Tensor> got;
  for (auto& [n, t] : fsdp.full_state_dict()) got[n] = t;
  const auto want = reference(s, ctx.world);
  ASSERT_EQ(got.size(), want.size());
  for (auto& [n, t] : want) {
    ASSERT_EQ(got.at(n).dtype(), kFloat32) << n << ": the full state dict holds the float32 masters";
    EXPECT_EQ(std::memcmp(got.at(n).data<float>(), t.data<float>(), t.nbytes()), 0)
        << ctx.param << ": " << n << " differs from the reference by " << max_diff({{n, got.at(n)}}, {{n, t}});
  }
  // The casts happened: the same run in float32 lands elsewhere.
  const auto fp32 = reference(MpSetup{s.strategy, s.optimizer, s.micro, "-", "-"}, ctx.world);
  EXPECT_GT(max_diff(got, fp32), 0.0) << ctx.param;
}

}  // namespace

struct Case {
  int world;
  const char* setup;  // strategy optimizer micro-batches param_dtype reduce_dtype ("-": none)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.world << " ranks, " << c.setup; }

class FsdpMixedPrecisionVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpMixedPrecisionVsReference, IsBitwiseEqual) {
  if (auto ctx = test::child_rank()) return check_against_reference(*ctx);
  test::run_ranks(GetParam().world, GetParam().setup);
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpMixedPrecisionVsReference,
                         ::testing::Values(Case{2, "FULL_SHARD sgd 1 bfloat16 -"},
                                           Case{3, "FULL_SHARD adamw 2 bfloat16 float32"},
                                           Case{2, "FULL_SHARD sgd 1 - bfloat16"},
                                           Case{3, "SHARD_GRAD_OP adamw 1 float16 -"},
                                           Case{2, "SHARD_GRAD_OP sgd 2 bfloat16 -"},
                                           Case{3, "NO_SHARD sgd 1 bfloat16 -"},
                                           Case{2, "NO_SHARD adamw 2 bfloat16 float32"},
                                           Case{4, "HYBRID_SHARD sgd 1 bfloat16 -"},
                                           Case{4, "HYBRID_SHARD adamw 2 bfloat16 float32"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = std::to_string(info.param.world) + "Ranks";
                           for (const char* c = info.param.setup; *c; ++c) {
                             if (*c == ' ') name += '_';
                             if (*c == '-') name += "none";
                             if (std::isalnum(static_cast<unsigned char>(*c))) name += *c;
                           }
                           return name;
                         });

// MNIST's net: its batch norms keep float32 as units of their own (PyTorch's default
// module_classes_to_ignore), the rest computes in bfloat16; it trains, and the checkpoint is float32.
TEST(FsdpMixedPrecision, BatchNormKeepsFullPrecisionInAUnitOfItsOwn) {
  if (auto ctx = test::child_rank()) {
    manual_seed(3);
    auto net = std::make_shared<nn::models::MnistNet>();
    dist::FSDPOptions o;
    o.mixed_precision.param_dtype = kBFloat16;
    dist::FullyShardedDataParallel fsdp(net, ctx->group, o);
    const auto units = fsdp.units();
    ASSERT_EQ(units.size(), 3u);  // n1, n2, the root
    EXPECT_EQ(units[0].path, "n1");
    EXPECT_EQ(units[0].param_dtype, kFloat32);
    EXPECT_EQ(units[1].path, "n2");
    EXPECT_EQ(units[2].param_dtype, kBFloat16);
    EXPECT_EQ(net->n1->weight.dtype(), kFloat32);
    EXPECT_EQ(net->conv1->weight.dtype(), kBFloat16);
    optim::SGD sgd(fsdp.parameters(), optim::SGDOptions{0.01});
    optim::Optimizer* opt = &sgd;
    Generator g(7 + ctx->rank);
    Tensor x = Tensor::empty({4, 1, 28, 28}), y = Tensor::empty({4}, kInt64);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
    for (int64_t i = 0; i < 4; ++i) y.data<int64_t>()[i] = i % 10;
    double first = 0, last = 0;
    for (int step = 0; step < 5; ++step) {
      opt->zero_grad();
      Tensor loss = F::nll_loss(fsdp.forward(x), y);
      (step == 0 ? first : last) = loss.to(kFloat64).data<double>()[0];
      loss.backward();
      opt->step();
    }
    EXPECT_LT(last, first) << "five steps on one batch lower its loss";
    for (auto& [n, t] : fsdp.full_state_dict())
      if (is_floating(t.dtype())) {
        EXPECT_EQ(t.dtype(), kFloat32) << n;
      }
    return;
  }
  test::run_ranks(2);
}

TEST(FsdpMixedPrecision, ErrorsNameTheFix) {
  if (auto ctx = test::child_rank()) {
    manual_seed(1);
    dist::FSDPOptions o;
    o.mixed_precision.param_dtype = kFloat16;
    dist::FullyShardedDataParallel fsdp(std::make_shared<Net>(), ctx->group, o);
    const Batch b = batch(0, 0, ctx->rank);
    std::string msg = test::error_of([&] {
      amp::AutocastGuard autocast(amp::Precision::kBFloat16);
      fsdp.forward(b.x);
    });
    EXPECT_NE(msg.find("mixed_precision.param_dtype=float16 and autocast (bf16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use one"), std::string::npos) << msg;
    msg = test::error_of([&] { dist::parse_mixed_precision_dtype("bfloat"); });
    EXPECT_NE(msg.find("unknown mixed precision dtype 'bfloat'; expected bfloat16, float16 or float32"),
              std::string::npos)
        << msg;
    EXPECT_EQ(dist::parse_mixed_precision_dtype("torch.bfloat16"), kBFloat16);
    o.mixed_precision.param_dtype = kInt64;
    msg = test::error_of([&] { dist::FullyShardedDataParallel(std::make_shared<Net>(), ctx->group, o); });
    EXPECT_NE(msg.find("mixed_precision.param_dtype is int64; expected bfloat16, float16 or float32"),
              std::string::npos)
        << msg;
    return;
  }
  test::run_ranks(2);
}
