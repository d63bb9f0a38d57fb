// CudaGraphStep (see cuda_graph_step.h).
#include "train/cuda_graph_step.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "train/runner_internal.h"

namespace tandem::train {

CudaGraphStep::CudaGraphStep(nn::Module& net, Device device, std::string optimizer_name)
    : device_(device), optimizer_name_(std::move(optimizer_name)) {
  // BatchNorm counts batches on the host (count_batch does no device work for a host counter, so
  // the forward can be captured); step() advances the counters after each replay.
  const std::string suffix = "num_batches_tracked";
  for (auto& [name, t] : net.named_buffers()) {
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    Tensor counter = t;  // shares the module's tensor: set_data moves it for the module too
    counter.set_data(counter.to(Device::cpu()));
    batch_counters_.push_back(counter);
  }
  graph_ = std::make_unique<cuda::Graph>(device.index);
  spdlog::info("cuda graph: capturing forward + backward + {} step after {} warm-up iterations", optimizer_name_,
               kWarmup);
}

double CudaGraphStep::step(const data::Batch& batch, optim::Optimizer& opt, const LossFn& forward_loss,
                           int64_t epoch, int64_t it) {
  if (!x_.defined()) {  // same addresses for the whole run
    x_ = Tensor::empty(batch.images.shape(), batch.images.dtype(), device_);
    y_ = Tensor::empty(batch.labels.shape(), batch.labels.dtype(), device_);
    loss_ = Tensor::zeros({}, kFloat32, device_);
  }
  x_.copy_(batch.images);
  y_.copy_(batch.labels);
  // The step the graph holds: forward, a copy of the loss, zero_grad in place, backward, step.
  auto run = [&] {
    Tensor loss = forward_loss(x_, y_);
    loss_.copy_(loss);
    opt.zero_grad(/*set_to_none=*/false);
    loss.backward();
    opt.step();
  };  // its temporaries go back to the cache before it returns (inside the capture)
  if (graph_->captured() && graph_lr_ != opt.lr()) {
    // The lr is frozen in the graph: capture again, after one more eager step so the cache holds
    // what the step needs now (an evaluation may have reshaped it since).
    graph_->reset();
    uncaptured_done_ = std::min(uncaptured_done_, kWarmup - 1);
  }
  if (uncaptured_done_ < kWarmup) {
    run();
    ++uncaptured_done_;
    ++warmups_;
  } else {
    if (!graph_->captured()) {
      graph_lr_ = opt.lr();
      graph_->begin_capture();
      run();
      graph_->end_capture();
      ++captures_;
      spdlog::info("cuda graph: captured at epoch {}, iteration {} (lr {})", epoch, it, graph_lr_);
    } else {
      for (Tensor& c : batch_counters_) c.data<int64_t>()[0] += 1;  // a capture's forward counts once
    }
    graph_->replay();
    ++replays_;
  }
  return loss_.item<double>();  // syncs: the step (or its replay) has finished
}

void CudaGraphStep::report() const {
  spdlog::info("cuda graph: {} capture(s), {} replayed iterations, {} warm-up and {} partial-batch iterations "
               "uncaptured", captures_, replays_, warmups_, partial_);
}

std::string cuda_graph_refusal(const RunnerOptions& o, const Device& device, int world) {
  // Named as both spellings say it: the trainer's flag and MMEngine's key.
  if (o.amp == "fp16")
    return "--cuda-graph (compile) cannot capture --amp fp16: the loss scaler reads found_inf on the host every "
           "step; use --amp bf16 (no scaler) or --amp off";
  if (o.optimizer == "Adam" || o.optimizer == "AdamW")
    return "--cuda-graph (compile) cannot capture the " + o.optimizer +
           " optimizer: its bias correction changes every step and would be frozen in the graph; use SGD or Adadelta";
  for (const SchedulerSpec& s : scheduler_specs(o))
    if (s.type != "StepLR")
      return "--cuda-graph (compile) needs an lr that is constant within an epoch (the lr is frozen in the captured "
             "optimizer kernels); use --lr-schedule step (param_scheduler StepLR), not " + s.type;
  if (o.accumulative_counts > 1 || o.clip_max_norm > 0)
    return "--cuda-graph (compile) cannot capture optim_wrapper.accumulative_counts > 1 or clip_grad; drop one or "
           "the other";
  if (o.launcher != "none") {  // DDP, even of one rank
    const std::string backend = o.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : o.backend;
    return "--cuda-graph (compile) does not support DDP (" + std::to_string(world) + (world == 1 ? " rank" : " ranks") +
           " over " + backend + ", --launcher " + o.launcher + "): the reducer's bucket hooks are host logic that a "
           "replayed graph skips; run without a launcher (--launcher none) or drop --cuda-graph";
  }
  if (!device.is_cuda())
    return "--cuda-graph (compile) needs a CUDA device, got --device " + o.device + " (resolved to " + device.str() +
           ")";
  return "";
}

}  // namespace tandem::train
