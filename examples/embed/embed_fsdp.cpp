// embed_fsdp: a program that trains its own model fully sharded, through Tandem's installed public
// API only: FullyShardedDataParallel over Gloo, one process per rank, one unit per residual block.
// Assumes: started by tandem-run (or torchrun), which sets RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; without RANK it trains alone (one rank
// holds every shard).
// Guarantees: exit 0 only when the loss fell to under half its first value on every rank, each rank
// held about 1/world of the parameters, and the full state dict gathered at the end is the same on
// every rank; otherwise it prints why and exits 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/fsdp.h"
#include "dist/store/env.h"
#include "dist/store/tcp_store.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "optim/optimizer.h"

using namespace tandem;

namespace {

constexpr int64_t kFeatures = 16, kWidth = 64, kClasses = 4, kSamples = 256;
constexpr int kSteps = 40;

// [fsdp-model]
// A residual block: the unit FSDP gathers, runs and frees as one.
class Block : public nn::Module {
 public:
  Block() {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(kWidth, kWidth));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(kWidth, kWidth));
  }
  Tensor forward(const Tensor& x) override { return F::add(x, fc2_->forward(F::relu(fc1_->forward(x)))); }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

class Net : public nn::Module {
 public:
  Net() {
    in_ = register_module("in", std::make_shared<nn::Linear>(kFeatures, kWidth));
    for (int i = 0; i < 3; ++i) {
      const std::string name = std::string("b").append(std::to_string(i));
      blocks_.push_back(register_module(name, std::make_shared<Block>()));
    }
    out_ = register_module("out", std::make_shared<nn::Linear>(kWidth, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu(in_->forward(x));
    for (auto& b : blocks_) h = b->forward(h);
    return F::log_softmax(out_->forward(h));
  }

 private:
  std::shared_ptr<nn::Linear> in_, out_;
  std::vector<std::shared_ptr<Block>> blocks_;
};
// [fsdp-model]

// Each rank its own samples x ~ U(-1, 1); the label is the quadrant of (x0 + x1, x2 - x3).
void make_data(uint64_t seed, Tensor& x, Tensor& y) {
  Generator gen(seed);
  x = Tensor::empty({kSamples, kFeatures});
  y = Tensor::empty({kSamples}, kInt64);
  float* xs = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) xs[i] = static_cast<float>(gen.uniform(-1, 1));
  for (int64_t i = 0; i < kSamples; ++i) {
    const float* r = xs + i * kFeatures;
    y.data<int64_t>()[i] = (r[0] + r[1] > 0 ? 1 : 0) + (r[2] - r[3] > 0 ? 2 : 0);
  }
}

int run() {
  const dist::DistEnv env = std::getenv("RANK") ? dist::env_from_launcher("pytorch") : dist::DistEnv{};
  const dist::Millis timeout(60'000);
  dist::TCPStoreOptions so;
  so.timeout = timeout;
  so.num_workers = env.world_size;
  auto store = std::make_shared<dist::TCPStore>(env.master_addr, env.master_port, env.rank == 0, so);
  auto group = dist::make_process_group("gloo", store, env.rank, env.world_size, timeout);

  // [fsdp-wrap]
  manual_seed(1000 + env.rank);  // FSDP starts every rank from rank 0's weights
  auto net = std::make_shared<Net>();
  dist::FSDPOptions options;
  options.sharding_strategy = dist::ShardingStrategy::FullShard;
  options.auto_wrap_policy.module_classes = {"Block"};  // one unit per Block; the rest is the root unit
  dist::FullyShardedDataParallel fsdp(net, group, options);
  // The optimizer steps on this rank's shards only; its state is sharded with them.
  optim::AdamW optimizer(fsdp.parameters(), optim::AdamOptions{.lr = 3e-3, .weight_decay = 0.01});
  // [fsdp-wrap]

  Tensor x, y;
  make_data(7 + env.rank, x, y);
  double first = 0, last = 0;
  // [fsdp-train]
  for (int step = 1; step <= kSteps; ++step) {
    optimizer.zero_grad();
    Tensor loss = F::nll_loss(fsdp.forward(x), y);
    loss.backward();               // each unit's gradients are reduce-scattered as they finish
    fsdp.clip_grad_norm_(1.0);     // the norm of the whole gradient, from the shards
    optimizer.step();
    last = loss.item<double>();
    if (step == 1) first = last;
  }
  const nn::NamedTensors full = fsdp.full_state_dict();  // the module's own names, gathered
  // [fsdp-train]
  std::printf("rank %d: loss %.4f -> %.4f, %zu units, shard %lld of %lld bytes\n", env.rank, first, last,
              fsdp.units().size(), static_cast<long long>(fsdp.memory().shard_bytes),
              static_cast<long long>(fsdp.memory().shard_bytes * env.world_size));
  bool ok = last < 0.5 * first;
  if (!ok) std::printf("rank %d: the loss did not fall to under half its first value\n", env.rank);
  int64_t numel = 0;
  for (const auto& u : fsdp.units()) numel += u.numel;
  if (fsdp.memory().shard_bytes > (numel / env.world_size + env.world_size) * 4) {
    std::printf("rank %d: holds %lld bytes of parameters, expected about 1/%d of %lld\n", env.rank,
                static_cast<long long>(fsdp.memory().shard_bytes), env.world_size, static_cast<long long>(numel * 4));
    ok = false;
  }
  for (const auto& [name, t] : full) {
    std::vector<Tensor> all;
    for (int r = 0; r < env.world_size; ++r) all.push_back(Tensor::empty(t.shape()));
    group->allgather(all, t.contiguous())->wait(timeout);
    for (int r = 1; r < env.world_size; ++r)
      if (std::memcmp(all[0].data<float>(), all[r].data<float>(), t.nbytes()) != 0) {
        std::printf("rank %d: %s differs between ranks 0 and %d\n", env.rank, name.c_str(), r);
        ok = false;
      }
  }
  group->barrier()->wait(timeout);  // rank 0 serves the store: leave together
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed_fsdp: %s\n", e.what());
  }
  return 1;
}
