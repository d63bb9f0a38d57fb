// ProcessGroupNccl: collectives over CUDA tensors of one device with NCCL. Public and free of
// CUDA/NCCL headers (pimpl); defined by dist/cuda/process_group_nccl.cpp in CUDA builds, and by
// dist/process_group.cpp in builds without CUDA, where the constructor throws a clear error.
// Streams: each group owns one communication stream on its device. A collective records an
// event on the device's compute stream (kernels/cuda/context.h) and makes the communication
// stream wait on it, so it sees everything queued before it without a host synchronisation;
// it then records a completion event, which its Work holds.
// Work: is_completed() queries the event; wait(timeout) polls the event and the communicator's
// asynchronous error until the timeout, then aborts the communicator (the group is unusable
// afterwards) and throws naming the operation; once complete, it makes the compute stream wait
// on the completion event, so compute queued after wait() sees the result.
// Assumes: tensors are contiguous CUDA tensors on the group's device; every rank issues the
// same collectives in the same order. The group keeps the tensors of unfinished collectives
// alive, so dropping a Work early does not free memory the communication stream still uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "dist/store.h"

namespace tandem::dist {

class ProcessGroupNccl : public ProcessGroup {
 public:
  // Rank 0 makes the NCCL unique id and publishes it in `store`; the others read it (waiting at
  // most `timeout`); then all create the communicator on CUDA device `device` (non-blocking
  // initialisation, aborted and reported after `timeout`).
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, Millis timeout, int device);
  ~ProcessGroupNccl() override;
  ProcessGroupNccl(const ProcessGroupNccl&) = delete;
  ProcessGroupNccl& operator=(const ProcessGroupNccl&) = delete;

  std::string backend() const override { return "nccl"; }
  int device() const;

  // float32, float64, float16, bfloat16, int32, int64, uint8.
  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) override;
  // An allreduce of one float on the device (NCCL has no barrier), waited by its Work.
  std::shared_ptr<Work> barrier() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::dist
