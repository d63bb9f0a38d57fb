// The per-thread cuDNN/cuBLAS handles of kernels/cuda/handles.cpp: kernels called from several host
// threads at once (and from threads that have ended, whose handles are reused) give the same
// results as on the main thread, all ordered on the one compute stream.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/conv.h"
#include "kernels/linear.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;

TEST(CudaThreads, KernelsFromSeveralThreadsMatchTheMainThread) {
  TANDEM_NEED_GPUS(1);
  Generator gen(1);
  const Tensor x = random_cpu({8, 3, 12, 12}, gen).to(gpu());
  const Tensor w = random_cpu({4, 3, 3, 3}, gen).to(gpu());
  const Tensor a = random_cpu({16, 40}, gen).to(gpu());
  const Tensor fw = random_cpu({10, 40}, gen).to(gpu());
  const Tensor conv_ref = kc::conv2d_forward(x, w, Tensor(), {}).to(Device::cpu());
  const Tensor lin_ref = kc::linear_forward(a, fw, Tensor()).to(Device::cpu());
  for (int round = 0; round < 2; ++round) {  // the second round reuses the ended threads' handles
    std::vector<Tensor> conv_out(4), lin_out(4);
    std::vector<std::string> errors(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        try {
          conv_out[t] = kc::conv2d_forward(x, w, Tensor(), {}).to(Device::cpu());
          lin_out[t] = kc::linear_forward(a, fw, Tensor()).to(Device::cpu());
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 4; ++t) {
      ASSERT_EQ(errors[t], "") << "round " << round << " thread " << t;
      EXPECT_TRUE(same(conv_out[t], conv_ref)) << "round " << round << " thread " << t;
      EXPECT_TRUE(same(lin_out[t], lin_ref)) << "round " << round << " thread " << t;
    }
  }
}

#endif  // TANDEM_WITH_CUDA
