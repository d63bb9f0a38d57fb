#include "trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "core/autograd.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "dist/ddp.h"
#include "dist/env.h"
#include "dist/process_group_factory.h"
#include "dist/tcp_store.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "kernels/elementwise.h"
#include "metrics.h"
#include "nn/functional.h"
#include "nn/models/mnist_net.h"
#include "optim/optimizer.h"

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

Device choose_device(const std::string& text, int local_rank) {
  if (text == "auto") {
    const int n = cuda_device_count();
    return n > 0 ? Device::cuda(dist::cuda_device_for(local_rank, n)) : Device::cpu();
  }
  Device d = Device::parse(text);
  if (d.is_cuda()) {
    TANDEM_CHECK(cuda_compiled(), "--device ", text, ": this build has no CUDA backend");
    const int n = cuda_device_count();
    TANDEM_CHECK(d.index < n, "--device ", text, ": only ", n, " CUDA device(s) visible");
  }
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
  TANDEM_CHECK(backend != "gloo" || device.is_cpu(), "--backend gloo works on CPU tensors; use --device cpu "
               "or --backend nccl");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout_s * 1000));
  dist::TCPStoreOptions so;
  so.timeout = timeout;
  so.num_workers = d.env.world_size;
  d.store = std::make_shared<dist::TCPStore>(d.env.master_addr, d.env.master_port, d.env.rank == 0, so);
  d.group = dist::make_process_group(backend, d.store, d.env.rank, d.env.world_size, timeout,
                                     device.is_cuda() ? device.index : -1);
  return d;
}

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t correct = 0, total = 0;
};

EvalResult evaluate(nn::Module& model, data::DataLoader& loader, Device device, dist::ProcessGroup* group) {
  NoGradGuard no_grad;
  model.eval();
  EvalResult r;
  double loss_sum = 0;
  loader.begin_epoch(0);
  while (auto batch = loader.next()) {
    Tensor x = batch->images.to(device), y = batch->labels.to(device);
    Tensor out = model(x);
    const int64_t n = x.size(0);
    loss_sum += F::nll_loss(out, y).item<double>() * static_cast<double>(n);
    std::vector<int64_t> pred = kernels::argmax(out).to_vector<int64_t>();
    std::vector<int64_t> truth = batch->labels.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) r.correct += pred[i] == truth[i];
    r.total += n;
  }
  model.train();
  if (group) {  // each rank evaluated its own shard: add up the counts
    Tensor sums = Tensor::from_vector<double>(
        {loss_sum, static_cast<double>(r.correct), static_cast<double>(r.total)}, {3});
    group->allreduce(sums)->wait(group->timeout());
    loss_sum = sums.data<double>()[0];
    r.correct = static_cast<int64_t>(sums.data<double>()[1]);
    r.total = static_cast<int64_t>(sums.data<double>()[2]);
  }
  r.loss = r.total ? loss_sum / static_cast<double>(r.total) : 0.0;
  r.accuracy = r.total ? static_cast<double>(r.correct) / static_cast<double>(r.total) : 0.0;
  return r;
}

}  // namespace

void run_training(const TrainOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const dist::DistEnv env = o.launcher == "none" ? dist::DistEnv{} : dist::env_from_launcher(o.launcher);
  const Device device = choose_device(o.device, env.local_rank);
  Distributed d = init_distributed(o, env, device);
  const int rank = d.env.rank, world = d.active() ? d.env.world_size : 1;
  if (rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 speaks for the job
  manual_seed(o.seed);

  auto train_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Train);
  auto test_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Test);
  if (o.limit > 0) train_set->limit(o.limit);
  if (o.test_limit > 0) test_set->limit(o.test_limit);
  spdlog::info("data: {} ({} train, {} test samples)", describe_data(o.data_dir), train_set->size(),
               test_set->size());
  spdlog::info("device: {}, threads: {}", device.str(), num_threads());
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

  auto net = std::make_shared<nn::models::MnistNet>();
  if (!o.init_weights.empty()) {
    nn::load_weights(*net, o.init_weights);
    spdlog::info("initial weights: {}", o.init_weights);
  }
  net->to(device);
  net->train();
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (d.active()) {
    dist::DDPOptions ddp_options;
    ddp_options.reducer.bucket_cap_mb = o.bucket_cap_mb;
    ddp_options.reducer.first_bucket_cap_mb = o.first_bucket_cap_mb;
    ddp_options.reducer.find_unused_parameters = o.find_unused_parameters;
    ddp_options.reducer.gradient_as_bucket_view = o.gradient_as_bucket_view;
    ddp_options.reducer.comm_hook = dist::comm_hook_by_name(o.comm_hook);
    ddp = std::make_unique<dist::DistributedDataParallel>(net, d.group, ddp_options);
  }
  nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;
  double lr = o.lr;
  if (o.auto_scale_lr_base_batch > 0) {
    lr = o.lr * static_cast<double>(o.batch_size * world) / static_cast<double>(o.auto_scale_lr_base_batch);
    spdlog::info("auto-scale-lr: lr {} x ({} x {}) / {} = {}", o.lr, o.batch_size, world,
                 o.auto_scale_lr_base_batch, lr);
  }
  auto optimizer = make_optimizer(o, lr, model.parameters());
  MetricsWriter metrics(rank == 0 ? o.metrics_out : "");  // rank 0 writes the job's files

  const int64_t iters = train_loader.num_batches();
  optim::StepLR epoch_schedule(*optimizer, 1, o.gamma);
  optim::CosineAnnealingLR iter_schedule(*optimizer, iters * o.epochs);
  const bool cosine = o.lr_schedule == "cosine";

  spdlog::info("training: {} epochs x {} iterations, batch {}{}, {} lr {}", o.epochs, iters, o.batch_size,
               world > 1 ? " per rank x " + std::to_string(world) + " ranks" : "", o.optimizer, lr);
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double window_time = 0, window_data = 0;
    int64_t window_n = 0, samples = 0;
    train_loader.begin_epoch(epoch - 1);
    auto tick = Clock::now();
    for (int64_t it = 1;; ++it) {
      auto batch = train_loader.next();
      if (!batch) break;
      const double data_time = seconds_since(tick);
      Tensor x = batch->images.to(device), y = batch->labels.to(device);
      Tensor loss = F::nll_loss(model(x), y);
      optimizer->zero_grad(/*set_to_none=*/!o.gradient_as_bucket_view);
      loss.backward();
      optimizer->step();
      const double lr_used = optimizer->lr();
      if (cosine) iter_schedule.step();
      samples += x.size(0);

      const bool log_now = it % o.log_interval == 0 || it == iters;
      double loss_value = 0;
      if (metrics.enabled() || log_now) loss_value = loss.item<double>();  // syncs a GPU
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
        record["bucket_bytes"] = st.bytes;
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
    }
    const double train_seconds = seconds_since(epoch_start);
    samples *= world;  // every rank ran the same number of batches of this size
    metrics.write({{"type", "epoch"}, {"epoch", epoch}, {"samples", samples}, {"seconds", train_seconds},
                   {"samples_per_s", samples / train_seconds}});
    spdlog::info("Epoch(train) [{}] done: {} samples in {:.1f} s ({:.0f} samples/s)", epoch, samples,
                 train_seconds, samples / train_seconds);

    EvalResult ev = evaluate(*net, test_loader, device, d.group.get());
    metrics.write({{"type", "eval"}, {"epoch", epoch}, {"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}});
    spdlog::info("Epoch(test) [{}] test_loss: {:.4f} accuracy: {:.4f} ({}/{})", epoch, ev.loss, ev.accuracy,
                 ev.correct, ev.total);
    if (!cosine) epoch_schedule.step();
  }

  if (!o.save_weights.empty() && rank == 0) {
    nn::save_weights(*net, o.save_weights);
    spdlog::info("weights saved: {}", o.save_weights);
  }
}

}  // namespace tandem::app
