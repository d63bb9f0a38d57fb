// The model, batches and optimizers FSDP's tests share (tests/dist/fsdp*_test.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/ranks.h"
#include "core/random.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/fsdp.h"
#include "dist/store/prefix_store.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "optim/optimizer.h"

namespace tandem::test::fsdp {

constexpr int kSteps = 6;

class Block : public nn::Module {
 public:
  explicit Block(int64_t d) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(d, 2 * d));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(2 * d, d));
  }
  Tensor forward(const Tensor& x) override { return F::add(x, fc2->forward(F::relu(fc1->forward(x)))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// 13 -> d (16), two residual blocks, d -> 5: 7 parameter tensors in the blocks, 4 outside.
class Net : public nn::Module {
 public:
  explicit Net(int64_t d = 16) {
    in = register_module("in", std::make_shared<nn::Linear>(13, d));
    b0 = register_module("b0", std::make_shared<Block>(d));
    b1 = register_module("b1", std::make_shared<Block>(d));
    out = register_module("out", std::make_shared<nn::Linear>(d, 5));
  }
  Tensor forward(const Tensor& x) override {
    return F::log_softmax(out->forward(b1->forward(b0->forward(F::relu(in->forward(x))))));
  }
  std::shared_ptr<nn::Linear> in, out;
  std::shared_ptr<Block> b0, b1;
};

struct Batch {
  Tensor x, y;
};

// Rank `rank`'s micro-batch `m` of step `s` (the same on every run).
inline Batch batch(int s, int m, int rank) {
  Generator g(1000 + 97 * s + 13 * m + rank);
  Batch b{Tensor::empty({6, 13}), Tensor::empty({6}, kInt64)};
  for (int64_t i = 0; i < b.x.numel(); ++i) b.x.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  for (int64_t i = 0; i < 6; ++i) b.y.data<int64_t>()[i] = static_cast<int64_t>(g.uniform(0, 5)) % 5;
  return b;
}

inline std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& kind, std::vector<Tensor> params) {
  if (kind == "adamw") return std::make_unique<optim::AdamW>(params, optim::AdamOptions{0.01, 0.9, 0.99, 1e-8, 0.05});
  return std::make_unique<optim::SGD>(params, optim::SGDOptions{0.1, 0.9, 0.0, 0.01});
}

// The largest elementwise difference of two float32 state dicts with the same names.
inline double max_diff(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  double worst = 0;
  for (auto& [n, t] : a) {
    const Tensor& u = b.at(n);
    for (int64_t i = 0; i < t.numel(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(t.data<float>()[i] - u.data<float>()[i])));
  }
  return worst;
}

// The wrapper's groups: the job's, or under HYBRID_SHARD "nodes" of 2 ranks.
// Prefixes start with `tag`, distinct for each wrapper a test makes.
inline std::shared_ptr<dist::ProcessGroup> groups(const RankContext& ctx, const std::string& strategy,
                                                  dist::FSDPOptions& o, const std::string& tag) {
  o.sharding_strategy = dist::parse_sharding_strategy(strategy);
  if (strategy != "HYBRID_SHARD") return ctx.group;
  const int node = ctx.rank / 2, local = ctx.rank % 2;
  auto in_node = std::make_shared<dist::PrefixStore>(tag + "/node" + std::to_string(node) + "/", ctx.store);
  auto across = std::make_shared<dist::PrefixStore>(tag + "/local" + std::to_string(local) + "/", ctx.store);
  o.replicate_group = dist::make_process_group("gloo", across, node, ctx.world / 2, std::chrono::seconds(30));
  return dist::make_process_group("gloo", in_node, local, 2, std::chrono::seconds(30));
}

}  // namespace tandem::test::fsdp
