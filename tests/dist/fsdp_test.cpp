// FullyShardedDataParallel (dist/parallel/fsdp.h) against DistributedDataParallel, as real processes over
// Gloo (common/ranks.h). Both start from one model and train 6 steps on the same per-rank batches;
// afterwards FSDP's gathered parameters must equal DDP's within DDP's own drift: the difference DDP
// shows against itself when its bucket order changes (one bucket per tensor against one for all),
// with a floor of a few float32 steps for the different place the average's division happens.
// Covered: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD (2 "nodes" of 2 ranks); SGD with momentum and weight decay, and AdamW;
// accumulation over two micro-batches (no_sync); 2 and 3 ranks; the units a class policy and a
// size policy make; shards holding 1/world of the parameters; the errors that name the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "common/ranks.h"
#include "dist/fsdp_fixtures.h"
#include "common/test_util.h"
#include "core/autograd.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "dist/parallel/ddp.h"
#include "dist/group/process_group_gloo.h"
#include "dist/parallel/fsdp.h"
#include "dist/parallel/fsdp_checkpoint.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"

using namespace tandem;
using tandem::test::child_rank;
using tandem::test::run_ranks;
using namespace tandem::test::fsdp;

namespace {

struct Setup {
  std::string strategy = "FULL_SHARD";
  std::string optimizer = "sgd";
  int micro = 1;  // micro-batches per step (accumulated under no_sync)
};

Setup parse(const std::string& param) {
  Setup s;
  std::istringstream in(param);
  in >> s.strategy >> s.optimizer >> s.micro;
  return s;
}

// Trains kSteps with `step(x, y)` doing forward + backward of one micro-batch and `sync(last)`
// returning a guard that suppresses the reduction on all but the last micro-batch.
template <typename Wrapper>
void train(Wrapper& w, optim::Optimizer& opt, const test::RankContext& ctx, int micro) {
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < micro; ++m) {
      const Batch b = batch(s, m, ctx.rank);
      auto guard = m + 1 < micro ? w.no_sync() : nullptr;
      Tensor loss = F::nll_loss(w.forward(b.x), b.y);
      loss.backward();
    }
    opt.step();
  }
}

std::map<std::string, Tensor> ddp_params(const test::RankContext& ctx, const Setup& s, double cap_mb) {
  manual_seed(11);
  auto net = std::make_shared<Net>();
  dist::DDPOptions o;
  o.reducer.bucket_cap_mb = cap_mb;
  o.reducer.first_bucket_cap_mb = cap_mb;
  dist::DistributedDataParallel ddp(net, ctx.group, o);
  auto opt = make_optimizer(s.optimizer, ddp.parameters());
  train(ddp, *opt, ctx, s.micro);
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : net->named_parameters()) out[n] = t.clone();
  return out;
}

void check_against_ddp(const test::RankContext& ctx) {
  const Setup s = parse(ctx.param);
  const auto ddp_small = ddp_params(ctx, s, 0.0001);  // one bucket per tensor
  const auto ddp_big = ddp_params(ctx, s, 100.0);     // one bucket for all
  const double drift = max_diff(ddp_small, ddp_big);

  manual_seed(11);
  auto net = std::make_shared<Net>();
  dist::FSDPOptions o;
  o.auto_wrap_policy.module_classes = {"Block"};
  // HYBRID_SHARD: "nodes" of 2 ranks, sharded inside one, replicated across.
  std::shared_ptr<dist::ProcessGroup> group = groups(ctx, s.strategy, o, "hybrid");
  const int shard_world = group->size();
  dist::FullyShardedDataParallel fsdp(net, group, o);
  ASSERT_EQ(fsdp.units().size(), 3u);  // b0, b1, the root (in, out)
  EXPECT_EQ(fsdp.units()[0].path, "b0");
  EXPECT_EQ(fsdp.units()[2].path, "");
  EXPECT_EQ(fsdp.units()[2].params, (std::vector<std::string>{"in.weight", "in.bias", "out.weight", "out.bias"}));
  auto opt = make_optimizer(s.optimizer, fsdp.parameters());
  train(fsdp, *opt, ctx, s.micro);

  std::map<std::string, Tensor> got;
  for (auto& [n, t] : fsdp.full_state_dict()) got[n] = t;
  ASSERT_EQ(got.size(), ddp_big.size());
  const double diff = max_diff(got, ddp_big);
  const double tolerance = std::max(4 * drift, 2e-6);
  EXPECT_LE(diff, tolerance) << s.strategy << " " << s.optimizer << " x" << s.micro << ": FSDP differs from DDP by "
                             << diff << " (DDP's own drift " << drift << ")";
  // The parameters moved: the comparison is not of two untouched models.
  manual_seed(11);
  Net fresh;
  std::map<std::string, Tensor> initial;
  for (auto& [n, t] : fresh.named_parameters()) initial[n] = t;
  EXPECT_GT(max_diff(got, initial), 1e-3);

  const auto mem = fsdp.memory();
  int64_t numel = 0;
  for (auto& u : fsdp.units()) numel += u.numel;
  if (s.strategy == "NO_SHARD") {
    EXPECT_EQ(mem.shard_bytes, numel * 4);
  } else {
    EXPECT_LE(mem.shard_bytes, (numel / shard_world + 3) * 4) << "each rank should hold 1/" << shard_world
                                                                  << " of the parameters";
    EXPECT_EQ(mem.gathered_bytes, 0) << "after a step nothing stays gathered";
    EXPECT_GT(mem.peak_gathered_bytes, 0);
  }
}

}  // namespace

#define FSDP_VS_DDP(NAME, WORLD, PARAM)                          \
  TEST(FsdpVsDdp, NAME) {                                        \
    if (auto ctx = child_rank()) return check_against_ddp(*ctx); \
    run_ranks(WORLD, PARAM);                                     \
  }

FSDP_VS_DDP(FullShardSgdTwoRanks, 2, "FULL_SHARD sgd 1")
FSDP_VS_DDP(FullShardAdamWThreeRanks, 3, "FULL_SHARD adamw 1")
FSDP_VS_DDP(FullShardSgdAccumulatedThreeRanks, 3, "FULL_SHARD sgd 2")
FSDP_VS_DDP(ShardGradOpAdamWTwoRanks, 2, "SHARD_GRAD_OP adamw 1")
FSDP_VS_DDP(ShardGradOpSgdThreeRanks, 3, "SHARD_GRAD_OP sgd 1")
FSDP_VS_DDP(ShardGradOpAdamWAccumulatedTwoRanks, 2, "SHARD_GRAD_OP adamw 2")
FSDP_VS_DDP(NoShardSgdTwoRanks, 2, "NO_SHARD sgd 1")
FSDP_VS_DDP(NoShardAdamWAccumulatedThreeRanks, 3, "NO_SHARD adamw 2")
FSDP_VS_DDP(HybridShardSgdTwoNodesOfTwo, 4, "HYBRID_SHARD sgd 1")
FSDP_VS_DDP(HybridShardAdamWAccumulatedTwoNodesOfTwo, 4, "HYBRID_SHARD adamw 2")

TEST(FsdpPlan, SizePolicyWrapsSubtreesFromTheLeavesUp) {
  Net net;
  dist::AutoWrapPolicy size;
  size.min_num_params = 500;  // a Linear(16, 32) has 544; a Block 1072 but its Linears go first
  auto plan = dist::plan_units(net, size);
  std::vector<std::string> paths;
  for (auto& u : plan) paths.push_back(u.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"b0.fc1", "b0.fc2", "b1.fc1", "b1.fc2", ""}));
  dist::AutoWrapPolicy none;
  plan = dist::plan_units(net, none);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].params.size(), 12u);
  EXPECT_EQ(dist::module_class_name(*net.b0), "Block");
  EXPECT_EQ(dist::module_class_name(*net.in), "Linear");
  dist::AutoWrapPolicy typo;
  typo.module_classes = {"Blok"};
  const std::string msg = test::error_of([&] { dist::plan_units(net, typo); });
  EXPECT_NE(msg.find("names module class 'Blok', which no module of the model has (its classes: Block, Linear, Net)"),
            std::string::npos)
      << msg;
}

TEST(FsdpErrors, ReadingAShardedParameterOutsideForwardNamesTheFix) {
  if (auto ctx = child_rank()) {
    manual_seed(1);
    auto net = std::make_shared<Net>();
    dist::FSDPOptions o;
    o.auto_wrap_policy.module_classes = {"Block"};
    dist::FullyShardedDataParallel fsdp(net, ctx->group, o);
    std::string msg = test::error_of([&] { (void)net->b0->fc1->weight.data<float>()[0]; });
    EXPECT_NE(msg.find("a parameter of unit 'b0' (b0.fc1.weight, b0.fc1.bias, b0.fc2.weight, ...) was read outside "
                       "forward and backward"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("full_state_dict()"), std::string::npos) << msg;
    fsdp.gather_full_params();
    const float w = net->b0->fc1->weight.data<float>()[0];  // readable now
    EXPECT_TRUE(std::isfinite(w));
    fsdp.release_full_params();
    o.sharding_strategy = dist::ShardingStrategy::HybridShard;
    msg = test::error_of([&] { dist::FullyShardedDataParallel(std::make_shared<Net>(), ctx->group, o); });
    EXPECT_NE(msg.find("HYBRID_SHARD needs options.replicate_group"), std::string::npos) << msg;
    msg = test::error_of([&] { dist::parse_sharding_strategy("FULL"); });
    EXPECT_NE(msg.find("unknown sharding_strategy 'FULL'; expected FULL_SHARD"), std::string::npos) << msg;
    return;
  }
  run_ranks(2);
}

// clip_grad_norm_ over shards gives the norm of the whole gradient, as DDP's full gradient has.
TEST(FsdpClip, NormOverShardsIsTheWholeGradientsNorm) {
  if (auto ctx = child_rank()) {
    manual_seed(5);
    auto a = std::make_shared<Net>();
    manual_seed(5);
    auto b = std::make_shared<Net>();
    dist::DistributedDataParallel ddp(a, ctx->group);
    dist::FSDPOptions o;
    o.auto_wrap_policy.module_classes = {"Block"};
    dist::FullyShardedDataParallel fsdp(b, ctx->group, o);
    const Batch x = batch(0, 0, ctx->rank);
    F::nll_loss(ddp.forward(x.x), x.y).backward();
    F::nll_loss(fsdp.forward(x.x), x.y).backward();
    const double want = optim::clip_grad_norm_(ddp.parameters(), 1e9).to(kFloat64).data<double>()[0];
    const double got = fsdp.clip_grad_norm_(1e9);
    EXPECT_NEAR(got, want, 1e-5 * want);
    const double clipped = fsdp.clip_grad_norm_(want / 2);
    EXPECT_NEAR(clipped, want, 1e-5 * want);
    EXPECT_NEAR(fsdp.clip_grad_norm_(1e9), want / 2, 1e-4 * want);  // scaled to max_norm
    return;
  }
  run_ranks(2);
}

namespace {

// The elements of "<prefix>" (param.<k> or optim.state.<k>.<buffer>) over every shard file of `dir`
// written by `world` ranks, in rank order, cut to `numel`: the unsharded values.
std::vector<float> unsharded(const std::string& dir, int world, const std::string& key, int64_t numel) {
  std::vector<float> out;
  for (int r = 0; r < world; ++r) {
    const auto file = load_safetensors(dir + "/shard-" + std::to_string(r) + "-of-" + std::to_string(world) + ".safetensors");
    const Tensor& t = file.at(key);
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data<float>()[i]);
  }
  out.resize(static_cast<size_t>(numel));
  return out;
}

struct Trained {
  std::shared_ptr<Net> net;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::Optimizer> opt;
};

Trained make_fsdp(const test::RankContext& ctx, const std::string& strategy = "FULL_SHARD",
                  const std::string& tag = "") {
  manual_seed(11);
  Trained t;
  t.net = std::make_shared<Net>();
  dist::FSDPOptions o;
  o.auto_wrap_policy.module_classes = {"Block"};
  auto group = groups(ctx, strategy, o, tag);
  t.fsdp = std::make_unique<dist::FullyShardedDataParallel>(t.net, group, o);
  t.opt = make_optimizer("adamw", t.fsdp->parameters());
  return t;
}

void steps(Trained& t, const test::RankContext& ctx, int from, int to) {
  for (int s = from; s < to; ++s) {
    t.opt->zero_grad();
    const Batch b = batch(s, 0, ctx.rank);
    F::nll_loss(t.fsdp->forward(b.x), b.y).backward();
    t.opt->step();
  }
}

void expect_same_bits(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].second.data<float>(), b[i].second.data<float>(), a[i].second.nbytes()), 0)
        << a[i].first;
}

// Saved after 3 steps and loaded into a fresh model and optimizer, 3 more steps give the same
// parameters, bit for bit, as 6 straight steps. Returns the straight run and what it saved.
struct Resumed {
  Trained straight;
  nn::NamedTensors saved;
};
Resumed expect_bitwise_resume(const test::RankContext& ctx, const std::string& dir, const std::string& strategy) {
  Resumed r{make_fsdp(ctx, strategy, "a"), {}};
  steps(r.straight, ctx, 0, 3);
  r.straight.fsdp->save_sharded(dir, r.straight.opt.get());
  r.saved = r.straight.fsdp->full_state_dict();
  steps(r.straight, ctx, 3, 6);
  Trained resumed = make_fsdp(ctx, strategy, "b");
  resumed.fsdp->load_sharded(dir, resumed.opt.get());
  steps(resumed, ctx, 3, 6);
  expect_same_bits(r.straight.fsdp->full_state_dict(), resumed.fsdp->full_state_dict());
  return r;
}

}  // namespace

TEST(FsdpCheckpoint, ShardedResumeOnTheSameWorldIsBitwise) {
  if (auto ctx = child_rank()) {
    const std::string dir = ctx->param;
    Resumed r = expect_bitwise_resume(*ctx, dir, "FULL_SHARD");
    // The full checkpoint: the module's own names, the gathered values.
    const auto a = r.straight.fsdp->full_state_dict();
    r.straight.fsdp->save_full(dir + "/full.safetensors");
    const auto full = load_safetensors(dir + "/full.safetensors");
    ASSERT_EQ(full.size(), a.size());
    for (auto& [name, t] : a)
      EXPECT_EQ(std::memcmp(full.at(name).data<float>(), t.data<float>(), t.nbytes()), 0) << name;
    // The sharded files assembled in one process: the module's state dict as it was saved.
    const auto assembled = dist::load_sharded_state_dict(dir);
    ASSERT_EQ(assembled.size(), r.saved.size());
    for (auto& [name, t] : r.saved)
      EXPECT_EQ(std::memcmp(assembled.at(name).data<float>(), t.data<float>(), t.nbytes()), 0) << name;
    return;
  }
  test::TempDir dir("fsdp-ckpt");
  run_ranks(2, dir.path().string());
}

// HYBRID_SHARD (2 "nodes" of 2): the first node writes one file per rank in the node, and every node
// resumes from them bit for bit. The same files load into FULL_SHARD over all 4 ranks (re-sharded
// from 2 shards to 4) with the same values.
TEST(FsdpCheckpoint, HybridShardSavesOneNodesShardsAndResumesBitwise) {
  if (auto ctx = child_rank()) {
    const std::string dir = ctx->param;
    const Resumed r = expect_bitwise_resume(*ctx, dir, "HYBRID_SHARD");
    Trained flat = make_fsdp(*ctx);
    flat.fsdp->load_sharded(dir, flat.opt.get());
    expect_same_bits(flat.fsdp->full_state_dict(), r.saved);
    if (ctx->rank == 0) {
      EXPECT_TRUE(std::filesystem::exists(dir + "/shard-1-of-2.safetensors"));
      EXPECT_FALSE(std::filesystem::exists(dir + "/shard-0-of-4.safetensors"));
    }
    return;
  }
  test::TempDir dir("fsdp-hybrid-ckpt");
  run_ranks(4, dir.path().string());
}

// Saved by 3 ranks, loaded by 2: the parameters and AdamW's moments are the same unsharded values.
TEST(FsdpCheckpoint, ShardedCheckpointReshardsOntoAnotherWorldSize) {
  if (auto ctx = child_rank()) {
    const std::string from = ctx->param + "/three", to = ctx->param + "/two";
    Trained t = make_fsdp(*ctx);
    if (ctx->world == 3) {
      steps(t, *ctx, 0, 2);
      t.fsdp->save_sharded(from, t.opt.get());
      return;
    }
    t.fsdp->load_sharded(from, t.opt.get());
    t.fsdp->save_sharded(to, t.opt.get());
    // A model with other units is refused (before any collective) naming the first difference.
    auto other = std::make_shared<Net>();
    dist::FullyShardedDataParallel single(other, ctx->group, dist::FSDPOptions{});  // one root unit
    const std::string msg = test::error_of([&] { single.load_sharded(from); });
    EXPECT_NE(msg.find("it has 3 units, this model has 1"), std::string::npos) << msg;
    // A shard file with one byte of its data changed fails its CRC-32C check on every rank (each
    // reads all 3 files), before any collective, naming the file.
    const std::string damaged = ctx->param + "/damaged", shard = damaged + "/shard-2-of-3.safetensors";
    if (ctx->rank == 0) {
      std::filesystem::copy(from, damaged);
      std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(shard) - 5));
      f.put('\x7f');
    }
    ctx->group->barrier()->wait(ctx->group->timeout());
    Trained fresh = make_fsdp(*ctx);
    const std::string bad = test::error_of([&] { fresh.fsdp->load_sharded(damaged, fresh.opt.get()); });
    EXPECT_NE(bad.find("FSDP checkpoint " + damaged + " is damaged: safetensors file '" + shard + "', tensor '"),
              std::string::npos) << bad;
    EXPECT_NE(bad.find("fails its CRC-32C check"), std::string::npos) << bad;
    if (ctx->rank != 0) return;
    const auto units = t.fsdp->units();
    for (size_t k = 0; k < units.size(); ++k) {
      const std::string p = "param." + std::to_string(k), m = "optim.state." + std::to_string(k) + ".exp_avg_sq";
      EXPECT_EQ(unsharded(from, 3, p, units[k].numel), unsharded(to, 2, p, units[k].numel)) << units[k].path;
      EXPECT_EQ(unsharded(from, 3, m, units[k].numel), unsharded(to, 2, m, units[k].numel)) << units[k].path;
    }
    return;
  }
  test::TempDir dir("fsdp-reshard");
  run_ranks(3, dir.path().string());
  run_ranks(2, dir.path().string());
}

namespace {

// Six equal blocks between two small layers: under FULL_SHARD at most a few blocks are gathered at once.
class Deep : public nn::Module {
 public:
  Deep() {
    in = register_module("in", std::make_shared<nn::Linear>(13, 16));
    for (int i = 0; i < 6; ++i) blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<Block>(16)));
    out = register_module("out", std::make_shared<nn::Linear>(16, 5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu(in->forward(x));
    for (auto& b : blocks) h = b->forward(h);
    return F::log_softmax(out->forward(h));
  }
  std::shared_ptr<nn::Linear> in, out;
  std::vector<std::shared_ptr<Block>> blocks;
};

}  // namespace

// FULL_SHARD frees each block in forward once the next one is read, and in backward once its
// gradients are reduced: the gathered peak stays near the root plus three blocks (the one running,
// the one prefetched, one released but still readable by the op that was running), far below all six.
TEST(FsdpMemory, FullShardKeepsOnlyAFewUnitsGathered) {
  if (auto ctx = child_rank()) {
    manual_seed(2);
    auto net = std::make_shared<Deep>();
    dist::FSDPOptions o;
    o.auto_wrap_policy.module_classes = {"Block"};
    dist::FullyShardedDataParallel fsdp(net, ctx->group, o);
    const auto units = fsdp.units();
    ASSERT_EQ(units.size(), 7u);
    const int64_t block_bytes = units[0].shard_numel * ctx->world * 4, root_bytes = units[6].shard_numel * ctx->world * 4;
    optim::SGD opt(fsdp.parameters(), optim::SGDOptions{0.1});
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      const Batch b = batch(s, 0, ctx->rank);
      F::nll_loss(fsdp.forward(b.x), b.y).backward();
      opt.step();
      EXPECT_EQ(fsdp.memory().gathered_bytes, 0) << "step " << s;
    }
    EXPECT_LE(fsdp.memory().peak_gathered_bytes, root_bytes + 3 * block_bytes)
        << "blocks of " << block_bytes << " bytes, root " << root_bytes;
    EXPECT_GT(fsdp.stats().prefetched, 0);
    return;
  }
  run_ranks(2);
}

// A unit's gradients go through the group's comm_buffer: over shared memory the reduce-scatter of a
// unit over 64 KiB reads the peers' buffers in place (at width 128 the two blocks of 65,920
// parameters, every step; the root's 9.7 KiB goes through the slots), and the parameters after 6
// steps are DDP's.
TEST(FsdpReduce, LargeUnitsReduceScatterInPlaceAndTrainAsDdp) {
  if (auto ctx = child_rank()) {
    auto run = [&](bool fsdp_wrap) {
      manual_seed(5);
      auto net = std::make_shared<Net>(128);
      std::shared_ptr<nn::Module> w;
      if (fsdp_wrap) {
        dist::FSDPOptions o;
        o.auto_wrap_policy.module_classes = {"Block"};
        w = std::make_shared<dist::FullyShardedDataParallel>(net, ctx->group, o);
      } else {
        w = std::make_shared<dist::DistributedDataParallel>(net, ctx->group);
      }
      optim::SGD opt(w->parameters(), optim::SGDOptions{0.1, 0.9});
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        const Batch b = batch(s, 0, ctx->rank);
        F::nll_loss(w->forward(b.x), b.y).backward();
        opt.step();
      }
      std::map<std::string, Tensor> out;
      auto* f = dynamic_cast<dist::FullyShardedDataParallel*>(w.get());
      for (auto& [n, t] : f ? f->full_state_dict() : net->named_parameters()) out[n] = t.clone();
      return out;
    };
    const auto ddp = run(false);
    auto* gloo = dynamic_cast<dist::ProcessGroupGloo*>(ctx->group.get());
    ASSERT_NE(gloo, nullptr);
    const auto before = gloo->allreduce_paths();
    const auto fsdp = run(true);
    const auto after = gloo->allreduce_paths();
    EXPECT_LE(max_diff(fsdp, ddp), 2e-6);
    if (gloo->allreduce_transport().rfind("shared memory", 0) == 0) {
      EXPECT_EQ(after.reduce_scatter_in_place - before.reduce_scatter_in_place, 2 * kSteps);
      EXPECT_EQ(after.reduce_scatter_through_slots - before.reduce_scatter_through_slots, kSteps);
    }
    return;
  }
  run_ranks(2);
}

// An evaluation forward (under NoGradGuard) leaves no unit gathered, the root and SHARD_GRAD_OP's
// included: shards changed afterwards (an average swapped in and out, a checkpoint loaded) are what
// the next forward computes with. Zeroed shards give the uniform log-probabilities -log 5.
TEST(FsdpEval, AnEvaluationForwardLeavesNothingGathered) {
  if (auto ctx = child_rank()) {
    for (const std::string strategy : {"FULL_SHARD", "SHARD_GRAD_OP"}) {
      manual_seed(3);
      auto net = std::make_shared<Net>();
      dist::FSDPOptions o;
      o.auto_wrap_policy.module_classes = {"Block"};
      o.sharding_strategy = dist::parse_sharding_strategy(strategy);
      dist::FullyShardedDataParallel fsdp(net, ctx->group, o);
      const Batch b = batch(0, 0, ctx->rank);
      {
        tandem::NoGradGuard no_grad;
        fsdp.forward(b.x);
      }
      EXPECT_EQ(fsdp.memory().gathered_bytes, 0) << strategy;
      {
        tandem::NoGradGuard no_grad;
        for (Tensor& p : fsdp.parameters()) p.zero_();
      }
      const Tensor y = fsdp.forward(b.x);
      for (int64_t i = 0; i < y.numel(); ++i)
        EXPECT_NEAR(y.data<float>()[i], -std::log(5.0f), 1e-6) << strategy << " element " << i;
    }
    return;
  }
  run_ranks(2);
}
