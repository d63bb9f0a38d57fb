// DDP on GPUs, as far as one GPU can show it: DistributedDataParallel, its reducer, the comm hooks
// and the host-value collectives over a one-rank NCCL group (every collective handed to NCCL must
// live on the group's GPU, which NCCL enforces), and two ranks sharing the GPU over Gloo with CUDA
// tensors (real processes, common/ranks.h), where DDP must equal one process on all rows.
// Multi-rank NCCL needs one GPU per rank: NcclGroup.OneRankPerGpuAsThreads (nccl_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "core/autograd.h"
#include "core/random.h"
#include "dist/parallel/comm_hook.h"
#include "dist/parallel/ddp.h"
#include "dist/store/file_store.h"
#include "dist/group/host_values.h"
#include "common/ranks.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/sync_batch_norm.h"
#include "gpu_test_util.h"
#include "nn/models/mnist_net.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using gpu_test::gpu;

class Mlp : public nn::Module {
 public:
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(12, 32));
    b = register_module("b", std::make_shared<nn::Linear>(32, 5));
  }
  Tensor forward(const Tensor& x) override { return F::log_softmax((*b)(F::relu((*a)(x))), -1); }
  std::shared_ptr<nn::Linear> a, b;
};

struct Batch {
  Tensor x, y;
};

// Rows [lo, hi) of step `step`'s 8-row batch, on `device`.
Batch batch(int step, int64_t lo, int64_t hi, Device device) {
  Generator g(500 + step);
  Tensor x = Tensor::empty({8, 12});
  Tensor y = Tensor::empty({8}, kInt64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  for (int64_t i = 0; i < 8; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(g.below(5));
  return {x.slice(0, lo, hi).contiguous().to(device), y.slice(0, lo, hi).contiguous().to(device)};
}

void copy_params(const nn::Module& from, nn::Module& to) {
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : from.state_dict()) state[n] = t.clone();
  to.load_state_dict(state);
}

double max_abs_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i].second.to_vector<double>(), vb = pb[i].second.to_vector<double>();
    for (size_t k = 0; k < va.size(); ++k) worst = std::max(worst, std::abs(va[k] - vb[k]));
  }
  return worst;
}

std::string fresh_store(const std::string& tag) {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("tandem-gpu-ddp-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++)))
      .string();
}

// One training step of the MNIST net on 8 random images on the GPU; returns the loss.
double mnist_step(nn::Module& model, optim::Optimizer& opt, Generator& g) {
  Tensor x = gpu_test::random_cpu({8, 1, 28, 28}, g).to(gpu());
  Tensor y = Tensor::empty({8}, kInt64);
  for (int64_t i = 0; i < 8; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(g.below(10));
  Tensor loss = F::nll_loss(model(x), y.to(gpu()));
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item<double>();
}

std::shared_ptr<dist::ProcessGroup> one_rank_nccl(const std::string& tag) {
  auto store = std::make_shared<dist::FileStore>(fresh_store(tag), 1, 30s);
  return dist::make_process_group("nccl", store, 0, 1, 30s, 0);
}

// K steps of DDP over `group` on rows [rank*4, rank*4+4) against one model on all `world`*4 rows.
void expect_ddp_equals_one_process(const std::shared_ptr<dist::ProcessGroup>& group, int rank, int world,
                                   dist::DDPOptions opts, double tolerance, const std::string& what) {
  manual_seed(11);
  auto reference = std::make_shared<Mlp>();
  auto local = std::make_shared<Mlp>();
  copy_params(*reference, *local);
  reference->to(gpu());
  local->to(gpu());
  dist::DistributedDataParallel ddp(local, group, opts);
  optim::SGD opt(ddp.parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < 4; ++s) {
    const Batch mine = batch(s, rank * 4, rank * 4 + 4, gpu());
    Tensor loss = F::nll_loss(ddp(mine.x), mine.y);
    opt.zero_grad(/*set_to_none=*/!opts.reducer.gradient_as_bucket_view);
    loss.backward();
    opt.step();
    const Batch all = batch(s, 0, world * 4, gpu());
    Tensor ref_loss = F::nll_loss((*reference)(all.x), all.y);
    opt_ref.zero_grad();
    ref_loss.backward();
    opt_ref.step();
  }
  for (auto& [name, p] : local->named_parameters()) EXPECT_TRUE(p.device() == gpu()) << name;
  EXPECT_LT(max_abs_diff(*local, *reference), tolerance) << what;
  EXPECT_GT(ddp.reducer().stats().buckets, 0) << what;
}

TEST(GpuDdp, OneRankNcclEqualsTheModelAlone) {
  TANDEM_NEED_GPUS(1);
  for (const bool view : {false, true}) {
    dist::DDPOptions opts;
    opts.reducer.bucket_cap_mb = 0.001;  // a bucket per tensor
    opts.reducer.first_bucket_cap_mb = 0.001;
    opts.reducer.gradient_as_bucket_view = view;
    expect_ddp_equals_one_process(one_rank_nccl("plain"), 0, 1, opts, 1e-6, view ? "as bucket views" : "copied");
  }
}

TEST(GpuDdp, OneRankNcclCommHooksAndAutoCap) {
  TANDEM_NEED_GPUS(1);
  for (const std::string hook : {"fp16", "bf16"}) {
    dist::DDPOptions opts;
    opts.reducer.comm_hook = dist::comm_hook_by_name(hook);
    expect_ddp_equals_one_process(one_rank_nccl(hook), 0, 1, opts, hook == "fp16" ? 2e-3 : 2e-2, hook);
  }
  dist::DDPOptions opts;
  opts.reducer.bucket_cap_mb = 0;  // automatic (nothing to measure with one rank)
  expect_ddp_equals_one_process(one_rank_nccl("auto"), 0, 1, opts, 1e-6, "auto cap");
}

TEST(GpuDdp, HostValuesTravelOnTheNcclGroupsGpu) {
  TANDEM_NEED_GPUS(1);
  auto group = one_rank_nccl("values");
  EXPECT_TRUE(group->comm_device() == gpu());
  EXPECT_TRUE(dist::values_on(*group, {1.0}).device() == gpu());
  EXPECT_EQ(dist::allreduce_values(*group, {1.5, -2.0}, dist::ReduceOp::Max, "t"), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(dist::broadcast_values(*group, {3.0, 9007199254740991.0}, 0, "t"),
            (std::vector<double>{3.0, 9007199254740991.0}));
  EXPECT_EQ(dist::allgather_values(*group, {4.0}, "t"), (std::vector<std::vector<double>>{{4.0}}));
}

TEST(GpuDdp, MnistNetOverOneRankNcclKeepsBuffersOnTheGpu) {
  TANDEM_NEED_GPUS(1);
  manual_seed(3);
  auto model = std::make_shared<nn::models::MnistNet>();
  model->to(gpu());
  auto sync = dist::convert_sync_batchnorm(*model, one_rank_nccl("snb"));
  dist::DistributedDataParallel ddp(model, one_rank_nccl("mnist"));
  optim::Adadelta opt(ddp.parameters(), optim::AdadeltaOptions{1.0});
  Generator g(1);
  for (int step = 0; step < 3; ++step) EXPECT_TRUE(std::isfinite(mnist_step(ddp, opt, g)));
  for (auto& [name, b] : model->named_buffers()) EXPECT_TRUE(b.device() == gpu()) << name;
  EXPECT_GT(sync, 0);
}

// Gloo's collectives on CUDA tensors: staged through the host, results back on the device.
TEST(GpuGloo, CollectivesOnCudaTensorsTravelThroughTheHost) {
  if (auto ctx = test::child_rank()) {
    const double r = ctx->rank;
    Tensor sum = Tensor::from_vector<float>({float(r + 1), float(2 * r)}, {2}).to(gpu());
    ctx->group->allreduce(sum)->wait(30s);
    EXPECT_TRUE(sum.device() == gpu());
    EXPECT_EQ(sum.to_vector<float>(), (std::vector<float>{3, 2}));
    Tensor b = Tensor::from_vector<int64_t>({int64_t(7 + ctx->rank)}, {1}).to(gpu());
    ctx->group->broadcast(b, 1)->wait(30s);
    EXPECT_EQ(b.to_vector<int64_t>(), (std::vector<int64_t>{8}));
    std::vector<Tensor> all = {Tensor::empty({1}, kFloat64, gpu()), Tensor::empty({1}, kFloat64, gpu())};
    ctx->group->allgather(all, Tensor::from_vector<double>({r}, {1}).to(gpu()))->wait(30s);
    EXPECT_EQ(all[0].to_vector<double>(), (std::vector<double>{0}));
    EXPECT_EQ(all[1].to_vector<double>(), (std::vector<double>{1}));
    auto work = ctx->group->allreduce(sum);
    EXPECT_NE(work->description().find("on cuda:0 via host"), std::string::npos) << work->description();
    work->wait(30s);
    // The collectives of sharding, staged the same way.
    Tensor flat = Tensor::zeros({4}, kFloat32, gpu());
    ctx->group->all_gather_into_tensor(flat, Tensor::full({2}, r + 0.5, kFloat32, gpu()))->wait(30s);
    EXPECT_TRUE(flat.device() == gpu());
    EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{0.5f, 0.5f, 1.5f, 1.5f}));
    Tensor whole = Tensor::from_vector<float>({float(r), 1, 2, float(3 * r)}, {4}).to(gpu());
    Tensor mine = Tensor::zeros({2}, kFloat32, gpu());
    ctx->group->reduce_scatter_tensor(mine, whole, dist::ReduceOp::Avg)->wait(30s);
    EXPECT_EQ(mine.to_vector<float>(), ctx->rank == 0 ? (std::vector<float>{0.5f, 1}) : (std::vector<float>{2, 1.5f}));
    return;
  }
  TANDEM_NEED_GPUS(1);
  test::run_ranks(2);
}

// Two ranks, one GPU, Gloo with CUDA tensors: every collective goes through host copies.
TEST(GpuDdp, TwoRanksSharingTheGpuOverGlooEqualOneProcess) {
  if (auto ctx = test::child_rank()) {
    dist::DDPOptions opts;
    opts.reducer.bucket_cap_mb = 0.001;
    opts.reducer.first_bucket_cap_mb = 0.001;
    expect_ddp_equals_one_process(ctx->group, ctx->rank, ctx->world, opts, 2e-6, "gloo, cuda tensors");
    return;
  }
  TANDEM_NEED_GPUS(1);
  test::run_ranks(2);
}

TEST(GpuDdp, TwoRanksSharingTheGpuOverGlooBroadcastBuffersAndAgree) {
  if (auto ctx = test::child_rank()) {
    manual_seed(100 + ctx->rank);  // different initial weights: DDP must broadcast rank 0's
    auto model = std::make_shared<nn::models::MnistNet>();
    model->to(gpu());
    dist::DistributedDataParallel ddp(model, ctx->group);
    optim::Adadelta opt(ddp.parameters(), optim::AdadeltaOptions{1.0});
    Generator g(ctx->rank);
    for (int step = 0; step < 2; ++step) mnist_step(ddp, opt, g);
    for (auto& [name, p] : model->named_parameters()) {
      const auto all = dist::allgather_values(*ctx->group, p.to_vector<double>(), name);
      ASSERT_EQ(all[1], all[0]) << name;
    }
    return;
  }
  TANDEM_NEED_GPUS(1);
  test::run_ranks(2);
}

}  // namespace
}  // namespace tandem
