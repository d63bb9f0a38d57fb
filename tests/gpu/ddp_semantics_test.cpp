// DDP's semantics on the GPU (tests/dist/ddp_semantics_test.cpp proves them against PyTorch over
// Gloo on CPUs): over a one-rank NCCL group, a parameter nothing used keeps .grad undefined and is
// not moved by momentum or weight decay, static_graph walks no graph; PowerSGD on CUDA tensors
// over NCCL gives what it gives on the host over Gloo; and two ranks sharing the GPU over Gloo with
// CUDA tensors finish uneven inputs under Join with equal replicas.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "common/ranks.h"
#include "core/autograd.h"
#include "core/random.h"
#include "dist/parallel/ddp.h"
#include "dist/store/file_store.h"
#include "dist/group/host_values.h"
#include "dist/parallel/join.h"
#include "dist/parallel/powersgd.h"
#include "dist/group/process_group_factory.h"
#include "gpu_test_util.h"
#include "nn/nn.h"
#include "optim/optimizer.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using gpu_test::gpu;

class Branchy : public nn::Module {
 public:
  Branchy() {
    a = register_module("a", std::make_shared<nn::Linear>(6, 16));
    b = register_module("b", std::make_shared<nn::Linear>(16, 3));
    never = register_module("never", std::make_shared<nn::Linear>(16, 3));
  }
  Tensor forward(const Tensor& x) override { return (*b)(F::relu((*a)(x))); }
  std::shared_ptr<nn::Linear> a, b, never;
};

std::shared_ptr<dist::ProcessGroup> one_rank(const std::string& backend, const std::string& tag) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem-gpu-sem-" + tag + "-" + std::to_string(getpid()));
  auto store = std::make_shared<dist::FileStore>(path.string(), 1, 30s);
  return dist::make_process_group(backend, store, 0, 1, 30s, 0);
}

Tensor inputs(int step, Device device) {
  Generator g(40 + step);
  return gpu_test::random_cpu({4, 6}, g).to(device);
}

TEST(GpuDdpSemantics, OneRankNcclLeavesUnusedParametersAloneAndStaticGraphWalksNoGraph) {
  TANDEM_NEED_GPUS(1);
  for (const bool static_graph : {false, true}) {
    manual_seed(5);
    auto model = std::make_shared<Branchy>();
    model->to(gpu());
    const auto never_before = model->never->weight.to_vector<float>();
    dist::DDPOptions opts;
    opts.reducer.find_unused_parameters = true;
    opts.reducer.static_graph = static_graph;
    dist::DistributedDataParallel ddp(model, one_rank("nccl", static_graph ? "static" : "dynamic"), opts);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
    for (int s = 0; s < 4; ++s) {
      opt.zero_grad();
      F::sum(ddp(inputs(s, gpu()))).backward();
      EXPECT_FALSE(model->never->weight.grad().defined()) << "step " << s;
      EXPECT_TRUE(model->a->weight.grad().defined()) << "step " << s;
      opt.step();
    }
    EXPECT_EQ(model->never->weight.to_vector<float>(), never_before);
    EXPECT_EQ(ddp.reducer().stats().graph_walks, static_graph ? 0 : 4);
    EXPECT_EQ(ddp.reducer().stats().rebuilds, static_graph ? 1 : 0);
  }
}

// The same bucket through PowerSGD on the host over Gloo and on the GPU over NCCL (one rank each).
TEST(GpuDdpSemantics, PowerSgdOverNcclMatchesTheHostOverGloo) {
  TANDEM_NEED_GPUS(1);
  std::map<std::string, std::vector<float>> results;
  for (const std::string backend : {"gloo", "nccl"}) {
    const Device device = backend == "nccl" ? gpu() : Device::cpu();
    auto group = one_rank(backend, "powersgd-" + backend);
    Generator g(3);
    Tensor values = gpu_test::random_cpu({40 * 24 + 24}, g);
    dist::GradBucket bucket;
    bucket.buffer = values.to(device).clone();
    bucket.gradients = {bucket.buffer.slice(0, 0, 40 * 24).view({40, 24}), bucket.buffer.slice(0, 40 * 24, 40 * 24 + 24)};
    bucket.is_last = true;
    dist::PowerSGDState state({.rank = 2, .start_iter = 0});
    for (int it = 0; it < 2; ++it) {  // the second iteration warm-starts and feeds the error back
      bucket.buffer.copy_(values.to(device));
      dist::powersgd(state, *group, bucket)->wait(30s);
    }
    results[backend] = bucket.buffer.to(Device::cpu()).to_vector<float>();
    EXPECT_TRUE(state.error[0].device() == device) << backend;
  }
  ASSERT_EQ(results["gloo"].size(), results["nccl"].size());
  for (size_t k = 0; k < results["gloo"].size(); ++k) ASSERT_NEAR(results["nccl"][k], results["gloo"][k], 1e-5) << k;
}

TEST(GpuDdpSemantics, TwoRanksSharingTheGpuOverGlooFinishUnevenInputsUnderJoin) {
  if (auto ctx = test::child_rank()) {
    manual_seed(6);
    auto model = std::make_shared<Branchy>();
    model->to(gpu());
    dist::DDPOptions opts;
    opts.reducer.find_unused_parameters = true;
    dist::DistributedDataParallel ddp(model, ctx->group, opts);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    dist::Join join(ddp);
    for (int s = 0; s < (ctx->rank == 0 ? 4 : 1); ++s) {
      opt.zero_grad();
      F::sum(ddp(inputs(10 * ctx->rank + s, gpu()))).backward();
      opt.step();
    }
    EXPECT_EQ(join.join(), ctx->rank == 0 ? 0 : 3);
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
