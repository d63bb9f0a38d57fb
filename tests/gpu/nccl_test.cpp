// ProcessGroupNccl on real GPUs: a one-GPU communicator (collective results, ordering against the
// compute stream, async issue and in-order waits, input checks, the abort of an initialisation
// whose peer never comes), and with two or more GPUs one rank per GPU as threads of this process.
// Every GPU test skips when no device is visible; in a build without CUDA one test checks that
// the class fails clearly instead.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "dist/store/file_store.h"
#include "dist/group/process_group_factory.h"
#include "dist/group/process_group_nccl.h"
#include "common/require_gpu.h"

namespace tandem::dist {
namespace {

using namespace std::chrono_literals;

std::string fresh_store_path(const std::string& tag) {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("tandem-nccl-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++)))
      .string();
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no tandem::Error thrown>";
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

#ifndef TANDEM_WITH_CUDA
TEST(NcclGroup, BuildWithoutCudaFailsClearly) {
  auto store = std::make_shared<FileStore>(fresh_store_path("nocuda"), 1, 1s);
  const std::string msg = error_of([&] { ProcessGroupNccl pg(store, 0, 1, 1s, 0); });
  EXPECT_TRUE(contains(msg, "built without CUDA")) << msg;
}
#endif

TEST(NcclGroup, OneGpuCollectives) {
  TANDEM_NEED_GPUS(1);
  const Device gpu = Device::cuda(0);
  auto store = std::make_shared<FileStore>(fresh_store_path("one"), 1, 30s);
  ProcessGroupNccl pg(store, 0, 1, 30s, 0);
  EXPECT_EQ(pg.backend(), "nccl");
  EXPECT_EQ(pg.device(), 0);

  // allreduce over one rank leaves the values; every supported dtype and op goes through NCCL.
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5}, {5}).to(dt).to(gpu);
      auto work = pg.allreduce(t, op);
      work->wait(30s);  // orders the compute stream; the host copy below synchronises
      EXPECT_EQ(t.to(Device::cpu()).to(kFloat32).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5}))
          << dtype_name(dt) << " " << work->description();
      EXPECT_TRUE(work->is_completed()) << work->description();
    }

  // Ordering: the input is written by the compute stream just before the allgather, and the
  // output is read by the compute stream just after the wait; 4M elements make a race visible.
  const int64_t n = int64_t{1} << 22;
  Tensor in = Tensor::zeros({n}, kFloat32, gpu);
  in.fill_(3.0);
  std::vector<Tensor> outs = {Tensor::zeros({n}, kFloat32, gpu)};
  auto gathered = pg.allgather(outs, in);
  gathered->wait(30s);
  outs[0].add_(Tensor::ones({n}, kFloat32, gpu));
  const std::vector<float> host = outs[0].to(Device::cpu()).to_vector<float>();
  for (int64_t i = 0; i < n; i += 4093) ASSERT_EQ(host[i], 4.0f) << "index " << i;
  ASSERT_EQ(host[n - 1], 4.0f);

  Tensor b = Tensor::from_vector<int64_t>({7, -8, 9}, {3}).to(gpu);
  pg.broadcast(b, 0)->wait(30s);
  EXPECT_EQ(b.to(Device::cpu()).to_vector<int64_t>(), (std::vector<int64_t>{7, -8, 9}));
  auto bar = pg.barrier();
  bar->wait(30s);
  EXPECT_TRUE(bar->is_completed());

  // Twenty collectives issued at once, waited in order; one stream runs them in issue order.
  std::vector<Tensor> ts;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 20; ++k) {
    ts.push_back(Tensor::full({1 + k * 10000}, k + 0.5, kFloat32, gpu));
    works.push_back(pg.allreduce(ts.back()));
  }
  for (int k = 0; k < 20; ++k) {
    // wait() orders the compute stream after the collective without blocking the host (as
    // PyTorch's NCCL work), so completion is only certain once the copy to the host has synchronised.
    works[k]->wait(30s);
    const std::vector<float> v = ts[k].to(Device::cpu()).to_vector<float>();
    for (int j = 0; j <= k; ++j) EXPECT_TRUE(works[j]->is_completed()) << j << " after " << k;
    EXPECT_EQ(v.front(), k + 0.5f);
    EXPECT_EQ(v.back(), k + 0.5f);
  }

  // Input checks.
  Tensor cpu = Tensor::ones({4});
  EXPECT_TRUE(contains(error_of([&] { pg.allreduce(cpu); }), "cuda:0"))
      << error_of([&] { pg.allreduce(cpu); });
  Tensor strided = Tensor::zeros({3, 4}, kFloat32, gpu).transpose(0, 1);
  EXPECT_TRUE(contains(error_of([&] { pg.allreduce(strided); }), "not contiguous"));
  Tensor ok = Tensor::ones({4}, kFloat32, gpu);
  EXPECT_TRUE(contains(error_of([&] { pg.broadcast(ok, 1); }), "root 1 outside"));
  std::vector<Tensor> two = {Tensor::ones({4}, kFloat32, gpu), Tensor::ones({4}, kFloat32, gpu)};
  EXPECT_TRUE(contains(error_of([&] { pg.allgather(two, ok); }), "expected one per rank"));
}

// The collectives of sharding on one rank: all_gather_into_tensor copies, reduce_scatter_tensor
// reduces one rank (Avg divides by 1), both ordered against the compute stream as allgather is.
TEST(NcclGroup, OneGpuShardingCollectives) {
  TANDEM_NEED_GPUS(1);
  const Device gpu = Device::cuda(0);
  auto store = std::make_shared<FileStore>(fresh_store_path("shard"), 1, 30s);
  ProcessGroupNccl pg(store, 0, 1, 30s, 0);
  const int64_t n = (int64_t{1} << 22) + 3;
  Tensor in = Tensor::zeros({n}, kFloat32, gpu);
  in.fill_(2.5);
  Tensor out = Tensor::zeros({1, n}, kFloat32, gpu);
  pg.all_gather_into_tensor(out, in)->wait(30s);
  out.add_(Tensor::ones({1, n}, kFloat32, gpu));
  std::vector<float> host = out.to(Device::cpu()).to_vector<float>();
  for (int64_t i = 0; i < n; i += 4093) ASSERT_EQ(host[i], 3.5f) << "index " << i;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    Tensor r = Tensor::zeros({n}, kFloat32, gpu);
    pg.reduce_scatter_tensor(r, in, op)->wait(30s);
    host = r.to(Device::cpu()).to_vector<float>();
    EXPECT_EQ(host.front(), 2.5f) << reduce_op_name(op);
    EXPECT_EQ(host.back(), 2.5f) << reduce_op_name(op);
  }
  // allreduce's Avg over the same odd count: every element, the tail included (NCCL's one-rank Avg
  // kernel before 2.29.7 left the last elements unwritten).
  for (DType dt : {kFloat32, kBFloat16}) {
    Tensor a = in.to(dt);
    pg.allreduce(a, ReduceOp::Avg)->wait(30s);
    host = a.to(Device::cpu()).to(kFloat32).to_vector<float>();
    for (int64_t i = n - 40; i < n; ++i) ASSERT_EQ(host[i], 2.5f) << dtype_name(dt) << " index " << i;
  }
  Tensor wrong = Tensor::zeros({n + 1}, kFloat32, gpu);
  EXPECT_TRUE(contains(error_of([&] { pg.all_gather_into_tensor(wrong, in); }), "output has"));
  Tensor cpu_out = Tensor::zeros({n});
  EXPECT_TRUE(contains(error_of([&] { pg.reduce_scatter_tensor(cpu_out, in); }), "cuda:0"));
}

TEST(NcclGroup, FactoryMakesAnNcclGroup) {
  TANDEM_NEED_GPUS(1);
  auto store = std::make_shared<FileStore>(fresh_store_path("factory"), 1, 30s);
  auto pg = make_process_group("nccl", store, 0, 1, 30s, 0);
  EXPECT_EQ(pg->backend(), "nccl");
  Tensor t = Tensor::full({3}, 2.0, kFloat32, Device::cuda(0));
  pg->allreduce(t)->wait(30s);
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(NcclGroup, MissingRankAbortsTheInitialisationAfterTheTimeout) {
  TANDEM_NEED_GPUS(1);
  const std::string path = fresh_store_path("missing");
  auto store = std::make_shared<FileStore>(path, -1, 30s);
  // Rank 0 of 2 publishes the id; rank 1 never comes.
  const std::string msg = error_of([&] { ProcessGroupNccl pg(store, 0, 2, 3s, 0); });
  EXPECT_TRUE(contains(msg, "ncclCommInitRank") && contains(msg, "3000 ms")) << msg;
  store.reset();
  std::filesystem::remove(path);
}

TEST(NcclGroup, OneRankPerGpuAsThreads) {
  TANDEM_NEED_GPUS(2);
  const int gpus = cuda_device_count();
  const int n = std::min(gpus, 4);
  auto store = std::make_shared<FileStore>(fresh_store_path("multi"), 1, 60s);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        const Device gpu = Device::cuda(r);
        ProcessGroupNccl pg(store, r, n, 60s, r);
        const int64_t len = (int64_t{1} << 20) + 3;
        Tensor t = Tensor::full({len}, r + 1.0, kFloat32, gpu);
        pg.allreduce(t, ReduceOp::Sum)->wait(60s);
        const std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
        const float want = n * (n + 1) / 2.0f;
        if (v.front() != want || v.back() != want) errors[r] += "allreduce sum wrong; ";
        Tensor m = Tensor::from_vector<double>({double(r), -double(r)}, {2}).to(gpu);
        pg.allreduce(m, ReduceOp::Max)->wait(60s);
        if (m.to(Device::cpu()).to_vector<double>() != std::vector<double>{n - 1.0, 0.0})
          errors[r] += "max wrong; ";
        Tensor b = Tensor::full({5}, r, kInt64, gpu);
        pg.broadcast(b, n - 1)->wait(60s);
        if (b.to(Device::cpu()).to_vector<int64_t>() != std::vector<int64_t>(5, n - 1))
          errors[r] += "broadcast wrong; ";
        Tensor in = Tensor::full({2, 3}, 10.0 * r, kFloat32, gpu);
        std::vector<Tensor> outs;
        for (int k = 0; k < n; ++k) outs.push_back(Tensor::zeros({2, 3}, kFloat32, gpu));
        pg.allgather(outs, in)->wait(60s);
        for (int k = 0; k < n; ++k)
          if (outs[k].to(Device::cpu()).to_vector<float>() != std::vector<float>(6, 10.0f * k))
            errors[r] += "allgather slot " + std::to_string(k) + " wrong; ";
        Tensor flat = Tensor::zeros({6 * n}, kFloat32, gpu);
        pg.all_gather_into_tensor(flat, in)->wait(60s);
        const std::vector<float> f = flat.to(Device::cpu()).to_vector<float>();
        for (int k = 0; k < n; ++k)
          if (f[6 * k + 5] != 10.0f * k) errors[r] += "all_gather_into_tensor part " + std::to_string(k) + " wrong; ";
        Tensor whole = Tensor::full({3 * n}, r + 1.0, kFloat32, gpu), mine = Tensor::zeros({3}, kFloat32, gpu);
        pg.reduce_scatter_tensor(mine, whole, ReduceOp::Avg)->wait(60s);
        if (mine.to(Device::cpu()).to_vector<float>() != std::vector<float>(3, (n + 1) / 2.0f))
          errors[r] += "reduce_scatter_tensor avg wrong; ";
        pg.barrier()->wait(60s);
      } catch (const std::exception& e) {
        errors[r] += e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace tandem::dist
