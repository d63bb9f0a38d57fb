// ZeroRedundancyOptimizer (dist/parallel/zero_redundancy_optimizer.h) against the unsharded optimizer it
// wraps, as real processes over Gloo (common/ranks.h). Every rank draws every rank's gradients
// from fixed seeds and averages them by hand in rank order, so all ranks hold the same averaged
// gradient (what DDP gives); it steps the sharded optimizer on the parameters and the unsharded
// one on a copy, and after every step the two must be equal bit for bit (the same kernels on the
// same values). Covered: SGD with momentum, dampening and weight decay, Adam and AdamW with weight
// decay, two param groups with their own lrs under a StepLR schedule, parameters that have no
// gradient on some steps (skipped by both) or on every step, 2 and 3 ranks, the per-parameter and
// the bucket-view broadcasts, a rank that owns nothing, the consolidated state dict against the
// unsharded one, load_state_dict round trips (a sharded run resumed from the unsharded state, an
// unsharded run resumed from the consolidated state), the state bytes adding up to the unsharded
// optimizer's, and the errors for bad input. The partition is checked against PyTorch's own
// (tests/fixtures/zero_partition.json, made by tests/fixtures/make_zero_fixtures.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/ranks.h"
#include "common/test_util.h"
#include "core/random.h"
#include "dist/group/host_values.h"
#include "dist/parallel/zero_redundancy_optimizer.h"
#include "optim/optimizer.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;

namespace {

constexpr int kSteps = 6;

// Parameter shapes: group 0 then group 1 (split at kSplit).
const std::vector<Shape> kShapes = {{8, 5}, {8}, {3, 8}, {3}, {16}, {2, 2, 3}, {4}};
constexpr size_t kSplit = 4;
constexpr size_t kFrozen = 6;  // never has a gradient

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  return t;
}

std::vector<Tensor> make_params(const std::vector<Shape>& shapes) {
  std::vector<Tensor> ps;
  for (size_t k = 0; k < shapes.size(); ++k) ps.push_back(random_tensor(shapes[k], 7 + k).set_requires_grad(true));
  return ps;
}

std::vector<Tensor> copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (auto& p : ps) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

std::vector<optim::ParamGroup> two_groups(const std::vector<Tensor>& ps) {
  const size_t split = std::min(kSplit, ps.size());
  optim::ParamGroup a, b;
  a.params.assign(ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(split));
  a.lr = 0.1;
  a.weight_decay = 0.01;
  b.params.assign(ps.begin() + static_cast<std::ptrdiff_t>(split), ps.end());
  b.lr = 0.05;
  b.weight_decay = 0.02;
  if (b.params.empty()) return {a};
  return {a, b};
}

// Whether parameter k gets a gradient at step s: one misses every third step, one never has one.
bool has_grad(size_t k, int s) { return !(k == 1 && s % 3 == 1) && k != kFrozen; }

// The average over `world` ranks of rank r's gradient for parameter k at step s, summed in rank
// order: the same bits on every rank.
Tensor averaged_grad(const Shape& shape, size_t k, int s, int world) {
  std::vector<float> acc(static_cast<size_t>(shape_numel(shape)), 0.0f);
  for (int r = 0; r < world; ++r) {
    const auto g = random_tensor(shape, 1000 + 97 * s + 13 * r + k).to_vector<float>();
    for (size_t e = 0; e < acc.size(); ++e) acc[e] += g[e];
  }
  for (auto& v : acc) v /= static_cast<float>(world);
  return Tensor::from_vector<float>(acc, shape);
}

void set_grads(std::vector<Tensor>& ps, std::vector<Tensor>& ref, int s, int world) {
  for (size_t k = 0; k < ps.size(); ++k) {
    ps[k].set_grad(Tensor());
    ref[k].set_grad(Tensor());
    if (!has_grad(k, s)) continue;
    Tensor g = averaged_grad(ps[k].shape(), k, s, world);
    ps[k].set_grad(g.clone());
    ref[k].set_grad(g.clone());
  }
}

std::string bitwise_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return a.str() + " vs " + b.str();
  Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  if (std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0) return "";
  const auto va = ha.to_vector<double>(), vb = hb.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i)
    if (va[i] != vb[i])
      return "element " + std::to_string(i) + ": " + std::to_string(va[i]) + " vs " + std::to_string(vb[i]);
  return "differs in bits only";
}

void expect_same_params(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  for (size_t k = 0; k < a.size(); ++k) {
    const std::string d = bitwise_diff(a[k], b[k]);
    ASSERT_TRUE(d.empty()) << what << ", parameter " << k << ": " << d;
  }
}

void expect_same_state(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (auto& [key, t] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << "missing " << key;
    const std::string d = bitwise_diff(it->second, t);
    EXPECT_TRUE(d.empty()) << key << ": " << d;
  }
}

struct Kind {
  std::string name;
  bool bucket_view = false;
};

Kind parse_kind(const std::string& param) {
  Kind k;
  const auto colon = param.find(':');
  k.name = param.substr(0, colon);
  k.bucket_view = colon != std::string::npos && param.substr(colon + 1) == "view";
  return k;
}

optim::SGDOptions sgd_options() {
  optim::SGDOptions o;
  o.momentum = 0.9;
  o.dampening = 0.1;
  return o;
}

optim::AdamOptions adam_options() {
  optim::AdamOptions o;
  o.beta1 = 0.8;
  return o;
}

std::unique_ptr<optim::Optimizer> unsharded(const std::string& kind, std::vector<optim::ParamGroup> groups) {
  if (kind == "sgd") return std::make_unique<optim::SGD>(std::move(groups), sgd_options());
  if (kind == "adam") return std::make_unique<optim::Adam>(std::move(groups), adam_options());
  if (kind == "adamw") return std::make_unique<optim::AdamW>(std::move(groups), adam_options());
  if (kind == "adadelta") return std::make_unique<optim::Adadelta>(std::move(groups), optim::AdadeltaOptions{});
  throw std::runtime_error("unknown optimizer " + kind);
}

dist::ZeroRedundancyOptimizer::LocalFactory factory(const std::string& kind) {
  if (kind == "sgd") return dist::local_optimizer<optim::SGD>(sgd_options());
  if (kind == "adam") return dist::local_optimizer<optim::Adam>(adam_options());
  if (kind == "adamw") return dist::local_optimizer<optim::AdamW>(adam_options());
  return [kind](std::vector<optim::ParamGroup> g) { return unsharded(kind, std::move(g)); };
}

// K steps sharded vs unsharded, then the state dict checks and K more steps after a reload.
void run_against_unsharded(const test::RankContext& ctx, const std::vector<Shape>& shapes) {
  const Kind kind = parse_kind(ctx.param);
  std::vector<Tensor> ps = make_params(shapes), ref = copies(ps);
  dist::ZeroOptions zo;
  zo.parameters_as_bucket_view = kind.bucket_view;
  dist::ZeroRedundancyOptimizer zero(two_groups(ps), factory(kind.name), ctx.group, zo);
  auto plain = unsharded(kind.name, two_groups(ref));
  optim::StepLR zero_sched(zero, 2, 0.5), plain_sched(*plain, 2, 0.5);
  for (int s = 0; s < kSteps; ++s) {
    set_grads(ps, ref, s, ctx.world);
    zero.step();
    plain->step();
    zero_sched.step();
    plain_sched.step();
    expect_same_params(ps, ref, "step " + std::to_string(s));
    zero.zero_grad();
    for (auto& p : ps) ASSERT_FALSE(p.grad().defined()) << "zero_grad left a gradient";
  }
  // The shards cover every parameter once; the state adds up to the unsharded optimizer's.
  const auto bytes = dist::allreduce_values(*ctx.group, {static_cast<double>(zero.state_bytes())},
                                            dist::ReduceOp::Sum, "state bytes");
  EXPECT_EQ(bytes[0], static_cast<double>(plain->state_bytes()));
  EXPECT_GT(plain->state_bytes(), 0);
  if (!zero.local_optimizer()) {
    EXPECT_EQ(zero.state_bytes(), 0);
  }
  EXPECT_LT(zero.state_bytes(), plain->state_bytes()) << "every rank should hold only part of the state";
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto& shard = zero.shard(zero.rank_of(i));
    EXPECT_EQ(std::count(shard.begin(), shard.end(), i), 1) << "parameter " << i;
  }

  // Consolidated on the last rank: the unsharded optimizer's state dict, bit for bit.
  const int to = ctx.world - 1;
  zero.consolidate_state_dict(to);
  if (ctx.rank == to) {
    expect_same_state(zero.state_dict(), plain->state_dict());
  } else {
    try {
      (void)zero.state_dict();
      ADD_FAILURE() << "state_dict() on a rank that did not receive the consolidated state did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("consolidate_state_dict(" + std::to_string(ctx.rank) + ")"),
                std::string::npos)
          << e.what();
    }
  }

  // Resume: a fresh sharded optimizer (fresh parameter copies) loads the unsharded state dict; a
  // fresh unsharded one loads the consolidated dict where it exists. Both then match the original
  // unsharded run for K more steps.
  std::vector<Tensor> ps2 = copies(ref), ref2 = copies(ref);
  dist::ZeroRedundancyOptimizer resumed(two_groups(ps2), factory(kind.name), ctx.group, zo);
  resumed.load_state_dict(plain->state_dict());
  auto plain2 = unsharded(kind.name, two_groups(ref2));
  plain2->load_state_dict(ctx.rank == to ? zero.state_dict() : plain->state_dict());
  for (int s = kSteps; s < 2 * kSteps; ++s) {
    set_grads(ps2, ref, s, ctx.world);
    for (size_t k = 0; k < ref2.size(); ++k)
      ref2[k].set_grad(ref[k].grad().defined() ? ref[k].grad().clone() : Tensor());
    resumed.step();
    plain->step();
    plain2->step();
    expect_same_params(ps2, ref, "resumed sharded, step " + std::to_string(s));
    expect_same_params(ref2, ref, "resumed unsharded, step " + std::to_string(s));
  }
}

std::string what_fails(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ZeroPartition, MatchesPyTorch) {
  std::ifstream in(TANDEM_SOURCE_DIR "/tests/fixtures/zero_partition.json");
  ASSERT_TRUE(in) << "tests/fixtures/zero_partition.json is missing (tests/fixtures/make_zero_fixtures.py)";
  const auto fixture = nlohmann::json::parse(in);
  ASSERT_GE(fixture["cases"].size(), 10u);
  for (const auto& c : fixture["cases"]) {
    std::vector<std::vector<int64_t>> numels;
    for (const auto& group : c["shapes"]) {
      numels.emplace_back();
      for (const auto& shape : group) numels.back().push_back(shape_numel(shape.get<Shape>()));
    }
    const int world = c["world"].get<int>();
    const auto want = c["assignment"].get<std::vector<std::vector<std::vector<size_t>>>>();
    EXPECT_EQ(dist::zero_partition(numels, world), want) << c["name"] << " over " << world << " ranks";
  }
}

TEST(Zero, SgdMomentumWeightDecayTwoRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(2, "sgd");
}

TEST(Zero, SgdMomentumWeightDecayThreeRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(3, "sgd");
}

TEST(Zero, AdamTwoRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(2, "adam");
}

TEST(Zero, AdamWThreeRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(3, "adamw");
}

TEST(Zero, AdadeltaTwoRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(2, "adadelta");
}

TEST(Zero, BucketViewSgdThreeRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(3, "sgd:view");
}

TEST(Zero, BucketViewAdamTwoRanks) {
  if (auto c = child_rank()) return run_against_unsharded(*c, kShapes);
  run_ranks(2, "adam:view");
}

// Two parameters over three ranks: rank 2 owns nothing, builds no local optimizer, and still takes
// part in every broadcast and in the consolidation.
TEST(Zero, RankWithEmptyShard) {
  if (auto c = child_rank()) {
    const std::vector<Shape> two = {{3, 3}, {2}};
    std::vector<Tensor> ps = make_params(two);
    dist::ZeroRedundancyOptimizer zero(two_groups(ps), factory("adam"), c->group);
    EXPECT_EQ(zero.local_optimizer() == nullptr, c->rank == 2);
    EXPECT_EQ(zero.shard(2).size(), 0u);
    EXPECT_EQ(zero.state_bytes(), 0);  // no state before the first step, and none ever on rank 2
    return run_against_unsharded(*c, two);
  }
  run_ranks(3, "adam");
}

TEST(Zero, BadInputIsNamed) {
  if (auto c = child_rank()) {
    std::vector<Tensor> ps = make_params(kShapes);
    auto groups = two_groups(ps);
    // A parameter in two groups, and one twice in a group.
    auto twice = groups;
    twice[1].params.push_back(ps[2]);
    std::string e = what_fails([&] { dist::ZeroRedundancyOptimizer z(twice, factory("sgd"), c->group); });
    EXPECT_NE(e.find("is in group 0 at position 2 and again in group 1"), std::string::npos) << e;
    auto same = groups;
    same[0].params.push_back(ps[0]);
    e = what_fails([&] { dist::ZeroRedundancyOptimizer z(same, factory("sgd"), c->group); });
    EXPECT_NE(e.find("each parameter must appear once"), std::string::npos) << e;
    e = what_fails([&] { dist::ZeroRedundancyOptimizer z({}, factory("sgd"), c->group); });
    EXPECT_NE(e.find("no parameters to optimise"), std::string::npos) << e;
    e = what_fails([&] { dist::ZeroRedundancyOptimizer z(groups, nullptr, c->group); });
    EXPECT_NE(e.find("factory is required"), std::string::npos) << e;

    // Ranks that pass different parameters fail on every rank.
    std::vector<Tensor> mine = ps;
    if (c->rank == 1) mine.pop_back();
    e = what_fails([&] { dist::ZeroRedundancyOptimizer z(two_groups(mine), factory("sgd"), c->group); });
    EXPECT_NE(e.find("every rank must pass the same parameter groups"), std::string::npos) << e;

    // A factory that drops its groups.
    auto bad_factory = [](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
      g.resize(1);
      return std::make_unique<optim::SGD>(std::move(g), optim::SGDOptions{});
    };
    e = what_fails([&] { dist::ZeroRedundancyOptimizer z(groups, bad_factory, c->group); });
    EXPECT_NE(e.find("does not hold the groups it was given"), std::string::npos) << e;

    // Bucket view over parameters of two dtypes.
    std::vector<Tensor> mixed = make_params({{4}, {3}});
    mixed[1].set_data(mixed[1].to(kFloat64));
    dist::ZeroOptions view;
    view.parameters_as_bucket_view = true;
    e = what_fails([&] { dist::ZeroRedundancyOptimizer z(two_groups(mixed), factory("sgd"), c->group, view); });
    EXPECT_NE(e.find("parameters_as_bucket_view needs every parameter contiguous, of one dtype"), std::string::npos)
        << e;

    dist::ZeroRedundancyOptimizer zero(groups, factory("sgd"), c->group);
    e = what_fails([&] { zero.consolidate_state_dict(2); });
    EXPECT_NE(e.find("consolidate_state_dict(to=2) names no rank of this group (size 2)"), std::string::npos) << e;
    e = what_fails([&] { (void)zero.state_dict(); });
    EXPECT_NE(e.find("has not been consolidated"), std::string::npos) << e;
    e = what_fails([&] { zero.load_state_dict({{"state.x.momentum_buffer", Tensor::zeros({8, 5})}}); });
    EXPECT_NE(e.find("unexpected optimizer state key 'state.x.momentum_buffer'"), std::string::npos) << e;
    e = what_fails([&] { zero.load_state_dict({{"state.7.momentum_buffer", Tensor::zeros({4})}}); });
    EXPECT_NE(e.find("is for parameter 7 but there are only 7 parameters"), std::string::npos) << e;
    e = what_fails([&] { zero.load_state_dict({{"state.0.momentum_buffer", Tensor::zeros({5, 8})}}); });
    EXPECT_NE(e.find("has shape [5, 8], expected [8, 5]"), std::string::npos) << e;
    return;
  }
  run_ranks(2);
}
