// One training iteration of the Runner: the eager step through the optimizer wrapper
// (train/optim_wrapper.h: MMEngine's OptimWrapper.update_params, with AMP, gradient accumulation
// and clipping; groups run across epoch boundaries, as MMEngine's do), or the CUDA-graph step for
// full batches. Under DDP or FSDP the backward runs inside no_sync() unless the wrapper says this
// pass synchronises (should_sync), so gradients are all-reduced once per accumulation group.
#include <spdlog/spdlog.h>

#include <cmath>

#include "nn/amp.h"
#include "nn/functional.h"
#include "train/cuda_graph_step.h"
#include "train/runner.h"

namespace tandem::train {

Tensor Runner::forward_loss(const DataBatch& batch, IterOutputs* named) {
  amp::AutocastGuard autocast(amp::parse_precision(o_.amp));
  const ModelOutputs out = run_model(*task_, batch, Mode::kLoss, *wrapped_);
  // Each loss's value for the log, when the model names more than one (each read syncs a GPU).
  if (named && out.losses.size() > 1)
    for (const auto& [name, loss] : out.losses) named->losses.emplace_back(name, loss.item<double>());
  return sum_losses(out.losses);
}

IterOutputs Runner::run_iter(const data::Batch& batch) {
  const int64_t n = batch.images.size(0);
  if (graph_step_ && n == o_.batch_size) {
    IterOutputs out;
    out.lr = optimizer().lr();
    out.loss = graph_step_->step(batch, optimizer(), [this](const Tensor& x, const Tensor& y) {
      return forward_loss(DataBatch{{"inputs", x}, {"labels", y}});
    }, epoch_, iter_);
    out.batch_size = n;
    out.updated = true;
    return out;
  }
  if (graph_step_) graph_step_->count_partial();
  if (optim_dict_) return dict_step(task_->data_preprocessor()(batch, device_));
  return eager_step(task_->data_preprocessor()(batch, device_));
}

IterOutputs Runner::eager_step(const DataBatch& batch) {
  IterOutputs out;
  out.batch_size = batch_tensor(batch, "inputs").size(0);
  out.lr = optimizer().lr();
  OptimWrapper& w = *optim_wrapper_;
  const bool sync = w.should_sync();
  // Gradients keep their storage when they are bucket views or a CUDA graph writes them.
  const bool to_none = !o_.model_wrapper_args.boolean("gradient_as_bucket_view", false) && !o_.cuda_graph;
  std::unique_ptr<dist::DistributedDataParallel::NoSync> no_sync;
  std::unique_ptr<dist::FullyShardedDataParallel::NoSync> fsdp_no_sync;
  if (!sync && ddp_) no_sync = ddp_->no_sync();
  if (!sync && fsdp_) fsdp_no_sync = fsdp_->no_sync();
  Tensor loss = forward_loss(batch, &out);
  out.loss = loss.item<double>();  // syncs a GPU
  if (w.options().accumulative_counts == 1) w.zero_grad(to_none);
  w.backward(w.scale_loss(loss));
  no_sync.reset();
  fsdp_no_sync.reset();
  if (!w.should_update()) return out;
  step_optimizer(out, to_none);
  return out;
}

void Runner::step_optimizer(IterOutputs& out, bool to_none) {
  out.updated = true;
  // The norm is read for the log line (on a GPU a second wait per update, after the loss's).
  out.grad_norm = optim_wrapper_->step();
  if (o_.accumulative_counts > 1 || out.joined) optim_wrapper_->zero_grad(to_none);
}

// After the others' synchronised backward this rank's .grad holds their average (dist::Join), so
// the same optimizer step keeps its parameters and optimizer state equal to theirs. The counting
// follows eager_step's, so the step comes exactly where theirs does.
void Runner::shadow_iter(bool synced) {
  call_hooks([&](Hook& h) { h.before_train_iter(*this); });
  IterOutputs out;
  out.joined = true;
  out.loss = std::nan("");
  out.lr = optimizer().lr();
  optim_wrapper_->count_pass();
  const bool step = optim_wrapper_->should_update();
  TANDEM_CHECK(step == synced, "Join: the training ranks ", synced ? "reduced" : "did not reduce",
               " gradients at global iteration ", global_iter_ + 1, " where this rank's accumulation count says the ",
               "opposite; every rank must use the same optim_wrapper.accumulative_counts");
  if (step) step_optimizer(out, !o_.model_wrapper_args.boolean("gradient_as_bucket_view", false));
  ++iter_;
  ++global_iter_;
  call_hooks([&](Hook& h) { h.after_train_iter(*this, out); });
}

}  // namespace tandem::train
