// fsdp_memory: what one rank holds, and how long a step takes, with dist::FullyShardedDataParallel
// against DistributedDataParallel, in one run. The model is examples/transformer's GPT at a larger
// width (default 8 blocks of width 768: 56.8M parameters) with AdamW. For each world size (--worlds,
// default 1 2 4) and each mode (ddp; fsdp: FULL_SHARD with one unit per Block; shard_grad_op;
// fsdp_bf16: FULL_SHARD with mixed_precision param_dtype bfloat16, on request), it
// starts `world` rank processes of itself over Gloo (a FileStore in a scratch directory) that train
// --steps steps on fixed random tokens and report: the bytes this rank holds in parameters,
// gradients and optimizer state (DDP: the module's; FSDP: its shards, their gradients and the
// optimizer's state over them), FSDP's gathered buffers at their peak, the peak RSS (VmHWM), the
// mean step time after the first step, and the communication the compute thread waited for (DDP:
// the reducer's exposed_comm_ms; FSDP: its gather and reduction waits). Prints one table row per
// world size and mode with the largest rank's numbers and the ratios to DDP of the same world size,
// and writes every rank's numbers as JSON (--json). Each configuration runs in fresh processes, so
// peak RSS belongs to it alone.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/thread_pool.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/ddp.h"
#include "dist/parallel/fsdp.h"
#include "dist/store/file_store.h"
#include "optim/optimizer.h"
#include "rank_processes.h"
#include "train/models/gpt.h"

namespace {

using namespace tandem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> worlds = {1, 2, 4};
  std::vector<std::string> modes = {"ddp", "fsdp", "shard_grad_op"};
  int steps = 4, batch = 2, threads = 1;
  int64_t embd = 768, layers = 8, heads = 12, block = 64, vocab = 96;
  std::string json_path;
  // One rank (set by the driver).
  int rank = -1, world = 1;
  std::string mode, store, out;
};

int64_t bytes_of(const std::vector<Tensor>& ts, bool grads) {
  int64_t n = 0;
  for (const Tensor& t : ts) {
    const Tensor g = grads ? t.grad() : t;
    if (g.defined()) n += static_cast<int64_t>(g.nbytes());
  }
  return n;
}

void run_rank(const Options& o) {
  set_num_threads(o.threads);
  manual_seed(1);
  gpt::Config c;
  c.vocab_size = o.vocab;
  c.block_size = o.block;
  c.n_layer = o.layers;
  c.n_head = o.heads;
  c.n_embd = o.embd;
  auto net = std::make_shared<gpt::GPT>(c);
  Generator data(2 + static_cast<uint64_t>(o.rank));
  std::vector<int64_t> ids(static_cast<size_t>(o.batch * o.block)), next(ids.size());
  for (auto& v : ids) v = static_cast<int64_t>(data.below(static_cast<uint64_t>(o.vocab)));
  for (auto& v : next) v = static_cast<int64_t>(data.below(static_cast<uint64_t>(o.vocab)));
  const Tensor x = Tensor::from_vector<int64_t>(ids, {o.batch, o.block});
  const Tensor y = Tensor::from_vector<int64_t>(next, {o.batch * o.block});
  auto store = std::make_shared<dist::FileStore>(o.store, o.world, std::chrono::seconds(300));
  auto group = dist::make_process_group("gloo", store, o.rank, o.world, std::chrono::seconds(300));

  std::shared_ptr<dist::DistributedDataParallel> ddp;
  std::shared_ptr<dist::FullyShardedDataParallel> fsdp;
  if (o.mode == "ddp") {
    ddp = std::make_shared<dist::DistributedDataParallel>(net, group);
  } else {
    dist::FSDPOptions fo;
    fo.sharding_strategy =
        o.mode == "shard_grad_op" ? dist::ShardingStrategy::ShardGradOp : dist::ShardingStrategy::FullShard;
    if (o.mode == "fsdp_bf16") fo.mixed_precision.param_dtype = kBFloat16;
    fo.auto_wrap_policy.module_classes = {"Block"};
    fsdp = std::make_shared<dist::FullyShardedDataParallel>(net, group, fo);
  }
  nn::Module& wrapper = ddp ? static_cast<nn::Module&>(*ddp) : static_cast<nn::Module&>(*fsdp);
  const std::vector<Tensor> params = wrapper.parameters();
  optim::AdamOptions ao;
  ao.lr = 1e-4;
  ao.weight_decay = 0.01;
  optim::AdamW opt(params, ao);
  double total_s = 0, exposed_ms = 0;
  int64_t param_bytes = 0, grad_bytes = 0, gathered_peak = 0;
  for (int s = 0; s < o.steps; ++s) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor logits = wrapper.forward(x);
    Tensor loss = F::cross_entropy(F::reshape(logits, {o.batch * o.block, o.vocab}), y);
    loss.backward();
    // Held after backward, before the step frees nothing: the most the step holds at once.
    param_bytes = ddp ? bytes_of(net->parameters(), false) : fsdp->memory().shard_bytes;
    grad_bytes = ddp ? bytes_of(net->parameters(), true) : fsdp->memory().grad_bytes;
    opt.step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) {
      total_s += dt;
      exposed_ms += ddp ? ddp->reducer().stats().exposed_comm_ms
                        : fsdp->stats().gather_wait_ms + fsdp->stats().reduce_wait_ms;
    }
    if (fsdp) gathered_peak = fsdp->memory().peak_gathered_bytes;
  }
  int64_t numel = 0;
  for (const Tensor& p : net->parameters()) numel += p.numel();
  const int timed = std::max(1, o.steps - 1);
  json r = {{"mode", o.mode},
            {"world", o.world},
            {"rank", o.rank},
            {"params", numel},
            {"param_bytes", param_bytes},
            {"grad_bytes", grad_bytes},
            {"state_bytes", opt.state_bytes()},
            {"held_bytes", param_bytes + grad_bytes + opt.state_bytes()},
            {"gathered_peak_bytes", gathered_peak},
            {"peak_rss_bytes", bench::peak_rss_bytes()},
            {"step_ms", total_s / timed * 1e3},
            {"exposed_comm_ms", exposed_ms / timed}};
  std::ofstream(o.out) << r.dump() << "\n";
}

std::vector<json> run_config(const Options& o, const std::string& mode, int world,
                             const std::filesystem::path& scratch) {
  return bench::run_rank_processes(
      "fsdp_memory", mode + "-" + std::to_string(world), world,
      {"--mode", mode, "--steps", std::to_string(o.steps), "--batch", std::to_string(o.batch), "--threads",
       std::to_string(o.threads), "--embd", std::to_string(o.embd), "--layers", std::to_string(o.layers), "--heads",
       std::to_string(o.heads)},
      scratch);
}

template <typename T>
T max_of(const std::vector<json>& ranks, const char* key) {
  T m = 0;
  for (auto& r : ranks) m = std::max(m, r[key].get<T>());
  return m;
}

std::string fmt(double v, const char* f = "%.1f") {
  char buf[32];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double mib(int64_t b) { return static_cast<double>(b) / (1 << 20); }

int drive(const Options& o) {
  const auto scratch = std::filesystem::temp_directory_path() / ("tandem-fsdp-memory-" + std::to_string(getpid()));
  std::filesystem::create_directories(scratch);
  json all = json::array();
  std::cout << "GPT width " << o.embd << " x " << o.layers << " blocks, AdamW, batch " << o.batch << " x " << o.block
            << " tokens per rank, " << o.steps << " steps (the first untimed), " << o.threads << " thread(s) per rank\n\n"
            << "| ranks | mode | params+grads+state MiB (max rank) | vs DDP | gathered peak MiB | peak RSS MiB | "
               "step ms | vs DDP | exposed comm ms |\n|---|---|---|---|---|---|---|---|---|\n";
  for (int world : o.worlds) {
    int64_t ddp_held = 0;
    double ddp_ms = 0;
    for (const std::string& mode : o.modes) {
      const auto ranks = run_config(o, mode, world, scratch);
      const int64_t held = max_of<int64_t>(ranks, "held_bytes");
      const double ms = max_of<double>(ranks, "step_ms");
      if (mode == "ddp") {
        ddp_held = held;
        ddp_ms = ms;
      }
      std::cout << "| " << world << " | " << mode << " | " << fmt(mib(held)) << " | "
                << (ddp_held ? fmt(static_cast<double>(held) / ddp_held, "%.3f") : "-") << " | "
                << fmt(mib(max_of<int64_t>(ranks, "gathered_peak_bytes"))) << " | "
                << fmt(mib(max_of<int64_t>(ranks, "peak_rss_bytes"))) << " | " << fmt(ms, "%.0f") << " | "
                << (ddp_ms > 0 ? fmt(ms / ddp_ms, "%.2f") : "-") << " | "
                << fmt(max_of<double>(ranks, "exposed_comm_ms"), "%.0f") << " |\n"
                << std::flush;
      for (auto& r : ranks) all.push_back(r);
    }
  }
  std::filesystem::remove_all(scratch);
  if (!o.json_path.empty()) std::ofstream(o.json_path) << all.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"fsdp_memory: bytes held and step time per rank, FullyShardedDataParallel vs DDP"};
  app.add_option("--worlds", o.worlds, "world sizes");
  app.add_option("--modes", o.modes,
                 "ddp, fsdp (FULL_SHARD), shard_grad_op, fsdp_bf16 (FULL_SHARD, bfloat16 parameters); ddp first gives "
                 "the ratios")
      ->check(CLI::IsMember({"ddp", "fsdp", "shard_grad_op", "fsdp_bf16"}));
  app.add_option("--steps", o.steps, "training steps per configuration (the first is not timed)")
      ->check(CLI::Range(2, 1000));
  app.add_option("--batch", o.batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "kernel threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--embd", o.embd, "GPT width")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "GPT blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads (divides the width)")->check(CLI::PositiveNumber);
  bool overwrite = false;
  bench::add_json_output(app, o.json_path, overwrite);
  bench::add_rank_options(app, o.rank, o.world, o.store, o.out);
  app.add_option("--mode", o.mode, "(internal)");
  CLI11_PARSE(app, argc, argv);
  bench::refuse_to_write_over("fsdp_memory", o.json_path, overwrite);
  return bench::run_rank_or_drive("fsdp_memory", o.rank, [&] { run_rank(o); }, [&] { return drive(o); });
}
