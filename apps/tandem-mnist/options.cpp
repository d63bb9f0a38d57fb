// Command-line parsing of tandem-mnist (CLI11). Records which config keys the
// user's flags set (o.given_keys), so resolve_config lets only those override
// the --config file and --cfg-options.
#include "options.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli_checks.h"
#include "config.h"
#include "train/config.h"

namespace tandem::app {

namespace {

// The DDP and launcher flags.
void add_distributed_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--launcher", o.launcher,
                 "none (one process), pytorch (tandem-run/torchrun variables), slurm (srun), mpi (mpirun)")
      ->check(one_of({"none", "pytorch", "slurm", "mpi"}));
  app.add_option("--backend", o.backend, "collectives: auto (nccl on GPUs, gloo on CPUs), gloo or nccl")
      ->check(one_of({"auto", "gloo", "nccl"}));
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb,
                 "DDP gradient bucket size in MiB after the first (0: auto, measured at start-up)")
      ->check(at_least(0));
  app.add_option("--first-bucket-cap-mb", o.first_bucket_cap_mb,
                 "DDP: size of the first bucket, which starts communicating earliest")
      ->check(above(0));
  app.add_flag("--find-unused-parameters", o.find_unused_parameters,
               "DDP: allow parameters that get no gradient in an iteration");
  app.add_flag("--gradient-as-bucket-view", o.gradient_as_bucket_view,
               "DDP: gradients live in the bucket buffers (saves a copy and memory)");
  app.add_option("--comm-hook", o.comm_hook,
                 "DDP bucket communication: allreduce, fp16 or bf16 (compressed), powersgd (low-rank)")
      ->check(one_of({"allreduce", "fp16", "bf16", "powersgd"}));
  app.add_option("--powersgd-rank", o.powersgd_rank, "PowerSGD: rank of the gradient approximation")
      ->check(at_least(1));
  app.add_option("--powersgd-start-iter", o.powersgd_start_iter,
                 "PowerSGD: iterations of plain all-reduce before compressing")
      ->check(at_least(0));
  app.add_flag("--static-graph", o.static_graph,
               "DDP: the same graph every iteration (unused set and bucket order learned once)");
  app.add_flag_callback(
      "--no-broadcast-buffers", [&o] { o.broadcast_buffers = false; },
      "DDP: do not broadcast rank 0's buffers (BatchNorm statistics) at each forward");
  app.add_option("--auto-scale-lr", o.auto_scale_lr_base_batch,
                 "linear scaling rule: lr *= (batch size x world size) / BASE_BATCH")
      ->check(at_least(0));
  app.add_option("--dist-timeout", o.dist_timeout_s, "seconds any distributed wait may take before failing")
      ->check(above(0));
  app.add_flag("--sync-bn", o.sync_bn, "DDP: synchronise BatchNorm statistics across ranks (SyncBatchNorm)");
}

// Hidden flags the fault tests drive the trainer with.
void add_test_hooks(CLI::App& app, TrainOptions& o) {
  app.add_option("--debug-sigterm-at", o.debug_sigterm_at, "")->group("");
  app.add_option("--debug-sigkill-at", o.debug_sigkill_at, "")->group("");
  app.add_option("--debug-sigkill-rank", o.debug_sigkill_rank, "")->group("");
  app.add_option("--debug-samples-out", o.debug_samples_out, "")->group("");
  app.add_option("--debug-hold-at", o.debug_hold_at, "")->group("");
}

// The first argument no option took: an unknown flag with the closest known one, or a stray word.
std::string unexpected_argument(const CLI::App& app) {
  const std::vector<std::string> rest = app.remaining();
  if (rest.empty()) return "";
  const std::string& arg = rest.front();
  if (arg.rfind("-", 0) != 0 || arg == "-")
    return "unexpected argument '" + arg + "' (the config is the only positional argument)";
  const std::string flag = arg.substr(0, arg.find('='));
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options())
    if (!opt->get_group().empty())
      for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
  const std::string guess = train::closest_key(flag, names);
  return "unknown flag " + flag + (guess.empty() ? "" : " (did you mean " + guess + "?)");
}

}  // namespace

std::string program_name(const char* argv0) {
  const std::string path = argv0 ? argv0 : "tandem-train";
  return path.substr(path.find_last_of('/') + 1);
}

int parse_options(int argc, char** argv, TrainOptions& o) {
  CLI::App app{"tandem-train (tandem-mnist): train a registered model from a config (default: the MNIST convnet, "
               "conv-bn-relu-pool x2, fc-relu-fc, log-softmax, NLL)"};
  // A flag given twice takes its last value (a wrapper script's defaults can be overridden).
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data-dir", o.data_dir,
                 "directory with the IDX files (raw or .gz; also DIR/MNIST/raw). "
                 "Default: Debian's Fashion-MNIST");
  app.add_option("--epochs", o.epochs, "training epochs")->check(at_least(1));
  app.add_option("--batch-size", o.batch_size, "training batch size")->check(at_least(1));
  app.add_option("--test-batch-size", o.test_batch_size, "evaluation batch size")->check(at_least(1));
  app.add_option("--lr", o.lr, "learning rate")->check(at_least(0));
  app.add_option("--gamma", o.gamma, "StepLR decay of the learning rate per epoch")->check(above(0));
  app.add_option("--lr-schedule", o.lr_schedule,
                 "step: multiply by --gamma after every epoch; cosine: anneal to 0 over all iterations")
      ->check(one_of({"step", "cosine"}));
  app.add_option("--optimizer", o.optimizer, "adadelta, sgd or adam")
      ->check(one_of({"adadelta", "sgd", "adam"}));
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(at_least(0));
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")->check(at_least(0));
  app.add_option("--seed", o.seed, "seed for weights and shuffling");
  app.add_option("--limit", o.limit, "use only the first N training samples (0: all)")
      ->check(at_least(0));
  app.add_option("--test-limit", o.test_limit, "use only the first N test samples (0: all)")
      ->check(at_least(0));
  bool no_shuffle = false;
  app.add_flag("--no-shuffle", no_shuffle, "visit training samples in file order");
  app.add_flag_callback(
      "--no-pad", [&o] { o.pad = false; },
      "DDP: no repeated samples to even out the ranks' shares; ranks that run out shadow the others (Join)");
  app.add_option("--device", o.device, "auto, cpu, cuda or cuda:N (auto: CUDA when a GPU is visible)");
  app.add_option("--threads", o.threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")
      ->check(at_least(0));
  app.add_option("--log-interval", o.log_interval, "iterations between progress lines")
      ->check(at_least(1));
  app.add_option("--init-weights", o.init_weights, "start from these weights (safetensors, PyTorch names)");
  app.add_option("--save-weights", o.save_weights, "write the trained weights here (safetensors)");
  app.add_option("--metrics-out", o.metrics_out, "write JSON lines: one per iteration and per evaluation");
  add_distributed_flags(app, o);
  std::string amp_text;
  app.add_option("--amp", amp_text,
                 "mixed precision: off, fp16 (with a loss scaler) or bf16; alone (MMEngine's --amp): fp16 on CUDA, "
                 "bf16 on CPU")
      ->expected(0, 1);
  app.add_flag("--cuda-graph", o.cuda_graph,
               "CUDA: capture forward + backward + optimizer step of a full batch once (after a few warm-up "
               "iterations) and replay it every iteration (one launch per step)");
  app.add_option("--config", o.config_file,
                 "JSON config (see configs/); its keys override the defaults, flags override it");
  std::string positional_config;
  app.add_option("CONFIG", positional_config,
                 "the config, as MMEngine's tools/train.py CONFIG (the same as --config)");
  app.add_option("--local_rank,--local-rank", o.local_rank,
                 "this process's local rank, as torch.distributed.launch passes it (LOCAL_RANK wins when set)")
      ->check(at_least(0));
  app.add_option("--cfg-options", o.cfg_options, "override config keys: KEY=VALUE ... (e.g. optimizer.lr=0.5)")
      ->expected(1, -1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--work-dir,--work_dir", o.work_dir,
                 "where logs, metrics, config.json and checkpoints go (default: work_dirs/<config name>)");
  app.add_option("--eval-interval", o.eval_interval, "epochs between evaluations (0: only after the last epoch)")
      ->check(at_least(0));
  app.add_option("--checkpoint-interval", o.checkpoint_interval_iters,
                 "save a checkpoint every N iterations (0: off)")
      ->check(at_least(0));
  app.add_option("--checkpoint-epochs", o.checkpoint_interval_epochs, "save a checkpoint every N epochs (0: off)")
      ->check(at_least(0));
  app.add_option("--max-keep-ckpts", o.max_keep_ckpts, "checkpoints to keep (0: all)")
      ->check(at_least(0));
  app.add_option("--resume", o.resume,
                 "continue a run exactly: with no value from the work dir's last_checkpoint, or from this checkpoint")
      ->expected(0, 1);
  app.add_flag("--resume-reshard", o.resume_reshard,
               "resume a checkpoint written by another number of ranks: the samples its epoch consumed stay "
               "consumed, the rest of the epoch is sharded over this run's ranks (not bitwise an uninterrupted run; "
               "automatic in a group tandem-run restarted)");
  app.add_flag("--print-config", o.print_config, "print the resolved config (JSON) and exit");
  app.add_flag("--verbose", o.verbose, "errors also name the source line that raised them");
  app.add_flag("--profile", o.profile, "time every op and print a table at the end");
  add_test_hooks(app, o);
  app.allow_extras();  // reported below, with the closest flag
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", program_name(argv[0]).c_str(), e.what());
    return 2;
  }
  if (const std::string extra = unexpected_argument(app); !extra.empty()) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", program_name(argv[0]).c_str(), extra.c_str());
    return 2;
  }
  o.shuffle = !no_shuffle;
  if (!positional_config.empty()) {
    if (!o.config_file.empty() && o.config_file != positional_config) {
      std::fprintf(stderr, "%s: error: two configs given ('%s' and --config '%s'); give one\n",
                   program_name(argv[0]).c_str(), positional_config.c_str(), o.config_file.c_str());
      return 2;
    }
    o.config_file = positional_config;
  }
  if (app.count("--amp") > 0) {
    if (amp_text.empty()) amp_text = "auto";
    if (amp_text != "off" && amp_text != "fp16" && amp_text != "bf16" && amp_text != "auto") {
      std::fprintf(stderr, "%s: error: --amp: expected off, fp16 or bf16 (or nothing), got '%s'\n",
                   program_name(argv[0]).c_str(), amp_text.c_str());
      return 2;
    }
    o.amp = amp_text;
  }
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0) continue;
    const std::string key = config_key_of_flag(opt->get_name());
    if (!key.empty()) o.given_keys.insert(key);
  }
  if (app.count("--resume") > 0 && o.resume.empty()) o.resume = "auto";
  return -1;
}

}  // namespace tandem::app
