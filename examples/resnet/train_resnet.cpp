// train_resnet: a ResNet-20-shaped network (the models library's train/models/resnet.h) trained on
// Fashion-MNIST through train::Runner, built against the installed package only. The library
// registers the model as "ResNet" (kwargs width, blocks_per_stage) and the Runner builds it by that name; started by
// tandem-run (or torchrun: RANK is set) the Runner picks the "pytorch" launcher and wraps the model
// in DDP (gradients all-reduced over Gloo), alone it trains in one process.
// Data: the IDX files under --data-dir (data::MnistDataset reads Fashion-MNIST's layout too),
// normalised with Fashion-MNIST's mean and standard deviation; validation on the test split after
// every epoch (every rank's shard, summed).
// Checks, each failing the run with exit 1 and a line saying why:
//   - the loss fell: the mean loss of the last quarter of the run's iterations is under 0.8x the mean
//     of the first quarter's (--smoke runs only this check, in seconds);
//   - --min-accuracy A: the last validation's accuracy is at least A.
// Prints one summary line on rank 0: accuracy, wall time, samples per second.
// Usage: train_resnet [--smoke] [--epochs N] [--batch-size N] [--lr X] [--optimizer sgd|adam]
//        [--width W] [--blocks B] [--limit N] [--test-limit N] [--data-dir DIR] [--work-dir DIR]
//        [--threads N] [--min-accuracy A] [--profile] [--launcher none|pytorch|slurm|mpi]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/profiler.h"
#include "core/thread_pool.h"
#include "data/mnist.h"
#include "kernels/linear.h"
#include "train/models/zoo.h"
#include "train/runner.h"

using namespace tandem;

namespace {

struct Options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string work_dir = "work_dirs/resnet";
  std::string optimizer = "sgd";
  std::string launcher;  // "": pytorch when RANK is set, else none
  int64_t epochs = 6, batch_size = 64, width = 8, blocks = 3, limit = 0, test_limit = 0, log_interval = 50;
  int threads = 0;
  double lr = 0.1, min_accuracy = 0;
  bool profile = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  TANDEM_FAIL(what, " (usage: train_resnet [--smoke] [--epochs N] [--batch-size N] [--lr X] [--optimizer sgd|adam] "
              "[--width W] [--blocks B] [--limit N] [--test-limit N] [--data-dir DIR] [--work-dir DIR] "
              "[--threads N] [--min-accuracy A] [--profile] [--launcher none|pytorch|slurm|mpi])");
}

int64_t to_int(const std::string& flag, const std::string& v, int64_t min) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min)
    usage_error(flag + " expects an integer >= " + std::to_string(min) + ", got \"" + v + "\"");
  return n;
}

double to_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x >= 0)) usage_error(flag + " expects a number >= 0, got \"" + v + "\"");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--smoke") {  // seconds: a few hundred samples, one epoch, a narrow net
      o.limit = 768, o.test_limit = 256, o.epochs = 1, o.batch_size = 32, o.width = 8, o.log_interval = 4;
      continue;
    }
    if (flag == "--profile") {
      o.profile = true;
      continue;
    }
    if (i + 1 >= argc) usage_error("unknown flag or missing value: " + flag);
    const std::string v = argv[++i];
    if (flag == "--epochs") o.epochs = to_int(flag, v, 1);
    else if (flag == "--batch-size") o.batch_size = to_int(flag, v, 1);
    else if (flag == "--width") o.width = to_int(flag, v, 1);
    else if (flag == "--blocks") o.blocks = to_int(flag, v, 1);
    else if (flag == "--limit") o.limit = to_int(flag, v, 0);
    else if (flag == "--test-limit") o.test_limit = to_int(flag, v, 0);
    else if (flag == "--threads") o.threads = static_cast<int>(to_int(flag, v, 0));
    else if (flag == "--log-interval") o.log_interval = to_int(flag, v, 1);
    else if (flag == "--lr") o.lr = to_double(flag, v);
    else if (flag == "--min-accuracy") o.min_accuracy = to_double(flag, v);
    else if (flag == "--data-dir") o.data_dir = v;
    else if (flag == "--work-dir") o.work_dir = v;
    else if (flag == "--optimizer" && (v == "sgd" || v == "adam")) o.optimizer = v;
    else if (flag == "--launcher" && (v == "none" || v == "pytorch" || v == "slurm" || v == "mpi")) o.launcher = v;
    else usage_error("unknown flag or bad value: " + flag + " " + v);
  }
  return o;
}

// Every iteration's loss and the last validation's metrics, for the checks at the end.
class Watch : public train::Hook {
 public:
  std::string name() const override { return "ResNetWatch"; }
  void after_train_iter(train::Runner&, const train::IterOutputs& out) override { losses.push_back(out.loss); }
  void after_val_epoch(train::Runner&, const train::ValMetrics& m) override { val = m, validated = true; }
  std::vector<double> losses;
  train::ValMetrics val;
  bool validated = false;
};

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

int run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  auto train_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Train, train::kFashionMean,
                                                        train::kFashionStd);
  auto test_set = std::make_shared<data::MnistDataset>(o.data_dir, data::Split::Test, train::kFashionMean,
                                                       train::kFashionStd);
  if (o.limit > 0) train_set->limit(o.limit);
  if (o.test_limit > 0) test_set->limit(o.test_limit);

  train::RunnerOptions r;
  r.model = "ResNet";
  r.model_args.set_json("width", std::to_string(o.width));
  r.model_args.set_json("blocks_per_stage", std::to_string(o.blocks));
  if (o.optimizer == "sgd") {
    r.optimizer = "SGD";
    r.optimizer_args.set("lr", o.lr);
    r.optimizer_args.set("momentum", 0.9);
    r.optimizer_args.set("nesterov", true);
    r.optimizer_args.set("weight_decay", 5e-4);
  } else {
    r.optimizer = "Adam";
    r.optimizer_args.set("lr", o.lr);
  }
  r.param_scheduler = "CosineAnnealingLR";  // over the whole run, moved every iteration
  r.param_scheduler_args.set("by_epoch", false);
  r.train_dataset = train_set;
  r.val_dataset = test_set;
  r.batch_size = o.batch_size;
  r.max_epochs = o.epochs;
  r.device = "cpu";
  r.launcher = !o.launcher.empty() ? o.launcher : std::getenv("RANK") ? "pytorch" : "none";
  r.work_dir = o.work_dir;
  r.log_interval = o.log_interval;
  r.checkpoint_interval_epochs = 0;
  r.data_description = "Fashion-MNIST in " + o.data_dir + " (" + std::to_string(train_set->size()) + " train, " +
                       std::to_string(test_set->size()) + " test samples)";
  train::Runner runner(std::move(r));
  auto watch = std::make_shared<Watch>();
  runner.register_hook(watch);

  if (o.profile) profiler::set_enabled(true);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = runner.train();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.profile) profiler::set_enabled(false);
  if (code != 0) return code;

  const bool rank0 = runner.rank() == 0;
  if (o.profile && rank0)
    std::printf("profile (wall time per op, rank 0):\n%s\n",
                profiler::report(kernels::measure_gemm_peak_gflops(num_threads())).c_str());
  bool ok = true;
  const std::vector<double>& l = watch->losses;
  const size_t q = l.size() / 4;
  if (q == 0) {
    std::printf("train_resnet: too few iterations (%zu) to tell whether the loss fell\n", l.size());
    ok = false;
  } else if (!(mean(l, l.size() - q, l.size()) < 0.8 * mean(l, 0, q))) {
    std::printf("train_resnet: the loss did not fall: first quarter's mean %.4f, last quarter's %.4f\n",
                mean(l, 0, q), mean(l, l.size() - q, l.size()));
    ok = false;
  }
  if (!watch->validated) {
    std::printf("train_resnet: no validation ran\n");
    ok = false;
  } else if (watch->val.accuracy < o.min_accuracy) {
    std::printf("train_resnet: test accuracy %.4f is under --min-accuracy %.4f\n", watch->val.accuracy, o.min_accuracy);
    ok = false;
  }
  if (rank0) {
    const double samples = static_cast<double>(runner.epoch_samples_all()) * static_cast<double>(o.epochs);
    std::printf("train_resnet: %s: ResNet-%lld width %lld, %lld epochs, %d rank(s): test accuracy %.4f (%lld/%lld), "
                "loss %.4f -> %.4f, %.1f s (%.0f samples/s)\n",
                ok ? "OK" : "FAILED", static_cast<long long>(6 * o.blocks + 2), static_cast<long long>(o.width),
                static_cast<long long>(o.epochs), runner.world_size(), watch->val.accuracy,
                static_cast<long long>(watch->val.correct), static_cast<long long>(watch->val.total),
                q ? mean(l, 0, q) : 0.0, q ? mean(l, l.size() - q, l.size()) : 0.0, seconds, samples / seconds);
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_resnet: error: %s\n", e.what());
    return 1;
  }
}
