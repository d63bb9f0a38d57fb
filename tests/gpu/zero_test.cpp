// ZeroRedundancyOptimizer over NCCL, as far as one GPU can show it: a one-rank NCCL group (every
// tensor handed to NCCL must live on the group's GPU, which NCCL enforces) with the parameters on
// the GPU (broadcast in place, and as bucket views), and with the parameters on the host (which
// cross to the GPU for the broadcast and back). After every step the parameters equal the unsharded
// optimizer's bit for bit, and the consolidated state dict equals its state dict. The multi-rank
// sharding itself is covered over Gloo (tests/dist/zero_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "core/random.h"
#include "dist/store/file_store.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/zero_redundancy_optimizer.h"
#include "gpu_test_util.h"
#include "optim/optimizer.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using gpu_test::gpu;

std::shared_ptr<dist::ProcessGroup> one_rank_nccl(const std::string& tag) {
  static int counter = 0;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tandem-gpu-zero-" + tag + "-" + std::to_string(getpid()) + "-" +
                             std::to_string(counter++)))
                               .string();
  auto store = std::make_shared<dist::FileStore>(path, 1, 30s);
  return dist::make_process_group("nccl", store, 0, 1, 30s, 0);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return ha.shape() == hb.shape() && ha.dtype() == hb.dtype() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

void expect_equals_unsharded(Device device, bool bucket_view, const std::string& tag) {
  const std::vector<Shape> shapes = {{64, 32}, {64}, {10, 64}, {10}};
  Generator gen(3);
  std::vector<Tensor> ps, ref;
  for (auto& s : shapes) {
    Tensor v = gpu_test::random_cpu(s, gen).to(device);
    ps.push_back(v.clone().set_requires_grad(true));
    ref.push_back(v.clone().set_requires_grad(true));
  }
  optim::AdamOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.01;
  dist::ZeroOptions zo;
  zo.parameters_as_bucket_view = bucket_view;
  auto zero = dist::make_zero_optimizer<optim::AdamW>(ps, one_rank_nccl(tag), o, zo);
  optim::AdamW plain(ref, o);
  for (int step = 0; step < 5; ++step) {
    for (size_t k = 0; k < ps.size(); ++k) {
      Tensor g = gpu_test::random_cpu(shapes[k], gen).to(device);
      ps[k].set_grad(g.clone());
      ref[k].set_grad(g.clone());
    }
    zero->step();
    plain.step();
    for (size_t k = 0; k < ps.size(); ++k)
      ASSERT_TRUE(same_bits(ps[k], ref[k])) << tag << ": parameter " << k << " differs after step " << step;
  }
  EXPECT_EQ(zero->state_bytes(), plain.state_bytes());
  zero->consolidate_state_dict(0);
  const auto got = zero->state_dict(), want = plain.state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (auto& [key, t] : want) {
    ASSERT_TRUE(got.count(key)) << tag << ": missing " << key;
    EXPECT_TRUE(same_bits(got.at(key), t)) << tag << ": " << key;
  }
}

TEST(GpuZero, OneRankNcclParametersOnTheGpu) {
  TANDEM_NEED_GPUS(1);
  expect_equals_unsharded(gpu(), /*bucket_view=*/false, "in-place");
  expect_equals_unsharded(gpu(), /*bucket_view=*/true, "bucket-view");
}

TEST(GpuZero, OneRankNcclParametersOnTheHost) {
  TANDEM_NEED_GPUS(1);
  expect_equals_unsharded(Device::cpu(), /*bucket_view=*/false, "host");
}

TEST(GpuZero, BucketViewNeedsTheGroupsDevice) {
  TANDEM_NEED_GPUS(1);
  std::vector<Tensor> ps = {Tensor::zeros({4}).set_requires_grad(true)};
  dist::ZeroOptions zo;
  zo.parameters_as_bucket_view = true;
  try {
    dist::make_zero_optimizer<optim::SGD>(ps, one_rank_nccl("wrong-device"), optim::SGDOptions{}, zo);
    FAIL() << "host parameters as bucket views over NCCL did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("on the nccl group's device (cuda:0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
