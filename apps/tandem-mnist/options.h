// Options of tandem-mnist: the resolved training settings. They come from the
// reference recipe (the defaults below), then a config file (--config or the
// first positional argument, as MMEngine's tools/train.py; Tandem's own shape
// or MMEngine's, see mmengine_config.h), then --cfg-options KEY=VALUE
// overrides, then the command-line flags the user gave (config.cpp maps
// fields <-> JSON keys; options.cpp parses the command line).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace tandem::app {

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

struct TrainOptions {
  std::string data_dir = kDefaultDataDir;
  int64_t epochs = 14;
  int64_t max_iters = 0;  // > 0: train_cfg by_epoch False (iterations, not epochs)
  int64_t batch_size = 64;
  int64_t test_batch_size = 256;
  double lr = 1.0;
  double gamma = 0.7;
  std::string lr_schedule = "step";  // step: StepLR(1, gamma) per epoch; cosine: per iteration to 0;
                                     // list: param_schedulers
  std::string param_schedulers = "[]";  // JSON array of MMEngine scheduler dicts {type, ...}, in order
  std::string optimizer = "adadelta";
  bool zero_redundancy = false;  // shard `optimizer`'s state across the ranks (ZeroRedundancyOptimizer)
  double momentum = 0.0;
  double weight_decay = 0.0;
  uint64_t seed = 1;
  int64_t limit = 0;       // 0: all training samples
  int64_t test_limit = 0;  // 0: all test samples
  bool shuffle = true;
  bool pad = true;  // DistributedSampler pads every rank's share (MMEngine's round_up); false: Join
  std::string device = "auto";
  int threads = 0;  // 0: OMP_NUM_THREADS or the core count
  int64_t log_interval = 100;
  std::string init_weights;
  std::string save_weights;
  std::string metrics_out;
  // MMEngine's visualizer.vis_backends (train.vis_backends): LocalVisBackend, TensorboardVisBackend.
  std::vector<std::string> vis_backends = {"LocalVisBackend"};
  // Distributed data parallel.
  std::string launcher = "none";  // none | pytorch | slurm | mpi
  std::string backend = "auto";   // auto | gloo | nccl
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  std::string comm_hook = "allreduce";  // allreduce | fp16 | bf16 | powersgd
  int powersgd_rank = 1;                 // PowerSGD's matrix_approximation_rank
  int64_t powersgd_start_iter = 1000;    // plain all-reduce before this many iterations (PyTorch's default)
  int64_t auto_scale_lr_base_batch = 0;  // 0: off
  double dist_timeout_s = 300.0;
  bool sync_bn = false;
  std::string amp = "off";  // off | fp16 | bf16 | auto (--amp alone: fp16 on CUDA, bf16 on CPU)
  bool cuda_graph = false;  // capture the steady-state step once and replay it (CUDA only)
  // Train loop, work dir, checkpoints.
  int64_t eval_interval = 1;               // epochs between evaluations (0: only after the last epoch)
  int64_t checkpoint_interval_iters = 0;   // 0: off
  int64_t checkpoint_interval_epochs = 1;  // 0: off
  int64_t max_keep_ckpts = 3;              // 0: keep all
  std::string work_dir;                    // "": work_dirs/<config name>
  std::string model = "MnistNet";
  // MMEngine's optim_wrapper: gradient accumulation and clipping (max_norm 0: off).
  int64_t accumulative_counts = 1;
  double clip_max_norm = 0.0;
  double clip_norm_type = 2.0;
  // MMEngine's model_wrapper_cfg: the wrapper's registered name and the DDP keyword arguments
  // that have no flag (the rest are the ddp.* fields above); extra ones as JSON text.
  std::string model_wrapper = "MMDistributedDataParallel";
  bool broadcast_buffers = true;
  bool static_graph = false;
  std::string model_wrapper_extra = "{}";
  std::string model_extra = "{}";
  std::string optimizer_extra = "{}";  // optim_wrapper.optimizer's other keywords (nesterov, betas, eps...)  // the model's keyword arguments (MMEngine's model dict beside type)
  // train_dataloader.dataset with a type: a dataset of train::datasets() built from this dict (JSON
  // object), for train and val; "{}": the IDX files of data_dir.
  std::string dataset = "{}";
  int port = 0;                 // dist_params.port (0: MASTER_PORT)
  std::string save_best;        // "" | accuracy | loss
  std::string custom_hooks = "[]";  // JSON array of {type, ...}
  std::string val_evaluator = "[]";  // JSON array of {type, ...} (metrics; empty: Accuracy and Loss)
  std::string test_evaluator = "[]";  // tandem-test's metrics (empty: val_evaluator's)
  bool resume_from_config = false;  // the config's `resume: true`

  // Command line only (not part of the config).
  std::string config_file;               // --config
  std::vector<std::string> cfg_options;  // --cfg-options a.b=value ...
  std::set<std::string> given_keys;      // config keys set by flags the user gave
  std::string resume;                    // "": no; "auto": <work_dir>/last_checkpoint; else a path
  // Resume a checkpoint of another world size, re-sharding the rest of its epoch (train::RunnerOptions::
  // reshard_resume); always on in a group tandem-run restarted (TORCHELASTIC_RESTART_COUNT > 0).
  bool resume_reshard = false;
  int local_rank = -1;                   // --local_rank/--local-rank (LOCAL_RANK wins); -1: not given
  bool profile = false;
  bool print_config = false;  // print the resolved config as JSON and exit
  bool verbose = false;       // errors also name the source line that raised them
  int64_t debug_sigterm_at = 0;  // test hook: rank 0 raises SIGTERM after this global iteration
  int64_t debug_sigkill_at = 0;  // test hook: rank 0 raises SIGKILL after this global iteration
  int debug_sigkill_rank = 0;    // test hook: the rank --debug-sigkill-at kills
  std::string debug_samples_out;  // test hook: each rank appends "epoch iter index..." lines to this path + ".rank<r>"
  // Test hook: every rank holds after this global iteration until SIGTERM/SIGINT arrives (at most
  // 120 s), so a test's external signal lands mid-run however loaded the machine is.
  int64_t debug_hold_at = 0;
};

// Parses argv. Returns the exit code to use when the program should stop now
// (help printed, or a bad flag reported on stderr in one line), else -1.
int parse_options(int argc, char** argv, TrainOptions& out);
// argv[0] without its directory ("tandem-train"), the name errors start with.
std::string program_name(const char* argv0);

}  // namespace tandem::app
