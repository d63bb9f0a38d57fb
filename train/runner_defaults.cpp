// The Runner's defaults and small helpers (see runner_internal.h).
#include <spdlog/spdlog.h>

#include <spdlog/sinks/basic_file_sink.h>

#include <algorithm>
#include <cstdio>

#include "train/runner_internal.h"

namespace tandem::train {

std::vector<HookSpec> default_hook_specs(const RunnerOptions& o) {
  std::vector<HookSpec> specs;
  auto add = [&](const std::string& type) -> Kwargs& {
    specs.push_back({type, Kwargs("default_hooks." + type)});
    return specs.back().args;
  };
  add("CheckInvalidLossHook");
  add("IterTimerHook");
  add("DistSamplerSeedHook");
  add("LoggerHook").set_json("interval", std::to_string(o.log_interval));
  add("ParamSchedulerHook");
  add("StopAgreementHook");
  Kwargs& ckpt = add("CheckpointHook");
  if (o.max_iters > 0) {  // IterBasedTrainLoop: by iterations, the last one included
    ckpt.set("by_epoch", false);
    ckpt.set_json("interval", std::to_string(o.checkpoint_interval_iters > 0 ? o.checkpoint_interval_iters : o.max_iters));
  } else {
    ckpt.set_json("interval", std::to_string(o.checkpoint_interval_epochs));
    ckpt.set_json("interval_iters", std::to_string(o.checkpoint_interval_iters));
  }
  ckpt.set_json("max_keep_ckpts", std::to_string(o.max_keep_ckpts));
  if (!o.save_best.empty()) ckpt.set("save_best", o.save_best);
  return specs;
}

void check_vis_backends(const std::vector<std::string>& names, const std::string& where) {
  std::string supported;
  for (const std::string& k : kVisBackends) supported += (supported.empty() ? "" : ", ") + k;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    TANDEM_CHECK(std::find(kVisBackends.begin(), kVisBackends.end(), names[i]) != kVisBackends.end(), at, ": vis backend '",
                 names[i], "' is not supported by Tandem (supported: ", supported, "); remove it or use one of those");
    TANDEM_CHECK(std::find(names.begin(), names.begin() + i, names[i]) == names.begin() + i, at, ": vis backend '",
                 names[i], "' is listed twice; give each vis backend once");
  }
}

std::vector<SchedulerSpec> scheduler_specs(const RunnerOptions& o) {
  if (!o.param_schedulers.empty()) return o.param_schedulers;
  if (o.param_scheduler.empty()) return {};
  return {SchedulerSpec{o.param_scheduler, o.param_scheduler_args}};
}

void log_to_file(const std::string& file) {
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
  spdlog::default_logger()->sinks().push_back(sink);
  spdlog::set_pattern("%Y/%m/%d %H:%M:%S - %v");
}

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

}  // namespace tandem::train
