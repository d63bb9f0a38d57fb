// zero_memory: optimizer-state memory per rank with dist::ZeroRedundancyOptimizer against the
// unsharded optimizer, in one run. For each model (mnist: the MNIST net; mlp: nn/models/mlp,
// 1024 -> 2048 x6 -> 10 by default, 23.1M parameters), each world size (--worlds, default 1 2 4)
// and each mode (unsharded: DDP + the optimizer; zero: DDP + ZeroRedundancyOptimizer wrapping the
// same optimizer), it starts `world` rank processes of itself over Gloo (a FileStore in a scratch
// directory) that train --steps steps on fixed random data and report: the optimizer-state bytes
// this rank holds (Optimizer::state_bytes), its peak RSS (VmHWM) and a hash of the final
// parameters (the same in both modes: the sharded step is bitwise the unsharded one). Prints a
// table per model with the largest rank's state and peak RSS and their ratios to the unsharded run
// of the same world size, and writes every rank's numbers as JSON (--json).
// Each configuration runs in fresh processes, so peak RSS belongs to that configuration alone.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/thread_pool.h"
#include "dist/parallel/ddp.h"
#include "dist/store/file_store.h"
#include "dist/group/process_group_factory.h"
#include "dist/parallel/zero_redundancy_optimizer.h"
#include "nn/functional.h"
#include "nn/models/mlp.h"
#include "nn/models/mnist_net.h"
#include "optim/optimizer.h"
#include "rank_processes.h"

namespace {

using namespace tandem;
using json = nlohmann::json;

struct Options {
  std::vector<std::string> models = {"mnist", "mlp"};
  std::vector<int> worlds = {1, 2, 4};
  std::string optimizer = "adam";
  int steps = 3, batch = 16, threads = 1;
  int64_t mlp_in = 1024, mlp_hidden = 2048, mlp_layers = 6;
  std::string json_path;
  // One rank (set by the driver).
  int rank = -1, world = 1;
  std::string model, mode, store, out;
};

uint64_t hash_params(const std::vector<Tensor>& ps) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : ps) {
    const Tensor c = p.contiguous();
    const auto* b = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

Tensor random_uniform(const Shape& shape, Generator& g) {
  Tensor t = Tensor::empty(shape, kFloat32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(g.uniform(-1.0, 1.0));
  return t;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Options& o, std::vector<Tensor> params,
                                                 std::shared_ptr<dist::ProcessGroup> group) {
  const bool zero = o.mode == "zero";
  if (o.optimizer == "sgd") {
    optim::SGDOptions so;
    so.lr = 1e-3;
    so.momentum = 0.9;
    if (zero) return dist::make_zero_optimizer<optim::SGD>(std::move(params), std::move(group), so);
    return std::make_unique<optim::SGD>(std::move(params), so);
  }
  optim::AdamOptions ao;
  ao.lr = 1e-4;
  if (zero) return dist::make_zero_optimizer<optim::Adam>(std::move(params), std::move(group), ao);
  return std::make_unique<optim::Adam>(std::move(params), ao);
}

// One rank of one configuration: writes its numbers to o.out.
void run_rank(const Options& o) {
  set_num_threads(o.threads);
  manual_seed(1);
  std::shared_ptr<nn::Module> net;
  Generator data(2 + static_cast<uint64_t>(o.rank));
  Tensor x;
  if (o.model == "mlp") {
    net = std::make_shared<nn::models::Mlp>(nn::models::MlpOptions{o.mlp_in, o.mlp_hidden, o.mlp_layers, 10});
    x = random_uniform({o.batch, o.mlp_in}, data);
  } else {
    net = std::make_shared<nn::models::MnistNet>();
    x = random_uniform({o.batch, 1, 28, 28}, data);
  }
  std::vector<int64_t> labels(static_cast<size_t>(o.batch));
  for (auto& l : labels) l = static_cast<int64_t>(data.below(10));
  const Tensor y = Tensor::from_vector<int64_t>(labels, {o.batch});
  auto store = std::make_shared<dist::FileStore>(o.store, o.world, std::chrono::seconds(120));
  auto group = dist::make_process_group("gloo", store, o.rank, o.world, std::chrono::seconds(120));
  dist::DistributedDataParallel ddp(net, group);
  const std::vector<Tensor> params = ddp.parameters();
  auto opt = make_optimizer(o, params, group);
  for (int s = 0; s < o.steps; ++s) {
    opt->zero_grad();
    Tensor loss = F::nll_loss(F::log_softmax(ddp(x), -1), y);
    loss.backward();
    opt->step();
  }
  int64_t n = 0;
  for (const Tensor& p : params) n += p.numel();
  json r = {{"model", o.model},           {"mode", o.mode},
            {"world", o.world},           {"rank", o.rank},
            {"optimizer", o.optimizer},   {"params", n},
            {"param_bytes", n * 4},       {"state_bytes", opt->state_bytes()},
            {"peak_rss_bytes", bench::peak_rss_bytes()}, {"param_hash", std::to_string(hash_params(params))}};
  std::ofstream(o.out) << r.dump() << "\n";
}

// Runs one configuration as `world` processes of this program; returns every rank's numbers.
std::vector<json> run_config(const Options& o, const std::string& model, const std::string& mode, int world,
                             const std::filesystem::path& scratch) {
  return bench::run_rank_processes(
      "zero_memory", model + "-" + mode + "-" + std::to_string(world), world,
      {"--model", model, "--mode", mode, "--optimizer", o.optimizer, "--steps", std::to_string(o.steps), "--batch",
       std::to_string(o.batch), "--threads", std::to_string(o.threads), "--mlp-in", std::to_string(o.mlp_in),
       "--mlp-hidden", std::to_string(o.mlp_hidden), "--mlp-layers", std::to_string(o.mlp_layers)},
      scratch);
}

int64_t max_of(const std::vector<json>& ranks, const char* key) {
  int64_t m = 0;
  for (auto& r : ranks) m = std::max(m, r[key].get<int64_t>());
  return m;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string ratio(int64_t a, int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", b ? static_cast<double>(a) / static_cast<double>(b) : 0.0);
  return buf;
}

int drive(const Options& o) {
  const auto scratch = std::filesystem::temp_directory_path() / ("tandem-zero-memory-" + std::to_string(getpid()));
  std::filesystem::create_directories(scratch);
  json all = json::array();
  for (const auto& model : o.models) {
    std::cout << "\n## " << model << " (" << o.optimizer << ", " << o.steps << " steps, batch " << o.batch
              << " per rank)\n\n"
              << "| ranks | params MiB | unsharded state MiB/rank | zero state MiB (max rank) | state ratio | "
                 "unsharded peak RSS MiB | zero peak RSS MiB (max rank) | RSS ratio | same params |\n"
              << "|---|---|---|---|---|---|---|---|---|\n";
    for (int world : o.worlds) {
      const auto plain = run_config(o, model, "unsharded", world, scratch);
      const auto zero = run_config(o, model, "zero", world, scratch);
      bool same = true;
      for (auto& r : zero) same = same && r["param_hash"] == plain[0]["param_hash"];
      const int64_t ps = max_of(plain, "state_bytes"), zs = max_of(zero, "state_bytes");
      const int64_t pr = max_of(plain, "peak_rss_bytes"), zr = max_of(zero, "peak_rss_bytes");
      std::cout << "| " << world << " | " << mib(plain[0]["param_bytes"].get<int64_t>()) << " | " << mib(ps)
                << " | " << mib(zs) << " | " << ratio(zs, ps) << " | " << mib(pr) << " | " << mib(zr) << " | "
                << ratio(zr, pr) << " | " << (same ? "yes" : "NO") << " |\n"
                << std::flush;
      for (auto& r : plain) all.push_back(r);
      for (auto& r : zero) all.push_back(r);
    }
  }
  std::filesystem::remove_all(scratch);
  if (!o.json_path.empty()) std::ofstream(o.json_path) << all.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zero_memory: optimizer-state bytes and peak RSS per rank, ZeroRedundancyOptimizer vs unsharded"};
  app.add_option("--models", o.models, "mnist and/or mlp");
  app.add_option("--worlds", o.worlds, "world sizes");
  app.add_option("--optimizer", o.optimizer, "adam | sgd (momentum)")->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--steps", o.steps, "training steps per configuration")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "kernel threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--mlp-in", o.mlp_in, "mlp input features");
  app.add_option("--mlp-hidden", o.mlp_hidden, "mlp hidden width");
  app.add_option("--mlp-layers", o.mlp_layers, "mlp hidden layers");
  bool overwrite = false;
  bench::add_json_output(app, o.json_path, overwrite);
  bench::add_rank_options(app, o.rank, o.world, o.store, o.out);
  app.add_option("--model", o.model, "(internal)");
  app.add_option("--mode", o.mode, "(internal) unsharded | zero");
  CLI11_PARSE(app, argc, argv);
  bench::refuse_to_write_over("zero_memory", o.json_path, overwrite);
  return bench::run_rank_or_drive("zero_memory", o.rank, [&] { run_rank(o); }, [&] { return drive(o); });
}
