// allreduce_bench: latency and bus bandwidth of the engine's ProcessGroupGloo::allreduce against Gloo's
// own algorithms called directly, for float32 messages of 4 KiB .. 256 MiB (x4 steps, plus 25 MiB, DDP's
// default bucket, and 100 MiB), so the engine's overhead (queue, worker thread, reduction function) shows
// as a ratio per size.
// Run one process per rank under a torchrun-like launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
//   tandem-run --nproc-per-node 2 build-bench/bench/allreduce_bench --benchmark_out=ar.json
// A single process without those variables runs as world 1 (every algorithm is a copy or a no-op).
// Variants (benchmark names "<variant>/<bytes>"):
//   engine            ProcessGroupGloo::allreduce(float32 tensor) then Work::wait: through shared memory
//                     when every rank is on this host (the default), else Gloo's TCP pairs
//   engine_buffer     the same on a tensor from ProcessGroup::comm_buffer, as DDP's buckets: in place
//                     in shared memory on one host (no staging copy)
//   engine_tcp        the same on a second ProcessGroupGloo made with TANDEM_SHM=0: Gloo's TCP pairs
//                     always (what ranks on different hosts use), against gloo_ring for the overhead
//   gloo_ring         gloo::allreduce(opts) with Algorithm::RING and gloo::sum<float>, on a second Gloo
//                     context made the same way (TCP transport, same interface, same store)
//   gloo_bcube        gloo::allreduce(opts) with Algorithm::BCUBE
//   ring, ring_chunked, halving_doubling
//                     the algorithm classes gloo::AllreduceRing / AllreduceRingChunked /
//                     AllreduceHalvingDoubling<float> (constructed once per size, run() per iteration)
//   nccl              ProcessGroupNccl via make_process_group("nccl"), registered only when this build has
//                     CUDA and a device is visible
// The collectives of sharding, on the engine's groups (engine, engine_tcp, nccl as above); <bytes> is
// the full buffer (reduce-scatter's input, all-gather's output), each rank's shard is bytes/world:
//   rs_engine, rs_engine_tcp, rs_nccl   ProcessGroup::reduce_scatter_tensor (sum) then Work::wait
//   rs_engine_buffer                    the same with the input in ProcessGroup::comm_buffer: in place
//                                       in shared memory on one host (no staging through the slots)
//   ag_engine, ag_engine_tcp, ag_nccl   ProcessGroup::all_gather_into_tensor then Work::wait
// Their bus bandwidth is (n-1)/n * bytes / time (each rank sends and receives that much at best, as
// nccl-tests counts it); all-reduce's is 2(n-1)/n * bytes / time.
// Every iteration starts after a barrier (not timed) so each rank times the collective itself; the
// time is rank 0's (manual time). Iteration counts are fixed per size (not adaptive), so every rank
// runs the same collectives: pass the same flags to every rank. Counters: bytes, busbw_GBps =
// 2(n-1)/n * bytes / mean time, algbw_GBps = bytes / mean time, median_us and busbw_median_GBps
// (the median iteration: what bench/plot.py shows). Sizes run in turn, every variant per size.
// Only rank 0 prints and writes --benchmark_out. Own flags (removed before Google Benchmark sees the rest):
//   --quick          sizes 4 KiB .. 16 MiB and fewer iterations
//   --max-mb=M       largest message (MiB, default 256)
//   --sizes=LIST     exactly these sizes instead, comma-separated bytes with an optional K, M or G
//                    (KiB, MiB, GiB): --sizes=4M,25M,100M
//   --overwrite      let --benchmark_out replace an existing file (refused otherwise, so a run does
//                    not silently replace the committed bench/results/allreduce.json)
//   --budget-mb=M    bytes moved per benchmark, sets the iterations (default 2048; --quick 128),
//                    at least 3 and at most 500 (--quick 100)
// Each variant checks its result once (ones on every rank sum to the world size) before timing.
#include <benchmark/benchmark.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "dist/store/env.h"
#include "dist/group/gloo_store_adapter.h"
#include "dist/group/process_group_factory.h"
#include "dist/group/process_group_gloo.h"
#include "dist/store/tcp_store.h"

namespace {

using namespace tandem;
using Clock = std::chrono::steady_clock;

struct Job {
  int rank = 0, world = 1, local_rank = 0;
  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> engine;
  std::shared_ptr<dist::ProcessGroup> engine_tcp;  // TANDEM_SHM=0
  std::shared_ptr<dist::ProcessGroup> nccl;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> raw;  // the directly driven Gloo context
};

Job& job() {
  static Job j;
  return j;
}

int64_t g_budget_bytes = int64_t{2048} << 20;
int64_t g_max_iterations = 500;

void raw_barrier() {
  gloo::BarrierOptions opts(job().raw);
  opts.setTag(1);
  gloo::barrier(opts);
}

int64_t iterations_for(int64_t bytes) {
  return std::clamp<int64_t>(g_budget_bytes / bytes, 3, g_max_iterations);
}

// How many times the buffer's bytes each rank must move at best: 2(n-1)/n for an all-reduce,
// (n-1)/n for a reduce-scatter or an all-gather.
double bus_factor(bool allreduce) {
  const int n = job().world;
  if (n <= 1) return 1.0;
  return (allreduce ? 2.0 : 1.0) * (n - 1) / n;
}

void set_counters(benchmark::State& state, int64_t bytes, std::vector<double> times, bool allreduce) {
  const int n = job().world;
  const double bus = bus_factor(allreduce);
  const auto iters = static_cast<int64_t>(times.size());
  double seconds = 0;
  for (double t : times) seconds += t;
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0.0 : times[times.size() / 2];
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["world"] = n;
  state.counters["busbw_GBps"] = seconds > 0 ? bus * bytes * iters / seconds / 1e9 : 0.0;
  state.counters["algbw_GBps"] = seconds > 0 ? 1.0 * bytes * iters / seconds / 1e9 : 0.0;
  // The median iteration, robust to a rank descheduled now and then on a loaded machine.
  state.counters["median_us"] = median * 1e6;
  state.counters["busbw_median_GBps"] = median > 0 ? bus * bytes / median / 1e9 : 0.0;
  state.SetBytesProcessed(bytes * iters);
}

// Runs `op` once untimed (checking `check` afterwards), then once per iteration after a barrier,
// timing each run.
void time_loop(benchmark::State& state, int64_t bytes, const std::function<void()>& reset,
               const std::function<void()>& op, const std::function<bool()> check, bool allreduce = true) {
  reset();
  raw_barrier();
  op();
  if (!check()) {
    state.SkipWithError(allreduce ? "wrong result: ones summed over the ranks did not give the world size"
                                  : "wrong result: a shard did not hold what its ranks sent");
    for (auto _ : state) {
    }
    return;
  }
  std::vector<double> times;
  times.reserve(static_cast<size_t>(state.max_iterations));
  for (auto _ : state) {
    raw_barrier();
    const auto t0 = Clock::now();
    op();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(s);
    times.push_back(s);
  }
  set_counters(state, bytes, std::move(times), allreduce);
}

bool all_equal(const float* p, size_t n, float v) {
  return n > 0 && p[0] == v && p[n / 2] == v && p[n - 1] == v;
}

Device device_of(dist::ProcessGroup& pg) {
  return &pg == job().nccl.get() ? Device::cuda(job().local_rank) : Device::cpu();
}

void bm_engine(benchmark::State& state, dist::ProcessGroup& pg) {
  const int64_t bytes = state.range(0), n = bytes / 4;
  const Device dev = device_of(pg);
  Tensor t = Tensor::ones({n}, kFloat32, dev);
  time_loop(
      state, bytes, [&] { t = Tensor::ones({n}, kFloat32, dev); },
      [&] { pg.allreduce(t)->wait(pg.timeout()); },
      [&] {
        Tensor c = t.to(Device::cpu());
        return all_equal(c.data<float>(), static_cast<size_t>(n), static_cast<float>(job().world));
      });
}

// reduce_scatter_tensor of `bytes` (ones everywhere: every element of the shard is the world size);
// the input in the group's comm_buffer when `buffer` (in place in shared memory on one host).
void bm_reduce_scatter(benchmark::State& state, dist::ProcessGroup& pg, bool buffer = false) {
  const int64_t bytes = state.range(0), w = job().world, n = bytes / 4 / w;
  const Device dev = device_of(pg);
  Tensor in = buffer ? pg.comm_buffer(n * w, kFloat32, dev) : Tensor::empty({n * w}, kFloat32, dev);
  Tensor out = Tensor::zeros({n}, kFloat32, dev);
  in.fill_(1.0);
  time_loop(
      state, n * w * 4, [&] { out.fill_(0.0); }, [&] { pg.reduce_scatter_tensor(out, in)->wait(pg.timeout()); },
      [&] {
        Tensor c = out.to(Device::cpu());
        return all_equal(c.data<float>(), static_cast<size_t>(n), static_cast<float>(w));
      },
      /*allreduce=*/false);
}

// all_gather_into_tensor into `bytes` (rank r sends r + 1: the last shard holds the world size).
void bm_all_gather(benchmark::State& state, dist::ProcessGroup& pg) {
  const int64_t bytes = state.range(0), w = job().world, n = bytes / 4 / w;
  const Device dev = device_of(pg);
  Tensor in = Tensor::full({n}, job().rank + 1.0, kFloat32, dev), out = Tensor::zeros({n * w}, kFloat32, dev);
  time_loop(
      state, n * w * 4, [&] { out.fill_(0.0); }, [&] { pg.all_gather_into_tensor(out, in)->wait(pg.timeout()); },
      [&] {
        Tensor c = out.to(Device::cpu());
        return all_equal(c.data<float>() + (w - 1) * n, static_cast<size_t>(n), static_cast<float>(w));
      },
      /*allreduce=*/false);
}

// The engine on a tensor in the group's comm_buffer, as DDP's buckets are (in place in shared memory
// on one host).
void bm_engine_buffer(benchmark::State& state) {
  const int64_t bytes = state.range(0), n = bytes / 4;
  dist::ProcessGroup& pg = *job().engine;
  Tensor t = pg.comm_buffer(n, kFloat32, Device::cpu());
  time_loop(
      state, bytes, [&] { t.fill_(1.0); }, [&] { pg.allreduce(t)->wait(pg.timeout()); },
      [&] { return all_equal(t.data<float>(), static_cast<size_t>(n), static_cast<float>(job().world)); });
}

void bm_gloo(benchmark::State& state, gloo::AllreduceOptions::Algorithm algorithm) {
  const int64_t bytes = state.range(0), n = bytes / 4;
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  time_loop(
      state, bytes, [&] { std::fill(buf.begin(), buf.end(), 1.0f); },
      [&] {
        gloo::AllreduceOptions opts(job().raw);
        opts.setOutput(buf.data(), buf.size());
        opts.setAlgorithm(algorithm);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(2);
        gloo::allreduce(opts);
      },
      [&] { return all_equal(buf.data(), buf.size(), static_cast<float>(job().world)); });
}

template <typename Algo>
void bm_algorithm(benchmark::State& state) {
  const int64_t bytes = state.range(0), n = bytes / 4;
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  std::vector<float*> ptrs{buf.data()};
  Algo algo(job().raw, ptrs, static_cast<int>(n));
  time_loop(
      state, bytes, [&] { std::fill(buf.begin(), buf.end(), 1.0f); }, [&] { algo.run(); },
      [&] { return all_equal(buf.data(), buf.size(), static_cast<float>(job().world)); });
}

// A display reporter that prints nothing (ranks other than 0).
class QuietReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

void connect(int64_t timeout_ms) {
  Job& j = job();
  const char* world = std::getenv("WORLD_SIZE");
  dist::DistEnv env;
  if (world != nullptr) env = dist::env_from_launcher("pytorch");
  j.rank = env.rank;
  j.world = env.world_size;
  j.local_rank = env.local_rank;
  const dist::Millis timeout(timeout_ms);
  dist::TCPStoreOptions so;
  so.timeout = timeout;
  so.num_workers = env.world_size;
  if (env.world_size == 1) {
    so.num_workers.reset();
  }
  j.store = std::make_shared<dist::TCPStore>(env.master_addr, env.master_port, env.rank == 0, so);
  j.engine = dist::make_process_group("gloo", j.store, env.rank, env.world_size, timeout);
  const char* shm = std::getenv("TANDEM_SHM");
  const std::string saved = shm ? shm : "";
  setenv("TANDEM_SHM", "0", 1);
  j.engine_tcp = dist::make_process_group("gloo", j.store, env.rank, env.world_size, timeout);
  if (shm) setenv("TANDEM_SHM", saved.c_str(), 1);
  else unsetenv("TANDEM_SHM");
  gloo::transport::tcp::attr attr;
  attr.hostname = dist::local_address_toward(env.master_addr);
  j.device = gloo::transport::tcp::CreateDevice(attr);
  dist::GlooStoreAdapter adapter(j.store, "bench-raw/");
  auto ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
  ctx->setTimeout(timeout);
  ctx->connectFullMesh(adapter, j.device);
  j.raw = std::move(ctx);
  if (cuda_compiled() && cuda_device_count() > 0)
    j.nccl = dist::make_process_group("nccl", j.store, env.rank, env.world_size, timeout, -1);
}

// "25M" -> 25 MiB; bytes with an optional K/M/G (binary) suffix. Exits with a message on anything else.
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const int64_t scale = unit.empty() ? 1 : unit == "K" ? 1 << 10 : unit == "M" ? 1 << 20 : unit == "G" ? 1 << 30 : 0;
  const int64_t bytes = static_cast<int64_t>(v * static_cast<double>(scale));
  if (used == 0 || scale == 0 || bytes < 4) {
    std::cerr << "allreduce_bench: --sizes: '" << text
              << "' is not a size; expected bytes (at least 4) with an optional K, M or G, e.g. 25M\n";
    std::exit(2);
  }
  return bytes / 4 * 4;  // whole float32 elements
}

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    out.push_back(parse_size(list.substr(start, comma - start)));
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The x4 ladder from 4 KiB to max_mb, with DDP's default bucket (25 MiB) and 100 MiB where they fit.
std::vector<int64_t> default_sizes(double max_mb) {
  const auto max_bytes = static_cast<int64_t>(max_mb * (1 << 20));
  std::vector<int64_t> out;
  for (int64_t b = 4096; b <= max_bytes; b *= 4) out.push_back(b);
  for (int64_t b : {int64_t{25} << 20, int64_t{100} << 20})
    if (b <= max_bytes) out.push_back(b);
  std::sort(out.begin(), out.end());
  return out;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, overwrite = false;
  double max_mb = 256, budget_mb = -1;
  std::string sizes_arg, out_path;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a.rfind("--max-mb=", 0) == 0) {
      max_mb = std::stod(a.substr(9));
    } else if (a.rfind("--budget-mb=", 0) == 0) {
      budget_mb = std::stod(a.substr(12));
    } else if (a.rfind("--sizes=", 0) == 0) {
      sizes_arg = a.substr(8);
    } else if (a == "--overwrite") {
      overwrite = true;
    } else {
      if (a.rfind("--benchmark_out=", 0) == 0) out_path = a.substr(16);
      args.push_back(argv[i]);
    }
  }
  const char* rank_env = std::getenv("RANK");
  if (!out_path.empty() && !overwrite && (!rank_env || std::string(rank_env) == "0") &&
      std::filesystem::exists(out_path)) {
    std::cerr << "allreduce_bench: " << out_path
              << " exists: pass --overwrite to replace it, or name another --benchmark_out file\n";
    return 2;
  }
  if (quick) max_mb = std::min(max_mb, 16.0);
  if (budget_mb <= 0) budget_mb = quick ? 128 : 2048;
  g_budget_bytes = static_cast<int64_t>(budget_mb * (1 << 20));
  if (quick) g_max_iterations = 100;

  try {
    connect(300000);
  } catch (const std::exception& e) {
    std::cerr << "allreduce_bench: cannot set up the process groups: " << e.what() << "\n";
    return 1;
  }
  const int rank = job().rank;
  if (rank != 0) {  // only rank 0 writes the output file
    args.erase(std::remove_if(args.begin() + 1, args.end(),
                              [](char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }),
               args.end());
  }

  const std::vector<int64_t> sizes = sizes_arg.empty() ? default_sizes(max_mb) : parse_sizes(sizes_arg);
  using Algorithm = gloo::AllreduceOptions::Algorithm;
  // Size-major order: every variant of one size runs back to back, so a drift in machine load
  // affects the ratios at a size less than it would if each variant swept all sizes in turn.
  std::vector<std::pair<std::string, std::function<void(benchmark::State&)>>> variants = {
      {"engine", [](benchmark::State& s) { bm_engine(s, *job().engine); }},
      {"engine_buffer", [](benchmark::State& s) { bm_engine_buffer(s); }},
      {"engine_tcp", [](benchmark::State& s) { bm_engine(s, *job().engine_tcp); }},
      {"gloo_ring", [](benchmark::State& s) { bm_gloo(s, Algorithm::RING); }},
      {"gloo_bcube", [](benchmark::State& s) { bm_gloo(s, Algorithm::BCUBE); }},
      {"ring", [](benchmark::State& s) { bm_algorithm<gloo::AllreduceRing<float>>(s); }},
      {"ring_chunked", [](benchmark::State& s) { bm_algorithm<gloo::AllreduceRingChunked<float>>(s); }},
      {"halving_doubling", [](benchmark::State& s) { bm_algorithm<gloo::AllreduceHalvingDoubling<float>>(s); }},
  };
  variants.push_back({"rs_engine", [](benchmark::State& s) { bm_reduce_scatter(s, *job().engine); }});
  variants.push_back({"rs_engine_buffer", [](benchmark::State& s) { bm_reduce_scatter(s, *job().engine, true); }});
  variants.push_back({"rs_engine_tcp", [](benchmark::State& s) { bm_reduce_scatter(s, *job().engine_tcp); }});
  variants.push_back({"ag_engine", [](benchmark::State& s) { bm_all_gather(s, *job().engine); }});
  variants.push_back({"ag_engine_tcp", [](benchmark::State& s) { bm_all_gather(s, *job().engine_tcp); }});
  if (job().nccl) {
    variants.push_back({"nccl", [](benchmark::State& s) { bm_engine(s, *job().nccl); }});
    variants.push_back({"rs_nccl", [](benchmark::State& s) { bm_reduce_scatter(s, *job().nccl); }});
    variants.push_back({"ag_nccl", [](benchmark::State& s) { bm_all_gather(s, *job().nccl); }});
  }
  for (int64_t b : sizes)
    for (auto& [name, fn] : variants)
      benchmark::RegisterBenchmark(name.c_str(), fn)
          ->Arg(b)
          ->Iterations(iterations_for(b))
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);

  int bargc = static_cast<int>(args.size());
  benchmark::Initialize(&bargc, args.data());
  benchmark::AddCustomContext("world_size", std::to_string(job().world));
  benchmark::AddCustomContext("transport", "gloo tcp " + job().device->str());
  benchmark::AddCustomContext("cpu_model", cpu_model());
  if (auto* gloo = dynamic_cast<dist::ProcessGroupGloo*>(job().engine.get()))
    benchmark::AddCustomContext("engine_transport", gloo->allreduce_transport());
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    QuietReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  // Leave together: rank 0's store must outlive the others' last use of it.
  raw_barrier();
  job().nccl.reset();
  job().engine.reset();
  job().engine_tcp.reset();
  job().raw.reset();
  return 0;
}
