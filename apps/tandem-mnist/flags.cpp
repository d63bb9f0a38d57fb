// The flags' alias table and the config's resolution (see flags.h).
#include "flags.h"

#include <cstdlib>

#include "core/error.h"
#include "train/work_dir.h"

namespace tandem::app {
namespace {

using train::ArgKind;
using train::Json;

Json sets(std::initializer_list<std::pair<const char*, Json>> keys) {
  Json out = Json::object();
  for (const auto& [k, v] : keys) out[k] = v;
  return out;
}

std::vector<FlagAlias> make_aliases() {
  using K = ArgKind;
  const auto optimizer = [](const Json& v) {
    return sets({{"optim_wrapper.optimizer.type", train::registered_optimizer_name(v.get<std::string>())}});
  };
  const auto schedule = [](const Json& v) {
    if (v == "step") return sets({{"param_scheduler", train::default_run_config()["param_scheduler"]}});
    return sets({{"param_scheduler", {{"type", "CosineAnnealingLR"}, {"by_epoch", false}}}});
  };
  const auto amp = [](const Json& v) {
    if (v == "off") return sets({{"optim_wrapper.type", "OptimWrapper"}, {"optim_wrapper.dtype", nullptr}});
    return sets({{"optim_wrapper.type", "AmpOptimWrapper"},
                 {"optim_wrapper.dtype", v == "fp16" ? Json("float16") : v == "bf16" ? Json("bfloat16") : Json()}});
  };
  const auto auto_scale = [](const Json& v) {
    if (v.get<int64_t>() <= 0) return sets({{"auto_scale_lr.enable", false}});
    return sets({{"auto_scale_lr.enable", true}, {"auto_scale_lr.base_batch_size", v}});
  };
  const auto data_dir = [](const Json& v) {
    return sets({{"train_dataloader.dataset.data_root", v}, {"val_dataloader.dataset.data_root", v}});
  };
  const auto fixed = [](const char* path, Json value) { return [=](const Json&) { return sets({{path, value}}); }; };
  return {
      {"--data-dir", "train_dataloader.dataset.data_root", K::String,
       "directory with the IDX files (raw or .gz; also DIR/MNIST/raw), for train and val", {}, data_dir},
      {"--epochs", "train_cfg.max_epochs", K::Int, "training epochs"},
      {"--batch-size", "train_dataloader.batch_size", K::Int, "training batch size"},
      {"--test-batch-size", "val_dataloader.batch_size", K::Int, "evaluation batch size"},
      {"--optimizer", "optim_wrapper.optimizer.type", K::String, "adadelta, sgd or adam", {"adadelta", "sgd", "adam"},
       optimizer},
      {"--lr", "optim_wrapper.optimizer.lr", K::Number, "learning rate"},
      {"--momentum", "optim_wrapper.optimizer.momentum", K::Number, "SGD momentum"},
      {"--weight-decay", "optim_wrapper.optimizer.weight_decay", K::Number, "L2 weight decay"},
      {"--lr-schedule", "param_scheduler", K::String,
       "step: StepLR(gamma) per epoch; cosine: CosineAnnealingLR per iteration to 0", {"step", "cosine"}, schedule},
      {"--gamma", "param_scheduler.gamma", K::Number, "StepLR's decay of the learning rate per epoch"},
      {"--seed", "randomness.seed", K::Int, "seed for weights and shuffling"},
      {"--limit", "train_dataloader.dataset.indices", K::Int, "use only the first N training samples (0: all)"},
      {"--test-limit", "val_dataloader.dataset.indices", K::Int, "use only the first N test samples (0: all)"},
      {"--no-shuffle", "train_dataloader.sampler.shuffle", K::Bool, "visit training samples in file order", {},
       fixed("train_dataloader.sampler.shuffle", false)},
      {"--no-pad", "train_dataloader.sampler.round_up", K::Bool,
       "DDP: no repeated samples to even out the ranks' shares; ranks that run out shadow the others (Join)", {},
       fixed("train_dataloader.sampler.round_up", false)},
      {"--device", "env_cfg.device", K::String, "auto, cpu, cuda or cuda:N (auto: CUDA when a GPU is visible)"},
      {"--threads", "env_cfg.threads", K::Int, "CPU threads (0: OMP_NUM_THREADS or all cores)"},
      {"--log-interval", "default_hooks.logger.interval", K::Int, "iterations between progress lines"},
      {"--init-weights", "load_from", K::String, "start from these weights (safetensors, PyTorch names)"},
      {"--amp", "optim_wrapper.type", K::String,
       "mixed precision: off, fp16 (with a loss scaler) or bf16; alone (MMEngine's --amp): fp16 on CUDA, "
       "bf16 on a CPU with native bf16 (AVX512_BF16 or AMX), else off",
       {"off", "fp16", "bf16", "auto"}, amp},
      {"--cuda-graph", "compile", K::Bool,
       "CUDA: capture forward + backward + optimizer step once and replay it every iteration", {},
       fixed("compile", true)},
      {"--work-dir,--work_dir", "work_dir", K::String,
       "where logs, metrics, config.json and checkpoints go (default: work_dirs/<config name>)"},
      {"--eval-interval", "train_cfg.val_interval", K::Int, "epochs between evaluations (0: only after the last)"},
      {"--checkpoint-interval", "default_hooks.checkpoint.interval_iters", K::Int,
       "save a checkpoint every N iterations (0: off)"},
      {"--checkpoint-epochs", "default_hooks.checkpoint.interval", K::Int, "save a checkpoint every N epochs (0: off)"},
      {"--max-keep-ckpts", "default_hooks.checkpoint.max_keep_ckpts", K::Int, "checkpoints to keep (0: all)"},
      {"--launcher", "launcher", K::String, "none, pytorch (tandem-run/torchrun variables), slurm (srun), mpi",
       {"none", "pytorch", "slurm", "mpi"}},
      {"--backend", "env_cfg.dist_cfg.backend", K::String, "collectives: auto (nccl on GPUs, gloo on CPUs), gloo, nccl",
       {"auto", "gloo", "nccl"}},
      {"--dist-timeout", "env_cfg.dist_cfg.timeout", K::Number, "seconds any distributed wait may take"},
      {"--bucket-cap-mb", "model_wrapper_cfg.bucket_cap_mb", K::Number,
       "DDP gradient bucket size in MiB after the first (0: measured at start-up)"},
      {"--first-bucket-cap-mb", "model_wrapper_cfg.first_bucket_cap_mb", K::Number, "DDP: size of the first bucket"},
      {"--find-unused-parameters", "model_wrapper_cfg.find_unused_parameters", K::Bool,
       "DDP: allow parameters that get no gradient in an iteration"},
      {"--gradient-as-bucket-view", "model_wrapper_cfg.gradient_as_bucket_view", K::Bool,
       "DDP: gradients live in the bucket buffers (saves a copy and memory)"},
      {"--comm-hook", "model_wrapper_cfg.comm_hook", K::String,
       "DDP bucket communication: allreduce, fp16 or bf16 (compressed), powersgd (low-rank)",
       {"allreduce", "fp16", "bf16", "powersgd"}},
      {"--powersgd-rank", "model_wrapper_cfg.powersgd_rank", K::Int, "PowerSGD: rank of the gradient approximation"},
      {"--powersgd-start-iter", "model_wrapper_cfg.powersgd_start_iter", K::Int,
       "PowerSGD: iterations of plain all-reduce before compressing"},
      {"--static-graph", "model_wrapper_cfg.static_graph", K::Bool, "DDP: the same graph every iteration"},
      {"--no-broadcast-buffers", "model_wrapper_cfg.broadcast_buffers", K::Bool,
       "DDP: do not broadcast rank 0's buffers (BatchNorm statistics) at each forward", {},
       fixed("model_wrapper_cfg.broadcast_buffers", false)},
      {"--sync-bn", "sync_bn", K::Bool, "DDP: synchronise BatchNorm statistics across ranks (SyncBatchNorm)", {},
       fixed("sync_bn", "torch")},
      {"--auto-scale-lr", "auto_scale_lr.base_batch_size", K::Int,
       "linear scaling rule: lr *= (batch size x world size) / BASE_BATCH (0: off)", {}, auto_scale},
  };
}

// The flag's first name ("--work-dir" of "--work-dir,--work_dir").
std::string main_name(const std::string& flag) { return flag.substr(0, flag.find(',')); }

Json read_value(const FlagAlias& a, const std::string& text) {
  const std::string who = main_name(a.flag) + " (" + a.path + ")";
  char* end = nullptr;
  switch (a.kind) {
    case ArgKind::Int: {
      const long long v = std::strtoll(text.c_str(), &end, 10);
      TANDEM_CHECK(!text.empty() && *end == '\0', who, ": must be an integer, got '", text, "'");
      return Json(static_cast<int64_t>(v));
    }
    case ArgKind::Number: {
      const double v = std::strtod(text.c_str(), &end);
      TANDEM_CHECK(!text.empty() && *end == '\0', who, ": must be a number, got '", text, "'");
      return Json(v);
    }
    case ArgKind::Bool: return Json(true);
    default: return Json(text);
  }
}

}  // namespace

const std::vector<FlagAlias>& flag_aliases() {
  static const std::vector<FlagAlias> table = make_aliases();
  return table;
}

void add_alias_flags(CLI::App& app, std::map<std::string, std::string>& texts) {
  for (const FlagAlias& a : flag_aliases()) {
    const std::string help = a.help + " [" + a.path + "]";
    std::string& text = texts[main_name(a.flag)];
    if (a.kind == ArgKind::Bool) {
      app.add_flag(a.flag, help);
      continue;
    }
    CLI::Option* opt = app.add_option(a.flag, text, help);
    if (a.flag == "--amp") opt->expected(0, 1);
    const std::string what = a.kind == ArgKind::Int ? "an integer" : a.kind == ArgKind::Number ? "a number" : "a value";
    opt->check(CLI::Validator(
        [a, what](std::string& v) -> std::string {
          if (v.rfind("--", 0) == 0) return "needs a value (" + what + ") before '" + v + "'";
          if (a.words.empty() || v.empty()) return "";
          std::string list;
          for (const std::string& w : a.words) {
            if (v == w) return "";
            list += (list.empty() ? "" : ", ") + w;
          }
          return "'" + v + "' is not one of " + list;
        },
        "", ""));
  }
}

std::vector<train::FlagSetting> flag_settings(const CLI::App& app, const std::map<std::string, std::string>& texts) {
  std::vector<train::FlagSetting> out;
  for (const FlagAlias& a : flag_aliases()) {
    const std::string flag = main_name(a.flag);
    if (app.count(flag) == 0) continue;
    std::string text = texts.at(flag);
    if (flag == "--amp" && text.empty()) text = "auto";  // --amp alone, as MMEngine's
    const Json value = read_value(a, text);
    const Json keys = a.map ? a.map(value) : sets({{a.path.c_str(), value}});
    for (const auto& [path, v] : keys.items()) out.push_back({flag, path, v});
  }
  return out;
}

std::string flags_markdown() {
  std::string out = "| Flag | Config key | Meaning |\n|---|---|---|\n";
  for (const FlagAlias& a : flag_aliases())
    out += "| `" + main_name(a.flag) + (a.kind == ArgKind::Bool ? "" : " V") + "` | `" + a.path + "` | " + a.help +
           " |\n";
  return out;
}

ResolvedConfig resolve_config(const AppOptions& o) {
  train::LoadedConfig c = train::load_run_config(o.config_file, o.cfg_options, o.flags);
  if (!c.tree.contains("work_dir") || c.tree["work_dir"] == "") c.tree["work_dir"] = train::default_work_dir(o.config_file);
  return {train::complete_run_config(c.tree, c.origins), c.origins};
}

}  // namespace tandem::app
