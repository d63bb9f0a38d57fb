// The Runner's CUDA-graph train step (RunnerOptions::cuda_graph; CUDA, one rank). After kWarmup
// uncaptured iterations in this process (so the caching allocator holds every block the step needs
// and every gradient and optimizer buffer exists), each full batch is copied into fixed input/label
// tensors and one captured graph of forward + backward + optimizer step (plus a copy of the loss
// into a fixed tensor) is replayed; the loss is read from that tensor after the replay. The graph is
// captured again whenever the lr changes (StepLR, once per epoch: the lr is a kernel argument baked
// into the capture), after one more eager step. Warm-up steps run the very same code on the fixed
// tensors, so the capture allocates exactly what the warm-up left in the cache. Partial batches run
// uncaptured (the Runner's eager step). Gradients are zeroed in place (never set to none) for the
// whole run so their storage stays where the graph writes it. BatchNorm's num_batches_tracked
// counter is kept on the host (its device update would sync inside the capture) and advanced here
// after each replay. Internal to train/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/graph.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace tandem::train {

class CudaGraphStep {
 public:
  using LossFn = std::function<Tensor(const Tensor&, const Tensor&)>;
  // Moves net's num_batches_tracked counters to the host; call before the first forward.
  CudaGraphStep(nn::Module& net, Device device, std::string optimizer_name);
  // One full batch through the fixed tensors (warm-up, capture or replay); returns the loss.
  double step(const data::Batch& batch, optim::Optimizer& opt, const LossFn& forward_loss, int64_t epoch, int64_t it);
  void count_partial() { ++partial_; }
  void report() const;  // the log line at the end of the run

 private:
  static constexpr int64_t kWarmup = 3;
  Device device_;
  std::string optimizer_name_;
  std::vector<Tensor> batch_counters_;
  std::unique_ptr<cuda::Graph> graph_;
  Tensor x_, y_, loss_;
  double graph_lr_ = 0;
  int64_t uncaptured_done_ = 0;  // eager full-batch steps since the last (re)start of the warm-up
  int64_t warmups_ = 0, captures_ = 0, replays_ = 0, partial_ = 0;
};

}  // namespace tandem::train
