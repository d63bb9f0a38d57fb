// One training iteration of the Runner: the eager step, as MMEngine's OptimWrapper.update_params
// (AMP, gradient accumulation, clipping), or the CUDA-graph step for full batches.
//
// Accumulation (accumulative_counts = N > 1), exactly MMEngine's counting over the whole run
// (inner_count = backward passes so far, max = the run's iterations, max_iters()): the loss is
// divided by N, or by max % N for the iterations of the last, short group at the end of training
// (groups run across epoch boundaries, as MMEngine's do); under DDP the backward runs inside
// no_sync() unless inner_count + 1 is a multiple of N or the last iteration, so gradients are
// all-reduced once per group; the optimizer steps (and then zeroes the gradients) after the
// backward that makes inner_count a multiple of N or the last. Clipping (clip_max_norm > 0) runs
// on the final, synchronised gradients just before the step, after AMP unscaling.
#include <spdlog/spdlog.h>

#include <cmath>

#include "nn/amp.h"
#include "nn/functional.h"
#include "optim/clip_grad.h"
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
    out.lr = optimizer_->lr();
    out.loss = graph_step_->step(batch, *optimizer_, [this](const Tensor& x, const Tensor& y) {
      return forward_loss(DataBatch{{"inputs", x}, {"labels", y}});
    }, epoch_, iter_);
    out.batch_size = n;
    out.updated = true;
    return out;
  }
  if (graph_step_) graph_step_->count_partial();
  return eager_step(task_->data_preprocessor()(batch, device_));
}

IterOutputs Runner::eager_step(const DataBatch& batch) {
  IterOutputs out;
  out.batch_size = batch_tensor(batch, "inputs").size(0);
  out.lr = optimizer_->lr();
  const int64_t counts = o_.accumulative_counts;
  const int64_t max_counts = max_iters();
  const bool last = inner_count_ + 1 == max_counts;
  const bool sync = (inner_count_ + 1) % counts == 0 || last;
  // Gradients keep their storage when they are bucket views or a CUDA graph writes them.
  const bool to_none = !o_.model_wrapper_args.boolean("gradient_as_bucket_view", false) && !o_.cuda_graph;
  std::unique_ptr<dist::DistributedDataParallel::NoSync> no_sync;
  std::unique_ptr<dist::FullyShardedDataParallel::NoSync> fsdp_no_sync;
  if (!sync && ddp_) no_sync = ddp_->no_sync();
  if (!sync && fsdp_) fsdp_no_sync = fsdp_->no_sync();
  Tensor loss = forward_loss(batch, &out);
  out.loss = loss.item<double>();  // syncs a GPU
  if (counts == 1) {
    optimizer_->zero_grad(to_none);
  } else {
    const int64_t remainder = max_counts % counts;
    const int64_t factor = inner_count_ < max_counts - remainder ? counts : remainder;
    loss = F::scale(loss, 1.0 / static_cast<double>(factor));
  }
  if (scaler_->enabled())
    scaler_->scale(loss).backward();
  else
    loss.backward();
  no_sync.reset();
  fsdp_no_sync.reset();
  ++inner_count_;
  if (inner_count_ % counts != 0 && inner_count_ != max_counts) return out;
  step_optimizer(out, to_none);
  return out;
}

void Runner::step_optimizer(IterOutputs& out, bool to_none) {
  out.updated = true;
  if (o_.clip_max_norm > 0) {
    if (scaler_->enabled()) scaler_->unscale(*optimizer_);
    // The norm is read for the log line (on a GPU a second wait per update, after the loss's).
    out.grad_norm = fsdp_ ? fsdp_->clip_grad_norm_(o_.clip_max_norm)  // the norm needs every rank's shards
                          : optim::clip_grad_norm_(wrapped_->parameters(), o_.clip_max_norm, o_.clip_norm_type)
                                .item<double>();
  }
  if (scaler_->enabled()) {
    scaler_->step(*optimizer_);  // skipped when a gradient is inf/NaN
    scaler_->update();
  } else {
    optimizer_->step();
  }
  if (o_.accumulative_counts > 1 || out.joined) optimizer_->zero_grad(to_none);
}

// After the others' synchronised backward this rank's .grad holds their average (dist::Join), so
// the same optimizer step keeps its parameters and optimizer state equal to theirs. The counting
// follows eager_step's, so the step comes exactly where theirs does.
void Runner::shadow_iter(bool synced) {
  call_hooks([&](Hook& h) { h.before_train_iter(*this); });
  IterOutputs out;
  out.joined = true;
  out.loss = std::nan("");
  out.lr = optimizer_->lr();
  ++inner_count_;
  const bool step = inner_count_ % o_.accumulative_counts == 0 || inner_count_ == max_iters();
  TANDEM_CHECK(step == synced, "Join: the training ranks ", synced ? "reduced" : "did not reduce",
               " gradients at global iteration ", global_iter_ + 1, " where this rank's accumulation count says the ",
               "opposite; every rank must use the same optim_wrapper.accumulative_counts");
  if (step) step_optimizer(out, !o_.model_wrapper_args.boolean("gradient_as_bucket_view", false));
  ++iter_;
  ++global_iter_;
  call_hooks([&](Hook& h) { h.after_train_iter(*this, out); });
}

}  // namespace tandem::train
