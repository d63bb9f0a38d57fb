// embed_ddp: a program that embeds Tandem through its installed public API only. It defines its own
// model (a 2-layer MLP), makes a synthetic classification task, and trains it data-parallel with
// DistributedDataParallel over Gloo, one process per rank.
// Assumes: started by tandem-run (or torchrun), which sets RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; without RANK it trains alone, no DDP.
// Guarantees: exit 0 only when the loss fell to under half its first value on every rank and, after
// the last step, every rank holds bit-identical parameters (checked with an allgather); otherwise
// it prints why and exits 1. Each rank starts from different random weights on purpose: DDP's
// constructor broadcasts rank 0's, which is what makes the final check meaningful.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "dist/parallel/ddp.h"
#include "dist/store/env.h"
#include "dist/group/process_group_factory.h"
#include "dist/store/tcp_store.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "optim/optimizer.h"

using namespace tandem;
// F is tandem::F, the alias nn/functional.h declares for tandem::nn::functional.

namespace {

constexpr int64_t kFeatures = 16, kHidden = 32, kClasses = 4;
constexpr int64_t kSamplesPerRank = 256;
constexpr int kSteps = 40;

// [embed-model]
// A model is a Module that registers its parameters (here through child modules) and defines
// forward(); state_dict names follow the registration: fc1.weight, fc1.bias, fc2.weight, fc2.bias.
class Mlp : public nn::Module {
 public:
  Mlp() {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(kFeatures, kHidden));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    return F::log_softmax(fc2_->forward(F::relu(fc1_->forward(x))));
  }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};
// [embed-model]

// [embed-data]
// Synthetic data: x ~ N(0, 1), label = argmax of x through a fixed random "teacher" matrix (the same
// on every rank); each rank draws its own samples, as a DistributedSampler shard would give it.
struct Batch {
  Tensor x, y;
};
Batch make_data(uint64_t seed, int64_t n) {
  Generator teacher_gen(42), gen(seed);
  std::vector<float> teacher(kFeatures * kClasses), xs(n * kFeatures);
  for (auto& w : teacher) w = static_cast<float>(teacher_gen.normal());
  for (auto& v : xs) v = static_cast<float>(gen.normal());
  std::vector<int64_t> ys(n);
  for (int64_t i = 0; i < n; ++i) {
    double best = -1e30;
    for (int64_t c = 0; c < kClasses; ++c) {
      double score = 0;
      for (int64_t f = 0; f < kFeatures; ++f) score += xs[i * kFeatures + f] * teacher[f * kClasses + c];
      if (score > best) best = score, ys[i] = c;
    }
  }
  return {Tensor::from_vector(xs, {n, kFeatures}), Tensor::from_vector(ys, {n})};
}
// [embed-data]

// [embed-check]
// True when every rank's copy of every parameter equals rank 0's, bit for bit.
bool parameters_equal_across_ranks(nn::Module& model, dist::ProcessGroup& group, dist::Millis timeout) {
  bool equal = true;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor local = p.detach().contiguous();
    std::vector<Tensor> all;
    for (int r = 0; r < group.size(); ++r) all.push_back(Tensor::empty(local.shape()));
    group.allgather(all, local)->wait(timeout);
    for (int r = 1; r < group.size(); ++r) {
      if (std::memcmp(all[0].data<float>(), all[r].data<float>(), sizeof(float) * local.numel()) != 0) {
        std::printf("rank %d: parameter %s differs between rank 0 and rank %d\n", group.rank(), name.c_str(),
                    r);
        equal = false;
      }
    }
  }
  return equal;
}
// [embed-check]

int run() {
  // [embed-ddp]
  const bool launched = std::getenv("RANK") != nullptr;
  const dist::DistEnv env = launched ? dist::env_from_launcher("pytorch") : dist::DistEnv{};
  const dist::Millis timeout(60'000);  // every rendezvous and collective wait is bounded

  manual_seed(1000 + env.rank);  // different initial weights per rank; DDP broadcasts rank 0's
  auto net = std::make_shared<Mlp>();

  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> group;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (env.world_size > 1) {
    dist::TCPStoreOptions so;
    so.timeout = timeout;
    so.num_workers = env.world_size;
    store = std::make_shared<dist::TCPStore>(env.master_addr, env.master_port, env.rank == 0, so);
    group = dist::make_process_group("gloo", store, env.rank, env.world_size, timeout);
    ddp = std::make_unique<dist::DistributedDataParallel>(net, group);
  }
  nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;
  // [embed-ddp]

  // [embed-train]
  const Batch data = make_data(/*seed=*/7 + env.rank, kSamplesPerRank);
  optim::SGD optimizer(model.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  double first_loss = 0, loss_value = 0;
  for (int step = 1; step <= kSteps; ++step) {
    Tensor loss = F::nll_loss(model(data.x), data.y);
    optimizer.zero_grad();
    loss.backward();  // with DDP: gradients are averaged across ranks during backward
    optimizer.step();
    loss_value = loss.item<double>();
    if (step == 1) first_loss = loss_value;
    if (step == 1 || step % 10 == 0) std::printf("rank %d step %2d loss %.4f\n", env.rank, step, loss_value);
  }
  // [embed-train]

  bool ok = true;
  if (!(loss_value < 0.5 * first_loss)) {
    std::printf("rank %d: loss did not fall enough: %.4f -> %.4f (expected under half)\n", env.rank,
                first_loss, loss_value);
    ok = false;
  }
  if (group) {
    const bool equal = parameters_equal_across_ranks(*net, *group, timeout);
    if (equal) std::printf("rank %d: parameters identical on all %d ranks\n", env.rank, env.world_size);
    ok = ok && equal;
    group->barrier()->wait(timeout);  // rank 0 serves the store: leave together
  }
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const tandem::Error& e) {  // the engine's errors say what was wrong and what was expected
    std::fprintf(stderr, "embed_ddp: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed_ddp: %s\n", e.what());
  }
  return 1;
}
