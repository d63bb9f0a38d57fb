// How often one training step blocks the host on cuda:0 (tandem::cuda::host_sync_count, which
// every synchronisation of the engine goes through) and uploads from it (host_upload_count).
// After a warm-up step (cuDNN's algorithm choice, the allocator's first blocks, the optimizer's
// state, the cached causal mask, the GPT's position ids), a step whose inputs are already on the
// device must do neither: 0 synchronisations and 0 uploads until the caller reads the loss, and
// exactly 1 synchronisation for that read. Steps: the MNIST trainer's model (MnistNet, nll_loss,
// Adadelta) and the GPT example's model (embeddings, causal MultiheadAttention, cross_entropy,
// AdamW, clip_grad_norm_ on the device). Bad indices found by CUDA kernels (embedding,
// cross_entropy) are reported at that read, as nll_loss's targets are.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "nn/functional.h"
#include "nn/losses.h"
#include "nn/models/mnist_net.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "train/models/gpt.h"

using namespace tandem;
using namespace tandem::gpu_test;

namespace {

struct Counts {
  uint64_t syncs = 0, uploads = 0;
};

Counts now() { return {cuda::host_sync_count(), cuda::host_upload_count()}; }

Counts since(const Counts& start) {
  const Counts c = now();
  return {c.syncs - start.syncs, c.uploads - start.uploads};
}

Tensor labels(int64_t n, int64_t classes, Generator& gen, Shape shape) {
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = static_cast<int64_t>(gen.below(static_cast<uint64_t>(classes)));
  return Tensor::from_vector(v, std::move(shape)).to(gpu());
}

// Runs the warm-up step and the counted one; returns the counted step's loss, unread.
void expect_step_stays_on_device(const std::function<Tensor()>& step) {
  (void)step().item<double>();  // warm-up, read: everything made once is made now
  synchronize(gpu());
  const Counts start = now();
  const Tensor loss = step();
  const Counts during = since(start);
  EXPECT_EQ(during.syncs, 0u) << "host synchronisations in a step that reads nothing";
  EXPECT_EQ(during.uploads, 0u) << "host-to-device copies in a step whose inputs are on the device";
  const double value = loss.item<double>();
  EXPECT_EQ(since(start).syncs, 1u) << "reading the loss must be the step's one synchronisation";
  EXPECT_TRUE(std::isfinite(value)) << value;
}

gpt::Config small_gpt() {
  gpt::Config c;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

}  // namespace

TEST(HostSync, MnistStepWithAdadeltaWaitsOnlyWhenTheLossIsRead) {
  TANDEM_NEED_GPUS(1);
  set_cuda_device(0);
  Generator gen(3);
  nn::models::MnistNet net;
  net.to(gpu());
  net.train();
  optim::Adadelta opt(net.parameters(), optim::AdadeltaOptions{});
  const Tensor x = random_cpu({8, 1, 28, 28}, gen).to(gpu());
  const Tensor y = labels(8, 10, gen, {8});
  expect_step_stays_on_device([&] {
    opt.zero_grad();
    Tensor loss = F::nll_loss(net.forward(x), y);
    loss.backward();
    opt.step();
    return loss;
  });
  EXPECT_EQ(net.n1->num_batches_tracked.item<int64_t>(), 2);  // counted on the device, both steps
}

TEST(HostSync, GptStepWithAdamWAndClippingWaitsOnlyWhenTheLossIsRead) {
  TANDEM_NEED_GPUS(1);
  set_cuda_device(0);
  Generator gen(4);
  const gpt::Config c = small_gpt();
  gpt::GPT net(c);
  net.to(gpu());
  net.train();
  optim::AdamW opt(net.parameters(), optim::AdamOptions{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99});
  const int64_t B = 4, T = c.block_size;
  const Tensor idx = labels(B * T, c.vocab_size, gen, {B, T});
  const Tensor target = labels(B * T, c.vocab_size, gen, {B * T});
  expect_step_stays_on_device([&] {
    opt.zero_grad();
    Tensor loss = F::cross_entropy(F::reshape(net.forward(idx), {-1, c.vocab_size}), target);
    loss.backward();
    optim::clip_grad_norm_(net.parameters(), 1.0);  // the device way: its norm stays unread
    opt.step();
    return loss;
  });
}

TEST(HostSync, BadTokenOrTargetIsReportedAtTheNextRead) {
  TANDEM_NEED_GPUS(1);
  set_cuda_device(0);
  Generator gen(5);
  const Tensor weight = random_cpu({5, 3}, gen).to(gpu());
  const Tensor bad_idx = Tensor::from_vector<int64_t>({1, 7, 2}, {3}).to(gpu());
  const Counts start = now();
  const Tensor e = F::embedding(bad_idx, weight);
  EXPECT_EQ(since(start).syncs, 0u);
  EXPECT_TRUE(throws_with([&] { e.to(Device::cpu()); }, {"index_select: index 7 at position 1", "size 5", "cuda:0"}));
  EXPECT_EQ(F::embedding(Tensor::from_vector<int64_t>({4}, {1}).to(gpu()), weight).to(Device::cpu()).numel(), 3);

  const Tensor logits = random_cpu({3, 4}, gen).to(gpu());
  const Tensor bad_target = Tensor::from_vector<int64_t>({0, -100, 9}, {3}).to(gpu());
  const Tensor loss = F::cross_entropy(logits, bad_target);  // -100 is ignore_index: fine
  EXPECT_TRUE(throws_with([&] { loss.item<double>(); }, {"nll_loss (cross_entropy's too): target 9", "row 2", "[0, 4)"}));
  const Tensor ok = F::cross_entropy(logits, Tensor::from_vector<int64_t>({0, -100, 3}, {3}).to(gpu()));
  EXPECT_TRUE(std::isfinite(ok.item<double>()));
}
