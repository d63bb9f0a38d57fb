// Resume contract: a checkpoint names the next position to run (epoch E,
// batches already done in it); everything that decides later losses (weights,
// BN buffers, optimizer state, schedule, default RNG, the epoch's sample order
// via (seed, epoch), the batches to skip) is restored, so a resumed run's
// per-iteration losses are bitwise those of an uninterrupted one.
//
// --cuda-graph (CUDA, one rank): after kGraphWarmup uncaptured iterations in this process (so the
// caching allocator holds every block the step needs and every gradient and optimizer buffer
// exists), each full batch is copied into fixed input/label tensors and one captured graph of
// forward + backward + optimizer step (plus a copy of the loss into a fixed tensor) is replayed;
// the loss is read from that tensor after the replay. The graph is captured again whenever the
// lr changes (StepLR, once per epoch: the lr is a kernel argument baked into the capture), after
// one more eager step. Warm-up steps run the very same code on the fixed tensors, so the capture
// allocates exactly what the warm-up left in the cache. Partial batches run uncaptured. Gradients
// are zeroed in place (never set to none) for the whole run so their storage stays where the graph
// writes it. BatchNorm's num_batches_tracked counter is kept on the host (its device update would
// sync inside the capture) and advanced here after each replay.
// Refused with one line: a CPU device, --amp fp16 (the scaler syncs), Adam (its bias correction
// changes every step), --lr-schedule cosine (the lr changes every step), DDP with world size > 1
// (the reducer's bucket hooks are host logic that a replay skips).
#include "trainer.h"

#include <spdlog/spdlog.h>

#include <signal.h>
#include <spdlog/sinks/basic_file_sink.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "core/autograd.h"
#include "core/cuda/graph.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "core/profiler.h"
#include "dist/ddp.h"
#include "dist/sync_batch_norm.h"
#include "dist/env.h"
#include "dist/host_values.h"
#include "dist/process_group_factory.h"
#include "dist/tcp_store.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "metrics.h"
#include "nn/amp.h"
#include "nn/functional.h"
#include "nn/models/mnist_net.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/stop_signal.h"
#include "train/work_dir.h"

namespace tandem::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

// The process's device (dist::resolve_device), made the process's current CUDA device once here,
// before any stream, handle or communicator exists.
Device choose_device(const std::string& text, int local_rank) {
  const Device d = dist::resolve_device(text, local_rank);
  if (d.is_cuda()) set_cuda_device(d.index);
  return d;
}

std::string describe_data(const std::string& dir) {
  if (dir == kDefaultDataDir) return "Fashion-MNIST (Debian's dataset-fashion-mnist) in " + dir;
  return dir;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, double lr, std::vector<Tensor> params) {
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(std::move(params),
                                        optim::SGDOptions{lr, o.momentum, 0.0, o.weight_decay, false});
  if (o.optimizer == "adam") {
    optim::AdamOptions a;
    a.lr = lr;
    a.weight_decay = o.weight_decay;
    return std::make_unique<optim::Adam>(std::move(params), a);
  }
  return std::make_unique<optim::Adadelta>(std::move(params), optim::AdadeltaOptions{lr, 0.9, 1e-6, o.weight_decay});
}

// The job's place in a distributed run; world_size 1 without a launcher.
struct Distributed {
  dist::DistEnv env;
  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> group;
  // The per-iteration stop agreement's group: `group` itself when it is Gloo, else a Gloo group
  // beside NCCL, so that agreeing never waits for the GPU (a device group's result would have to
  // come back through the compute stream, behind the whole step).
  std::shared_ptr<dist::ProcessGroup> host_group;
  bool active() const { return group != nullptr; }
};

Distributed init_distributed(const TrainOptions& o, const dist::DistEnv& env, Device device) {
  Distributed d;
  d.env = env;
  if (o.launcher == "none" || d.env.world_size == 1) return d;
  std::string backend = o.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  TANDEM_CHECK(backend != "nccl" || device.is_cuda(), "--backend nccl needs a CUDA device, got --device ",
               device.str());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout_s * 1000));
  dist::TCPStoreOptions so;
  so.timeout = timeout;
  so.num_workers = d.env.world_size;
  d.store = std::make_shared<dist::TCPStore>(d.env.master_addr, d.env.master_port, d.env.rank == 0, so);
  d.group = dist::make_process_group(backend, d.store, d.env.rank, d.env.world_size, timeout,
                                     device.is_cuda() ? device.index : -1);
  d.host_group = d.group->comm_device().is_cpu()
                     ? d.group
                     : dist::make_process_group("gloo", d.store, d.env.rank, d.env.world_size, timeout);
  return d;
}

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t correct = 0, total = 0;
};

EvalResult evaluate(nn::Module& model, data::DataLoader& loader, Device device, dist::ProcessGroup* group,
                    amp::Precision precision) {
  NoGradGuard no_grad;
  model.eval();
  EvalResult r;
  double loss_sum = 0;
  loader.begin_epoch(0);
  while (auto batch = loader.next()) {
    Tensor x = batch->images.to(device), y = batch->labels.to(device);
    Tensor out;
    {
      amp::AutocastGuard autocast(precision);
      out = model(x);
    }
    const int64_t n = x.size(0);
    loss_sum += F::nll_loss(out, y).item<double>() * static_cast<double>(n);
    std::vector<int64_t> pred = kernels::argmax(out).to_vector<int64_t>();
    std::vector<int64_t> truth = batch->labels.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) r.correct += pred[i] == truth[i];
    r.total += n;
  }
  model.train();
  if (group) {  // each rank evaluated its own shard: add up the counts
    const std::vector<double> sums = dist::allreduce_values(
        *group, {loss_sum, static_cast<double>(r.correct), static_cast<double>(r.total)}, dist::ReduceOp::Sum,
        "the evaluation's sums");
    loss_sum = sums[0];
    r.correct = static_cast<int64_t>(sums[1]);
    r.total = static_cast<int64_t>(sums[2]);
  }
  r.loss = r.total ? loss_sum / static_cast<double>(r.total) : 0.0;
  r.accuracy = r.total ? static_cast<double>(r.correct) / static_cast<double>(r.total) : 0.0;
  return r;
}


// Under DDP every rank must stop at the same iteration: the largest signal number any rank saw
// wins (one 1-element all-reduce per iteration, on the host group: no wait for the GPU).
int agree_on_stop(const Distributed& d, int local) {
  if (!d.active()) return local;
  return static_cast<int>(
      dist::allreduce_values(*d.host_group, {static_cast<double>(local)}, dist::ReduceOp::Max, "the stop agreement")[0]);
}

// Why --cuda-graph cannot run with these settings ("" when it can). `world` is the launcher's world size.
std::string cuda_graph_refusal(const TrainOptions& o, const Device& device, int world) {
  if (o.amp == "fp16")
    return "--cuda-graph cannot capture --amp fp16: the loss scaler reads found_inf on the host every step; "
           "use --amp bf16 (no scaler) or --amp off";
  if (o.optimizer == "adam")
    return "--cuda-graph cannot capture --optimizer adam: its bias correction changes every step and would be "
           "frozen in the graph; use --optimizer sgd or adadelta";
  if (o.lr_schedule == "cosine")
    return "--cuda-graph needs an lr that is constant within an epoch (the lr is frozen in the captured "
           "optimizer kernels); use --lr-schedule step, not cosine";
  if (o.launcher != "none" && world > 1) {
    const std::string backend = o.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : o.backend;
    return "--cuda-graph does not support DDP (" + std::to_string(world) + " ranks over " + backend +
           "): the reducer's bucket hooks are host logic that a replayed graph skips; run one rank or drop "
           "--cuda-graph";
  }
  if (!device.is_cuda())
    return "--cuda-graph needs a CUDA device, got --device " + o.device + " (resolved to " + device.str() + ")";
  return "";
}

// Config keys a resumed run must share with the checkpoint's run.
const char* const kResumeKeys[] = {"model",          "data.batch_size", "data.limit", "data.shuffle",
                                   "optimizer.type", "schedule.type",   "train.seed"};

void check_resumable(const train::Checkpoint& c, const std::string& path, const train::Json& config, int world,
                     int64_t iters) {
  const train::Json& saved = c.meta.at("config");
  for (const char* key : kResumeKeys) {
    const train::Json& then = train::get_path(saved, key);
    const train::Json& now = train::get_path(config, key);
    TANDEM_CHECK(then == now, "checkpoint '", path, "' was written with ", key, " = ", then.dump(),
                 " but this run has ", now.dump(), "; resume with the checkpoint's config");
  }
  const int saved_world = c.meta.at("world_size").get<int>();
  TANDEM_CHECK(saved_world == world, "checkpoint '", path, "' was written by ", saved_world,
               " rank(s) but this run has ", world, "; resume with the same number of ranks");
  const int64_t saved_iters = c.meta.at("iters_per_epoch").get<int64_t>();
  TANDEM_CHECK(saved_iters == iters, "checkpoint '", path, "' has ", saved_iters,
               " iterations per epoch but this run has ", iters, "; resume with the same data and batch size");
}

// Adds the work dir's log file to the default logger (same lines as the console).
void log_to_file(const std::string& file) {
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
  spdlog::default_logger()->sinks().push_back(sink);
  spdlog::set_pattern("%Y/%m/%d %H:%M:%S - %v");
}

}  // namespace

int run_training(const TrainOptions& o, const train::Json& config) {
  if (o.threads > 0) set_num_threads(o.threads);
  if (o.profile) profiler::set_enabled(true);
  const amp::Precision precision = amp::parse_precision(o.amp);
  const dist::DistEnv env = o.launcher == "none" ? dist::DistEnv{} : dist::env_from_launcher(o.launcher);
  const std::string work_dir = o.work_dir.empty() ? train::default_work_dir(o.config_file) : o.work_dir;
  const Device device = choose_device(o.device, env.local_rank);
  if (o.cuda_graph) {
    const std::string why = cuda_graph_refusal(o, device, o.launcher == "none" ? 1 : env.world_size);
    TANDEM_CHECK(why.empty(), why);
  }
  const bool writer = env.rank == 0;  // rank 0 writes the job's files
  const std::string stamp = train::run_timestamp();
  if (writer) {
    train::create_work_dir(work_dir);
    log_to_file(work_dir + "/" + stamp + ".log");
    train::Json resolved = config;
    resolved["work_dir"] = work_dir;
    train::write_file_atomic(work_dir + "/config.json", resolved.dump(2) + "\n");
  }
  Distributed d = init_distributed(o, env, device);
  const int rank = d.env.rank, world = d.active() ? d.env.world_size : 1;
  if (rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 speaks for the job
  manual_seed(o.seed);

  std::optional<train::Checkpoint> resume;
  std::string resume_path;
  if (!o.resume.empty()) {
    resume_path = o.resume == "auto" ? train::CheckpointManager::latest(work_dir) : o.resume;
    resume = train::load_checkpoint(resume_path);
  }

  auto train_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Train);
  auto test_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Test);
  if (o.limit > 0) train_set->limit(o.limit);
  if (o.test_limit > 0) test_set->limit(o.test_limit);
  spdlog::info("data: {} ({} train, {} test samples)", describe_data(o.data_dir), train_set->size(),
               test_set->size());
  spdlog::info("device: {}, threads: {}", device.str(), num_threads());
  spdlog::info("work dir: {}{}", work_dir, o.config_file.empty() ? "" : " (config " + o.config_file + ")");
  if (d.active())
    spdlog::info("distributed: {} ranks over {} (launcher {}), bucket cap {} MiB, comm hook {}", world,
                 d.group->backend(), o.launcher, o.bucket_cap_mb, o.comm_hook);

  std::shared_ptr<data::Sampler> sampler, test_sampler;
  if (d.active()) {
    sampler = std::make_shared<data::DistributedSampler>(train_set->size(), world, rank, o.shuffle, o.seed);
    test_sampler = std::make_shared<data::ShardSampler>(test_set->size(), world, rank);
  } else {
    if (o.shuffle)
      sampler = std::make_shared<data::RandomSampler>(train_set->size(), o.seed);
    else
      sampler = std::make_shared<data::SequentialSampler>(train_set->size());
    test_sampler = std::make_shared<data::SequentialSampler>(test_set->size());
  }
  data::DataLoader train_loader(train_set, sampler, o.batch_size);
  data::DataLoader test_loader(test_set, test_sampler, o.test_batch_size);
  const int64_t iters = train_loader.num_batches();
  if (resume) check_resumable(*resume, resume_path, config, world, iters);

  auto net = std::make_shared<nn::models::MnistNet>();
  if (resume) {
    try {
      net->load_state_dict(resume->weights);
    } catch (const Error& e) {
      TANDEM_FAIL("checkpoint '", resume_path, "': ", e.what());
    }
  } else if (!o.init_weights.empty()) {
    nn::load_weights(*net, o.init_weights);
    spdlog::info("initial weights: {}", o.init_weights);
  }
  net->to(device);
  net->train();
  // --cuda-graph: BatchNorm counts batches on the host (count_batch does no device work for a host
  // counter, so the forward can be captured); the loop advances the counters after each replay.
  std::vector<Tensor> batch_counters;
  if (o.cuda_graph) {
    const std::string suffix = "num_batches_tracked";
    for (auto& [name, t] : net->named_buffers()) {
      if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      Tensor counter = t;  // shares the module's tensor: set_data moves it for the module too
      counter.set_data(counter.to(Device::cpu()));
      batch_counters.push_back(counter);
    }
  }
  if (o.sync_bn && d.active()) {
    const int n = dist::convert_sync_batchnorm(*net, d.group);
    spdlog::info("sync_bn: {} BatchNorm layer(s) synchronised across {} ranks", n, world);
  }
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (d.active()) {
    dist::DDPOptions ddp_options;
    ddp_options.reducer.bucket_cap_mb = o.bucket_cap_mb;
    ddp_options.reducer.first_bucket_cap_mb = o.first_bucket_cap_mb;
    ddp_options.reducer.find_unused_parameters = o.find_unused_parameters;
    ddp_options.reducer.gradient_as_bucket_view = o.gradient_as_bucket_view;
    ddp_options.reducer.static_graph = o.static_graph;
    ddp_options.broadcast_buffers = o.broadcast_buffers;
    dist::CommHookOptions hook_options;
    hook_options.powersgd_rank = o.powersgd_rank;
    hook_options.powersgd_start_iter = o.powersgd_start_iter;
    ddp_options.reducer.comm_hook = dist::comm_hook_by_name(o.comm_hook, hook_options);
    ddp = std::make_unique<dist::DistributedDataParallel>(net, d.group, ddp_options);
    if (const auto& a = ddp->reducer().auto_bucket_cap(); a.measured)
      spdlog::info("auto bucket cap: all-reduce latency {:.0f} us, bandwidth {:.2f} GB/s -> {:.2f} MiB",
                   a.latency_us, a.bandwidth_gbps, a.cap_mb);
  }
  nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;
  double lr = o.lr;
  if (o.auto_scale_lr_base_batch > 0) {
    lr = o.lr * static_cast<double>(o.batch_size * world) / static_cast<double>(o.auto_scale_lr_base_batch);
    spdlog::info("auto-scale-lr: lr {} x ({} x {}) / {} = {}", o.lr, o.batch_size, world,
                 o.auto_scale_lr_base_batch, lr);
  }
  auto optimizer = make_optimizer(o, lr, model.parameters());
  optim::StepLR epoch_schedule(*optimizer, 1, o.gamma);
  optim::CosineAnnealingLR iter_schedule(*optimizer, iters * o.epochs);
  const bool cosine = o.lr_schedule == "cosine";
  // fp16 needs loss scaling (gradients underflow); bf16 has f32's range and does not.
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = precision == amp::Precision::kFloat16});
  if (precision != amp::Precision::kOff)
    spdlog::info("amp: {} autocast{}", amp::precision_name(precision), scaler.enabled() ? " with loss scaling" : "");

  int64_t start_epoch = 1, skip = 0, global_iter = 0;
  if (resume) {
    const train::Json& m = resume->meta;
    try {
      optimizer->load_state_dict(resume->optimizer);
      if (scaler.enabled() && !resume->scaler.empty()) scaler.load_state_dict(resume->scaler);
      const auto sched = m.at("schedule").at("state").get<std::map<std::string, double>>();
      if (cosine)
        iter_schedule.load_state_dict(sched);
      else
        epoch_schedule.load_state_dict(sched);
      default_generator().set_state(m.at("rng").get<std::string>());
      start_epoch = m.at("epoch").get<int64_t>();
      skip = m.at("iter").get<int64_t>();
      global_iter = m.at("global_iter").get<int64_t>();
    } catch (const Error& e) {
      TANDEM_FAIL("checkpoint '", resume_path, "': ", e.what());
    } catch (const nlohmann::json::exception& e) {
      TANDEM_FAIL("checkpoint '", resume_path, "': bad training state: ", e.what());
    }
    spdlog::info("resumed from {}: epoch {}, {} of {} iterations done (global iteration {})", resume_path,
                 start_epoch, skip, iters, global_iter);
  }

  MetricsWriter metrics;
  if (rank == 0) {
    metrics.add(o.metrics_out, /*append=*/resume.has_value());
    metrics.add(work_dir + "/" + stamp + ".metrics.jsonl", /*append=*/true);
  }
  train::CheckpointManager checkpoints(work_dir, o.max_keep_ckpts);
  // Saves the position "epoch `epoch`, `done` batches of it finished" (rank 0 only).
  auto save_checkpoint = [&](int64_t epoch, int64_t done) {
    if (rank != 0) return;
    train::Checkpoint c;
    for (auto& [name, t] : net->state_dict()) c.weights[name] = t;
    c.optimizer = optimizer->state_dict();
    if (scaler.enabled()) c.scaler = scaler.state_dict();
    c.meta = {{"epoch", epoch},
              {"iter", done},
              {"global_iter", global_iter},
              {"iters_per_epoch", iters},
              {"world_size", world},
              {"rng", default_generator().state()},
              {"schedule", {{"type", o.lr_schedule},
                            {"state", cosine ? iter_schedule.state_dict() : epoch_schedule.state_dict()}}},
              {"sampler", {{"epoch", epoch - 1}, {"batches_done", done}, {"seed", o.seed}, {"shuffle", o.shuffle}}},
              {"amp", o.amp},
              {"config", config}};
    const std::string path = checkpoints.save(c, global_iter);
    spdlog::info("checkpoint saved: {} (epoch {}, {} of {} iterations done, global iteration {})", path, epoch,
                 done, iters, global_iter);
  };

  // --cuda-graph state: the fixed tensors the captured step reads and writes, and the lr it froze.
  constexpr int64_t kGraphWarmup = 3;  // uncaptured iterations in this process before the first capture
  std::unique_ptr<cuda::Graph> graph;
  Tensor graph_x, graph_y, graph_loss;
  double graph_lr = 0;
  int64_t uncaptured_done = 0;  // eager full-batch steps since the last (re)start of the warm-up
  int64_t warmups = 0, captures = 0, replays = 0, partial = 0;
  if (o.cuda_graph) {
    graph = std::make_unique<cuda::Graph>(device.index);
    spdlog::info("cuda graph: capturing forward + backward + {} step after {} warm-up iterations", o.optimizer,
                 kGraphWarmup);
  }

  spdlog::info("training: {} epochs x {} iterations, batch {}{}, {} lr {}", o.epochs, iters, o.batch_size,
               world > 1 ? " per rank x " + std::to_string(world) + " ranks" : "", o.optimizer, lr);
  // The training loss of one batch, its conv and linear layers under the chosen precision.
  auto forward_loss = [&](const Tensor& x, const Tensor& y) {
    amp::AutocastGuard autocast(precision);
    return F::nll_loss(model(x), y);
  };
  int stop = 0;  // the agreed signal that ends the run early
  for (int64_t epoch = start_epoch; epoch <= o.epochs && stop == 0; ++epoch) {
    const auto epoch_start = Clock::now();
    double window_time = 0, window_data = 0;
    int64_t window_n = 0, samples = 0;
    const int64_t first = epoch == start_epoch ? skip : 0;
    train_loader.begin_epoch(epoch - 1, first);
    auto tick = Clock::now();
    for (int64_t it = first + 1;; ++it) {
      auto batch = train_loader.next();
      if (!batch) break;
      const double data_time = seconds_since(tick);
      const int64_t batch_n = batch->images.size(0);
      double loss_value = 0;
      // A NaN or infinite loss ends the run naming the iteration (under fp16 the scaler skips the step).
      auto check_loss = [&](double value) {
        TANDEM_CHECK(std::isfinite(value) || scaler.enabled(), "the loss is ",
                     std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf", " at epoch ", epoch, ", iteration ", it,
                     "/", iters, " (global iteration ", global_iter + 1,
                     "): training diverged; lower optimizer.lr (--lr) or check the data");
      };
      if (o.cuda_graph && batch_n == o.batch_size) {
        // Full batches always go through the fixed tensors, also while warming up, so the warm-up
        // leaves the allocator's cache exactly as the captured step will use it.
        if (!graph_x.defined()) {  // same addresses for the whole run
          graph_x = Tensor::empty(batch->images.shape(), batch->images.dtype(), device);
          graph_y = Tensor::empty(batch->labels.shape(), batch->labels.dtype(), device);
          graph_loss = Tensor::zeros({}, kFloat32, device);
        }
        graph_x.copy_(batch->images);
        graph_y.copy_(batch->labels);
        // The step the graph holds: forward, a copy of the loss, zero_grad in place, backward, step.
        auto step = [&] {
          Tensor loss = forward_loss(graph_x, graph_y);
          graph_loss.copy_(loss);
          optimizer->zero_grad(/*set_to_none=*/false);
          loss.backward();
          optimizer->step();
        };  // its temporaries go back to the cache before it returns (inside the capture)
        if (graph->captured() && graph_lr != optimizer->lr()) {
          // The lr is frozen in the graph: capture again, after one more eager step so the cache
          // holds what the step needs now (an evaluation may have reshaped it since).
          graph->reset();
          uncaptured_done = std::min(uncaptured_done, kGraphWarmup - 1);
        }
        if (uncaptured_done < kGraphWarmup) {
          step();
          ++uncaptured_done;
          ++warmups;
        } else {
          if (!graph->captured()) {
            graph_lr = optimizer->lr();
            graph->begin_capture();
            step();
            graph->end_capture();
            ++captures;
            spdlog::info("cuda graph: captured at epoch {}, iteration {} (lr {})", epoch, it, graph_lr);
          } else {
            for (Tensor& c : batch_counters) c.data<int64_t>()[0] += 1;  // a capture's forward counts once
          }
          graph->replay();
          ++replays;
        }
        loss_value = graph_loss.item<double>();  // syncs: the step (or its replay) has finished
        check_loss(loss_value);                   // a replayed step can only be checked after it ran
      } else {
        Tensor x = batch->images.to(device), y = batch->labels.to(device);
        Tensor loss = forward_loss(x, y);
        loss_value = loss.item<double>();  // syncs a GPU
        check_loss(loss_value);            // before the step, so diverged weights are never stepped
        // Under --cuda-graph, gradients keep their storage (the graph writes there): zero in place.
        optimizer->zero_grad(/*set_to_none=*/!o.gradient_as_bucket_view && !o.cuda_graph);
        if (scaler.enabled()) {
          scaler.scale(loss).backward();
          scaler.step(*optimizer);  // skipped when a gradient is inf/NaN
          scaler.update();
        } else {
          loss.backward();
          optimizer->step();
        }
        if (o.cuda_graph) ++partial;
      }
      const double lr_used = optimizer->lr();
      if (cosine) iter_schedule.step();
      ++global_iter;
      samples += batch_n;

      const bool log_now = it % o.log_interval == 0 || it == iters;
      const double iter_time = seconds_since(tick);
      tick = Clock::now();
      window_time += iter_time;
      window_data += data_time;
      ++window_n;
      nlohmann::json record = {{"type", "train"}, {"epoch", epoch}, {"iter", it}, {"loss", loss_value},
                               {"lr", lr_used}, {"time", iter_time}, {"data_time", data_time}};
      if (ddp) {  // what the reducer did in this step
        const auto& st = ddp->reducer().stats();
        record["buckets"] = st.buckets;
        record["bucket_bytes"] = st.bucket_bytes;  // what plain all-reduce sends
        record["comm_bytes"] = st.bytes;           // what the comm hook sent
        record["exposed_comm_ms"] = st.exposed_comm_ms;
      }
      metrics.write(record);
      if (log_now) {
        const double avg = window_time / window_n;
        const double eta = avg * static_cast<double>((iters - it) + (o.epochs - epoch) * iters);
        spdlog::info("Epoch(train) [{}][{}/{}] lr: {:.4e} eta: {} time: {:.3f} data_time: {:.3f} loss: {:.4f}",
                     epoch, it, iters, lr_used, format_eta(eta), avg, window_data / window_n,
                     loss_value);
        window_time = window_data = 0;
        window_n = 0;
      }
      if (rank == 0 && o.debug_sigterm_at == global_iter) ::raise(SIGTERM);
      if (o.debug_hold_at == global_iter) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while (train::StopSignal::requested() == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      stop = agree_on_stop(d, train::StopSignal::requested());
      if (stop != 0 || (o.checkpoint_interval_iters > 0 && global_iter % o.checkpoint_interval_iters == 0))
        save_checkpoint(epoch, it);
      if (rank == 0 && o.debug_sigkill_at == global_iter) ::raise(SIGKILL);
      if (stop != 0) break;
    }
    if (stop != 0) break;
    const double train_seconds = seconds_since(epoch_start);
    samples *= world;  // every rank ran the same number of batches of this size
    metrics.write({{"type", "epoch"}, {"epoch", epoch}, {"samples", samples}, {"seconds", train_seconds},
                   {"samples_per_s", samples / train_seconds}});
    spdlog::info("Epoch(train) [{}] done: {} samples in {:.1f} s ({:.0f} samples/s)", epoch, samples,
                 train_seconds, samples / train_seconds);

    if ((o.eval_interval > 0 && epoch % o.eval_interval == 0) || epoch == o.epochs) {
      EvalResult ev = evaluate(*net, test_loader, device, d.group.get(), precision);
      metrics.write(
          {{"type", "eval"}, {"epoch", epoch}, {"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}});
      spdlog::info("Epoch(test) [{}] test_loss: {:.4f} accuracy: {:.4f} ({}/{})", epoch, ev.loss, ev.accuracy,
                   ev.correct, ev.total);
    }
    if (!cosine) epoch_schedule.step();
    if (o.checkpoint_interval_epochs > 0 && (epoch % o.checkpoint_interval_epochs == 0 || epoch == o.epochs))
      save_checkpoint(epoch + 1, 0);
  }

  if (stop != 0) {
    // Every rank waits until rank 0's checkpoint is on disk before anyone exits.
    if (d.active()) d.group->barrier()->wait(d.group->timeout());
    spdlog::info("stopped by signal {} ({}); resume with --resume (work dir {})", stop,
                 stop == SIGTERM ? "SIGTERM" : stop == SIGINT ? "SIGINT" : "signal", work_dir);
    return train::StopSignal::exit_code(stop);
  }
  if (o.cuda_graph)
    spdlog::info("cuda graph: {} capture(s), {} replayed iterations, {} warm-up and {} partial-batch iterations "
                 "uncaptured", captures, replays, warmups, partial);
  if (!o.save_weights.empty() && rank == 0) {
    nn::save_weights(*net, o.save_weights);
    spdlog::info("weights saved: {}", o.save_weights);
  }
  if (o.profile && rank == 0) {
    profiler::set_enabled(false);
    spdlog::info("profile (wall time per op, this rank):\n{}",
                 profiler::report(kernels::measure_gemm_peak_gflops(num_threads())));
  }
  return 0;
}

}  // namespace tandem::app
