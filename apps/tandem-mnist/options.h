// Command-line options of tandem-mnist (parsed with CLI11).
#pragma once

#include <cstdint>
#include <string>

namespace tandem::app {

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

struct TrainOptions {
  std::string data_dir = kDefaultDataDir;
  int64_t epochs = 14;
  int64_t batch_size = 64;
  int64_t test_batch_size = 256;
  double lr = 1.0;
  double gamma = 0.7;
  std::string lr_schedule = "step";  // step: StepLR(1, gamma) per epoch; cosine: per iteration to 0
  std::string optimizer = "adadelta";
  double momentum = 0.0;
  double weight_decay = 0.0;
  uint64_t seed = 1;
  int64_t limit = 0;       // 0: all training samples
  int64_t test_limit = 0;  // 0: all test samples
  bool shuffle = true;
  std::string device = "auto";
  int threads = 0;  // 0: OMP_NUM_THREADS or the core count
  int64_t log_interval = 100;
  std::string init_weights;
  std::string save_weights;
  std::string metrics_out;
  // Distributed data parallel.
  std::string launcher = "none";  // none | pytorch | slurm | mpi
  std::string backend = "auto";   // auto | gloo | nccl
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  std::string comm_hook = "allreduce";
  int64_t auto_scale_lr_base_batch = 0;  // 0: off
  double dist_timeout_s = 300.0;
};

// Parses argv. Returns the exit code to use when the program should stop now
// (help printed, or a bad flag reported on stderr in one line), else -1.
int parse_options(int argc, char** argv, TrainOptions& out);

}  // namespace tandem::app
