// SyncBatchNorm: BatchNorm2d whose training-mode statistics are those of the
// whole batch across the ranks of a process group, as
// torch.nn.SyncBatchNorm. Design: rather than swapping module objects, a
// BatchNorm2d is given a statistics-sync strategy (nn::BatchNormStatsSync,
// implemented here); models that hold typed std::shared_ptr<BatchNorm2d>
// (MnistNet's n1, n2), optimizers and reducers that hold its parameters, and
// state_dict names all stay as they were. The math composes the batch_norm
// kernels (CPU or CUDA), so no new kernel is needed.
//
// Training forward: each rank computes its per-channel mean and biased
// variance and count; one allgather of [mean, var, count] (float64) gives
// every rank the same global mean and biased variance (combined without
// cancellation: var = sum n_r (var_r + (mean_r - mean)^2) / N); x is normalised
// with them; running stats get the global mean and unbiased variance
// (N/(N-1)). Backward: one allreduce of the per-channel sum(grad_out) and
// sum(grad_out * xhat) (float64), so grad_input equals BatchNorm's over the
// global batch for the summed loss of all ranks; weight and bias gradients
// stay local sums (DDP averages them), as PyTorch's. Eval mode uses the
// running stats and never communicates; a group of one rank uses plain
// BatchNorm. The per-channel vectors travel as host tensors over Gloo and as
// device tensors over NCCL; the combining is done on the host in double (a
// device-to-host copy of a few hundred bytes per layer per pass).
// Cost over plain BatchNorm: forward one extra read+write pass over x (the
// local moments come from a training-mode kernel call whose output is
// discarded), backward two extra passes (eval-mode backward, affine
// correction) plus an add; a dedicated stats/elementwise kernel in kernels/
// would remove them.
//
// Assumes: every rank calls forward and backward of every synced layer in the
// same order (the collectives must match; all run on the calling thread, so
// they interleave with DDP's bucket all-reduces, issued from backward hooks on
// the same thread, identically on every rank). Each wait is bounded by the
// group's timeout and throws tandem::Error naming the layer's operation.
#pragma once

#include <memory>
#include <string>

#include "dist/group/process_group.h"
#include "nn/layers.h"

namespace tandem::dist {

class SyncBatchNormStats final : public nn::BatchNormStatsSync {
 public:
  explicit SyncBatchNormStats(std::shared_ptr<ProcessGroup> group);
  Tensor forward(nn::BatchNorm2d& bn, const Tensor& x) override;
  std::string name() const override;
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// A BatchNorm2d constructed already synced over `group`.
class SyncBatchNorm : public nn::BatchNorm2d {
 public:
  SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group, double eps = 1e-5,
                double momentum = 0.1);
};

// Installs SyncBatchNormStats(group) on every BatchNorm2d in root's tree
// (root included), in place; returns how many. Parameters, buffers, names and
// typed pointers are unchanged, so it may be called before or after wrapping
// the model in DistributedDataParallel and after building the optimizer.
int convert_sync_batchnorm(nn::Module& root, std::shared_ptr<ProcessGroup> group);

}  // namespace tandem::dist
