// ddp_buckets: one training-step timing of the engine's DDP for bench/ddp_buckets.py (which runs the
// sweep, the PyTorch side and writes bench/results/ddp_buckets.json). Prints one JSON object on
// rank 0's stdout (last line); other ranks print nothing.
// Modes:
//   compute   one process, no DDP and no communication: step = zero_grad + forward + loss +
//             backward + SGD step. With --profile, adds the per-op profile (core/profiler.h) and
//             the profiler's 512^3 GEMM rate on the same threads (gemm_peak_gflops).
//   ddp       under a torchrun-like launcher (tandem-run --nproc-per-node N): the same step through
//             DistributedDataParallel with --bucket-cap-mb (a number, or "none" = one bucket holding
//             every gradient, so it is reduced only after backward: no overlap; or "auto" = the reducer's
//             measured cap, ReducerOptions::bucket_cap_mb = 0). Per step: step time,
//             backward time (its end includes the reducer's finalize) and ReducerStats'
//             exposed_comm_ms (finalize waiting for the buckets). Then, with no compute running,
//             the all-reduce alone: of every gradient as one flat buffer in the group's comm_buffer,
//             as DDP's buckets are (allreduce_all_ms; in place in shared memory on one host), the same
//             in ordinary memory (allreduce_all_staged_ms), and of the bucket layout launched back to
//             back (bucket_comm_ms); with the group's transport and how many allreduces took each path.
// Models: mnist (nn/models/mnist_net, Fashion-MNIST shaped random input) and mlp (nn/models/mlp,
// 1024 -> 2048 x6 -> 10 by default). Inputs and labels are random but fixed (seed 1) and the same
// on every rank; the loss is nll_loss(log_softmax(out)); the optimizer SGD lr 1e-4 (no momentum).
// Times are rank 0's; medians over --steps steps after --warmup untimed ones (the first DDP
// iteration rebuilds the buckets, so --warmup is at least 1 in ddp mode).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/profiler.h"
#include "kernels/linear.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "dist/parallel/ddp.h"
#include "dist/store/env.h"
#include "dist/group/process_group_factory.h"
#include "dist/group/process_group_gloo.h"
#include "dist/store/tcp_store.h"
#include "nn/functional.h"
#include "nn/models/mlp.h"
#include "nn/models/mnist_net.h"
#include "optim/optimizer.h"

namespace {

using namespace tandem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

Tensor random_uniform(const Shape& shape) {
  Tensor t = Tensor::empty(shape, kFloat32);
  Generator& g = default_generator();
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(g.uniform(-1.0, 1.0));
  return t;
}

struct Options {
  std::string mode = "ddp", model = "mlp", bucket_cap = "25";
  double first_bucket_cap_mb = 1.0;
  int steps = 10, warmup = 2, batch = 64, threads = 1;
  int64_t mlp_in = 1024, mlp_hidden = 2048, mlp_layers = 6;
  bool gradient_as_bucket_view = false, profile = false;
  double timeout_s = 300;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ddp_buckets: DDP step time, exposed communication and all-reduce alone (bench/ddp_buckets.py)"};
  app.add_option("--mode", o.mode, "compute | ddp")->check(CLI::IsMember({"compute", "ddp"}));
  app.add_option("--model", o.model, "mlp | mnist")->check(CLI::IsMember({"mlp", "mnist"}));
  app.add_option("--bucket-cap-mb", o.bucket_cap,
                 "MiB per bucket, none (one bucket after backward) or auto (the reducer measures)");
  app.add_option("--first-bucket-cap-mb", o.first_bucket_cap_mb, "MiB of the first bucket (DDP: 1)");
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", o.batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "kernel threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--mlp-in", o.mlp_in, "mlp input features");
  app.add_option("--mlp-hidden", o.mlp_hidden, "mlp hidden width");
  app.add_option("--mlp-layers", o.mlp_layers, "mlp hidden layers");
  app.add_flag("--gradient-as-bucket-view", o.gradient_as_bucket_view, "DDP gradient_as_bucket_view");
  app.add_flag("--profile", o.profile, "compute mode: per-op profile in the output");
  app.add_option("--timeout", o.timeout_s, "seconds for the store and every collective");
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(o.threads);
    manual_seed(1);
    std::shared_ptr<nn::Module> net;
    Tensor x;
    if (o.model == "mlp") {
      nn::models::MlpOptions mo{o.mlp_in, o.mlp_hidden, o.mlp_layers, 10};
      net = std::make_shared<nn::models::Mlp>(mo);
      x = random_uniform({o.batch, o.mlp_in});
    } else {
      net = std::make_shared<nn::models::MnistNet>();
      x = random_uniform({o.batch, 1, 28, 28});
    }
    std::vector<int64_t> labels(static_cast<size_t>(o.batch));
    for (auto& l : labels) l = static_cast<int64_t>(default_generator().below(10));
    Tensor y = Tensor::from_vector<int64_t>(labels, {o.batch});
    net->train();
    int64_t n_params = 0;
    for (auto& [name, p] : net->named_parameters()) n_params += p.numel();

    json out;
    out["framework"] = "tandem";
    out["mode"] = o.mode;
    out["model"] = o.model;
    out["params"] = n_params;
    out["grad_bytes"] = n_params * 4;
    out["batch"] = o.batch;
    out["threads"] = o.threads;
    out["steps"] = o.steps;
    out["warmup"] = o.warmup;

    std::shared_ptr<dist::Store> store;
    std::shared_ptr<dist::ProcessGroup> group;
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    int rank = 0, world = 1;
    if (o.mode == "ddp") {
      TANDEM_CHECK(std::getenv("WORLD_SIZE") != nullptr,
                   "ddp_buckets --mode ddp: run it under tandem-run (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
      const dist::DistEnv env = dist::env_from_launcher("pytorch");
      rank = env.rank;
      world = env.world_size;
      const dist::Millis timeout(static_cast<int64_t>(o.timeout_s * 1000));
      dist::TCPStoreOptions so;
      so.timeout = timeout;
      so.num_workers = world;
      store = std::make_shared<dist::TCPStore>(env.master_addr, env.master_port, rank == 0, so);
      group = dist::make_process_group("gloo", store, rank, world, timeout);
      dist::DDPOptions d;
      if (o.bucket_cap == "none") {
        d.reducer.bucket_cap_mb = d.reducer.first_bucket_cap_mb = 1e9;
      } else if (o.bucket_cap == "auto") {
        d.reducer.bucket_cap_mb = 0;  // measured by the reducer's constructor
        d.reducer.first_bucket_cap_mb = o.first_bucket_cap_mb;
      } else {
        d.reducer.bucket_cap_mb = std::stod(o.bucket_cap);
        d.reducer.first_bucket_cap_mb = o.first_bucket_cap_mb;
      }
      d.reducer.gradient_as_bucket_view = o.gradient_as_bucket_view;
      d.broadcast_buffers = true;
      ddp = std::make_unique<dist::DistributedDataParallel>(net, group, d);
      const auto& a = ddp->reducer().auto_bucket_cap();
      if (a.measured)
        out["auto_cap"] = {{"cap_mb", a.cap_mb}, {"latency_us", a.latency_us},
                           {"bandwidth_gbps", a.bandwidth_gbps}, {"probe_mb", a.probe_mb}};
      out["world"] = world;
      out["bucket_cap_mb"] = o.bucket_cap;
      out["first_bucket_cap_mb"] =
          o.bucket_cap == "none" ? std::string("none") : std::to_string(o.first_bucket_cap_mb);
      if (o.warmup < 1) o.warmup = 1;
    } else {
      out["world"] = 1;
    }
    nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;
    optim::SGD sgd(model.parameters(), optim::SGDOptions{1e-4, 0.0, 0.0, 0.0, false});

    std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms, exposed_ms, finalize_ms;
    int64_t buckets = 0, bytes = 0;
    for (int it = 0; it < o.warmup + o.steps; ++it) {
      const bool timed = it >= o.warmup;
      if (timed && it == o.warmup && o.profile) {
        profiler::reset();
        profiler::set_enabled(true);
      }
      const auto t0 = Clock::now();
      sgd.zero_grad();
      Tensor out_t = model(x);
      Tensor loss = F::nll_loss(F::log_softmax(out_t, -1), y);
      const double f = ms_since(t0);
      const auto t1 = Clock::now();
      loss.backward();
      const double b = ms_since(t1);
      const auto t2 = Clock::now();
      sgd.step();
      const double s = ms_since(t2);
      const double total = ms_since(t0);
      if (!timed) continue;
      step_ms.push_back(total);
      fwd_ms.push_back(f);
      bwd_ms.push_back(b);
      opt_ms.push_back(s);
      if (ddp) {
        const auto& st = ddp->reducer().stats();
        exposed_ms.push_back(st.exposed_comm_ms);
        finalize_ms.push_back(st.finalize_ms);
        buckets = st.buckets;
        bytes = st.bytes;
      }
    }
    if (o.profile) profiler::set_enabled(false);
    out["step_ms"] = median(step_ms);
    out["step_ms_mean"] = mean(step_ms);
    out["step_ms_all"] = step_ms;
    out["forward_ms"] = median(fwd_ms);
    out["backward_ms"] = median(bwd_ms);
    out["optimizer_ms"] = median(opt_ms);

    if (ddp) {
      out["exposed_comm_ms"] = median(exposed_ms);
      out["exposed_comm_ms_mean"] = mean(exposed_ms);
      out["finalize_ms"] = median(finalize_ms);  // waits + writing the gradients back
      out["buckets"] = buckets;
      out["bucket_bytes"] = bytes;
      // The all-reduce alone, nothing else running: every gradient in one buffer, then the DDP
      // bucket layout launched back to back (as the reducer does) and waited.
      std::vector<int64_t> sizes;
      const nn::NamedTensors params = net->named_parameters();
      for (const auto& b : ddp->reducer().bucket_assignment()) {
        int64_t n = 0;
        for (size_t i : b) n += params[i].second.numel();
        sizes.push_back(n);
      }
      out["bucket_sizes"] = sizes;
      // In the group's comm_buffer, as the reducer's buckets are (shared memory on one host: the
      // all-reduce runs in place); all_staged is ordinary memory (staged through the slots).
      Tensor all = group->comm_buffer(n_params, kFloat32, Device::cpu()).fill_(1.0);
      Tensor all_staged = Tensor::ones({n_params}, kFloat32);
      std::vector<Tensor> bufs;
      for (int64_t n : sizes) bufs.push_back(group->comm_buffer(n, kFloat32, Device::cpu()).fill_(1.0));
      std::vector<double> all_ms, staged_ms, layout_ms;
      group->barrier()->wait(group->timeout());
      for (int it = 0; it < 1 + o.steps; ++it) {
        const auto t0 = Clock::now();
        group->allreduce(all)->wait(group->timeout());
        if (it > 0) all_ms.push_back(ms_since(t0));
        const auto ts = Clock::now();
        group->allreduce(all_staged)->wait(group->timeout());
        if (it > 0) staged_ms.push_back(ms_since(ts));
        const auto t1 = Clock::now();
        std::vector<std::shared_ptr<dist::Work>> works;
        for (auto& buf : bufs) works.push_back(group->allreduce(buf));
        for (auto& w : works) w->wait(group->timeout());
        if (it > 0) layout_ms.push_back(ms_since(t1));
      }
      const double allreduce_all = median(all_ms), layout = median(layout_ms);
      out["allreduce_all_ms"] = allreduce_all;
      out["allreduce_all_staged_ms"] = median(staged_ms);
      if (auto* gloo = dynamic_cast<dist::ProcessGroupGloo*>(group.get())) {
        const auto paths = gloo->allreduce_paths();
        out["transport"] = gloo->allreduce_transport();
        out["allreduce_paths"] = {{"in_place", paths.in_place}, {"through_slots", paths.through_slots},
                                  {"tcp", paths.tcp}};
      }
      out["bucket_comm_ms"] = layout;
      out["hidden_share"] = allreduce_all > 0 ? 1.0 - median(exposed_ms) / allreduce_all : 0.0;
      out["hidden_share_layout"] = layout > 0 ? 1.0 - median(exposed_ms) / layout : 0.0;
      group->barrier()->wait(group->timeout());
    }
    if (o.profile) {
      json ops = json::array();
      for (const auto& s : profiler::snapshot())
        ops.push_back({{"op", s.op},
                       {"backward", s.backward},
                       {"calls", s.calls},
                       {"ms_per_step", 1000.0 * s.seconds / o.steps},
                       {"gflops", s.seconds > 0 ? s.flops / s.seconds / 1e9 : 0.0}});
      out["profile"] = ops;
      out["gemm_peak_gflops"] = kernels::measure_gemm_peak_gflops(o.threads);  // 512^3 f32, best of a few
    }
    if (rank == 0) std::cout << out.dump() << std::endl;
    ddp.reset();
    group.reset();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp_buckets: " << e.what() << "\n";
    return 1;
  }
}
