// Process groups: the collectives of one job across `size()` ranks. Every call
// is asynchronous and returns a Work; collectives run in the order they were
// issued on every rank (callers must issue them in the same order on every
// rank). Tensors are used in place and must stay alive and untouched until the
// Work completes. CPU tensors go to Gloo, CUDA tensors to NCCL.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/store/store.h"

namespace tandem::dist {

// Avg: the sum divided by the number of ranks (PyTorch's ReduceOp.AVG), for floating-point dtypes.
enum class ReduceOp { Sum, Max, Min, Avg };
const char* reduce_op_name(ReduceOp op);  // "sum", "max", "min", "avg"

// One issued collective. wait() throws tandem::Error, naming the operation,
// when it failed or did not finish within the timeout (the group's by default).
// What wait() guarantees depends on the backend: Gloo's blocks the host until the
// result is in place; NCCL's does not block the host: it makes the device's compute
// stream wait for the collective and returns, so the result is in place for all work
// queued on that stream after wait() (kernels, and device-to-host copies, which wait
// for that stream); its timeout is enforced by the group's watchdog thread.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait(Millis timeout) = 0;
  // Blocks the host until the result is in place (for timing and for host reads that
  // do not go through the device's compute stream). Throws as wait() does, and when the
  // result is not in place within `timeout`. The default calls wait(), which already
  // blocks the host where the collective runs on the host (Gloo).
  virtual void synchronize(Millis timeout) { wait(timeout); }
  // The operation's name, e.g. "allreduce(float32[1048576])".
  virtual std::string description() const = 0;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, Millis timeout) : rank_(rank), size_(size), timeout_(timeout) {}
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Millis timeout() const { return timeout_; }
  virtual std::string backend() const = 0;  // "gloo", "nccl"
  // Where this group's collectives want their tensors: the host for Gloo (which also takes CUDA
  // tensors, through host copies), the group's GPU for NCCL (which takes nothing else). Engine code
  // that sends values of its own builds them here (dist/group/host_values.h).
  virtual Device comm_device() const { return Device::cpu(); }

  // Element-wise reduction of `tensor` across ranks, result on every rank.
  virtual std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // Copies root's `tensor` into every rank's `tensor`.
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, int root) = 0;
  // outputs[r] receives rank r's `input` (outputs.size() == size(), same shape as input).
  virtual std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // The collectives of sharding (PyTorch's all_gather_into_tensor and reduce_scatter_tensor), on
  // flat tensors: with n = input.numel(), `output` (size() * n elements, any shape, contiguous,
  // input's dtype and device) receives rank r's input at elements [r*n, (r+1)*n).
  virtual std::shared_ptr<Work> all_gather_into_tensor(Tensor& output, const Tensor& input) = 0;
  // With n = output.numel(), `input` holds size() * n elements; `output` receives the reduction
  // over ranks of the input's elements [rank()*n, (rank()+1)*n). Sum and Avg reduce in rank
  // order, so a value reduces to the same bits as allreduce's on the Gloo and shared-memory paths.
  virtual std::shared_ptr<Work> reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                                      ReduceOp op = ReduceOp::Sum) = 0;

  // A zero-filled contiguous buffer of `numel` elements that this group's collectives can use in
  // place (DDP's buckets live in one). Collective: every rank calls it in the same order with the
  // same arguments. ProcessGroupGloo maps it in shared memory when every rank is on this host, so
  // that allreduce on it, or on a slice every rank passes at the same offset, reads the peers'
  // data where it lies; everywhere else it is Tensor::zeros, which works the same, with copies.
  virtual Tensor comm_buffer(int64_t numel, DType dtype, Device device) {
    return Tensor::zeros({numel}, dtype, device);
  }

 protected:
  int rank_, size_;
  Millis timeout_;
};

// The checks every backend makes on all_gather_into_tensor's / reduce_scatter_tensor's arguments
// before issuing them: defined, contiguous, one dtype and device, sizes as documented above, and
// Avg only on floating-point dtypes. Fails naming `who` ("ProcessGroupGloo"), the operation and the
// expected sizes. `gather` selects which of the two relations is checked.
void check_flat_collective(const std::string& who, bool gather, const Tensor& output, const Tensor& input,
                           int size, ReduceOp op = ReduceOp::Sum);

}  // namespace tandem::dist
