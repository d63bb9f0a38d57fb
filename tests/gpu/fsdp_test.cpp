// FullyShardedDataParallel on the GPU: a one-rank NCCL group (the flat buffers in the CUDA caching
// allocator, the gathers and reduce-scatters on NCCL's stream) and two ranks sharing one GPU over
// Gloo with CUDA tensors (every collective through host copies), each against the same model
// trained without sharding on all the ranks' rows; the same with cpu_offload (the shards, their
// gradients and the optimizer's state in host memory); and mixed precision with cpu_offload on one
// rank against the same casts done by hand. Skips when no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "common/ranks.h"
#include "core/random.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/fsdp.h"
#include "dist/store/file_store.h"
#include "gpu_test_util.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using gpu_test::gpu;

class Block : public nn::Module {
 public:
  Block() {
    a = register_module("a", std::make_shared<nn::Linear>(16, 32));
    b = register_module("b", std::make_shared<nn::Linear>(32, 16));
  }
  Tensor forward(const Tensor& x) override { return F::add(x, b->forward(F::relu(a->forward(x)))); }
  std::shared_ptr<nn::Linear> a, b;
};

class Net : public nn::Module {
 public:
  Net() {
    in = register_module("in", std::make_shared<nn::Linear>(12, 16));
    b0 = register_module("b0", std::make_shared<Block>());
    b1 = register_module("b1", std::make_shared<Block>());
    out = register_module("out", std::make_shared<nn::Linear>(16, 5));
  }
  Tensor forward(const Tensor& x) override {
    return F::log_softmax(out->forward(b1->forward(b0->forward(F::relu(in->forward(x))))), -1);
  }
  std::shared_ptr<nn::Linear> in, out;
  std::shared_ptr<Block> b0, b1;
};

// Rows [lo, hi) of step `step`'s 8-row batch, on the GPU.
void batch(int step, int64_t lo, int64_t hi, Tensor& x, Tensor& y) {
  Generator g(900 + step);
  Tensor xs = Tensor::empty({8, 12}), ys = Tensor::empty({8}, kInt64);
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  for (int64_t i = 0; i < 8; ++i) ys.data<int64_t>()[i] = static_cast<int64_t>(g.below(5));
  x = xs.slice(0, lo, hi).contiguous().to(gpu());
  y = ys.slice(0, lo, hi).contiguous().to(gpu());
}

void expect_fsdp_equals_one_model(const std::shared_ptr<dist::ProcessGroup>& group, int rank, int world,
                                  dist::ShardingStrategy strategy, bool offload = false) {
  manual_seed(21);
  auto reference = std::make_shared<Net>();
  manual_seed(21);
  auto local = std::make_shared<Net>();
  reference->to(gpu());
  local->to(gpu());
  dist::FSDPOptions o;
  o.sharding_strategy = strategy;
  o.auto_wrap_policy.module_classes = {"Block"};
  o.cpu_offload.offload_params = offload;
  dist::FullyShardedDataParallel fsdp(local, group, o);
  for (auto& p : fsdp.parameters()) EXPECT_EQ(p.device().is_cpu(), offload) << "the shards live on the host";
  optim::SGD opt(fsdp.parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < 4; ++s) {
    Tensor x, y;
    batch(s, rank * 4, rank * 4 + 4, x, y);
    opt.zero_grad();
    F::nll_loss(fsdp.forward(x), y).backward();
    for (auto& p : fsdp.parameters()) EXPECT_EQ(p.grad().device().is_cpu(), offload);
    opt.step();
    batch(s, 0, world * 4, x, y);
    opt_ref.zero_grad();
    F::nll_loss(reference->forward(x), y).backward();
    opt_ref.step();
  }
  std::map<std::string, Tensor> want;
  for (auto& [name, t] : reference->named_parameters()) want[name] = t.to(Device::cpu());
  double worst = 0;
  for (auto& [name, t] : fsdp.full_state_dict()) {
    EXPECT_TRUE(t.device() == gpu()) << name;
    const auto a = t.to(Device::cpu()).to_vector<float>(), b = want.at(name).to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  EXPECT_LT(worst, 2e-6) << dist::sharding_strategy_name(strategy);
  EXPECT_EQ(fsdp.memory().gathered_bytes, 0);
}

std::shared_ptr<dist::ProcessGroup> one_rank_nccl(const std::string& tag) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tandem-gpu-fsdp-" + tag + "-" + std::to_string(getpid())))
                               .string();
  auto store = std::make_shared<dist::FileStore>(path, 1, 30s);
  return dist::make_process_group("nccl", store, 0, 1, 30s, 0);
}

TEST(GpuFsdp, OneRankNcclEqualsTheModelAlone) {
  TANDEM_NEED_GPUS(1);
  expect_fsdp_equals_one_model(one_rank_nccl("full"), 0, 1, dist::ShardingStrategy::FullShard);
  expect_fsdp_equals_one_model(one_rank_nccl("grad-op"), 0, 1, dist::ShardingStrategy::ShardGradOp);
}

TEST(GpuFsdp, CpuOffloadKeepsShardsOnTheHostAndEqualsTheModelAlone) {
  TANDEM_NEED_GPUS(1);
  expect_fsdp_equals_one_model(one_rank_nccl("offload"), 0, 1, dist::ShardingStrategy::FullShard, true);
}

// One rank, bfloat16 parameters, float32 shards on the host: equals a float32 master stepped with the
// gradients of a bfloat16 copy of itself (on one rank the reduction is a cast).
TEST(GpuFsdp, MixedPrecisionWithCpuOffloadEqualsTheCastsByHand) {
  TANDEM_NEED_GPUS(1);
  manual_seed(23);
  auto master = std::make_shared<Net>();
  manual_seed(23);
  auto local = std::make_shared<Net>();
  master->to(gpu());
  local->to(gpu());
  dist::FSDPOptions o;
  o.auto_wrap_policy.module_classes = {"Block"};
  o.mixed_precision.param_dtype = kBFloat16;
  o.cpu_offload.offload_params = true;
  dist::FullyShardedDataParallel fsdp(local, one_rank_nccl("mixed"), o);
  EXPECT_EQ(local->b0->a->weight.dtype(), kBFloat16);
  optim::SGD opt(fsdp.parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD opt_ref(master->parameters(), optim::SGDOptions{0.1, 0.9});
  const auto named = master->named_parameters();
  for (int s = 0; s < 4; ++s) {
    Tensor x, y;
    batch(s, 0, 8, x, y);
    opt.zero_grad();
    F::nll_loss(fsdp.forward(x), y).backward();
    opt.step();
    Net low;
    low.to(gpu());
    const auto low_named = low.named_parameters();
    for (size_t i = 0; i < named.size(); ++i)
      const_cast<Tensor&>(low_named[i].second).set_data(named[i].second.detach().to(kBFloat16));
    F::nll_loss(low.forward(x), y).backward();
    opt_ref.zero_grad();
    for (size_t i = 0; i < named.size(); ++i)
      const_cast<Tensor&>(named[i].second).set_grad(low_named[i].second.grad().to(kFloat32));
    opt_ref.step();
  }
  std::map<std::string, Tensor> want;
  for (auto& [name, t] : named) want[name] = t.to(Device::cpu());
  double worst = 0;
  for (auto& [name, t] : fsdp.full_state_dict()) {
    EXPECT_EQ(t.dtype(), kFloat32) << name;
    const auto a = t.to(Device::cpu()).to_vector<float>(), b = want.at(name).to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  EXPECT_LT(worst, 1e-6);  // the same kernels on the same values: equal but for a GEMM's order of summation
}

TEST(GpuFsdp, TwoRanksSharingTheGpuOverGlooEqualOneModel) {
  if (auto ctx = test::child_rank()) {
    expect_fsdp_equals_one_model(ctx->group, ctx->rank, ctx->world, dist::ShardingStrategy::FullShard);
    return;
  }
  TANDEM_NEED_GPUS(1);
  test::run_ranks(2);
}

}  // namespace
}  // namespace tandem
