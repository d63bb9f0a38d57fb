// ProcessGroupNccl: collectives over CUDA tensors of one device with NCCL. Public and free of
// CUDA/NCCL headers (pimpl); defined by dist/group/cuda/process_group_nccl.cpp in CUDA builds, and by
// dist/group/process_group.cpp in builds without CUDA, where the constructor throws a clear error.
// Streams: each group owns one communication stream on its device. A collective records an
// event on the device's compute stream (core/cuda/context.h) and makes the communication
// stream wait on it, so it sees everything queued before it without a host synchronisation;
// it then records a completion event (`done`), which its Work holds.
// Waiting: nothing blocks the host on a collective unless asked to.
//  - Work::wait(timeout) makes the compute stream wait on `done` (cudaStreamWaitEvent) and
//    returns at once: kernels and device-to-host copies queued after it see the result, while
//    the host goes on (so backward and communication overlap). It throws at once if the group
//    has recorded an error. Its timeout bounds nothing: the watchdog enforces the group's.
//  - Work::synchronize(timeout) does the same, then polls `done` on the host, checking NCCL's
//    asynchronous error, until it is reached; after `timeout` it aborts the communicator and
//    throws naming the collective, the rank and the timeout. barrier()'s wait() behaves so.
//  - Work::is_completed() queries `done` without blocking (true once the group has failed).
// Watchdog: a thread per group checks the unfinished collectives every 100 ms. When one has been
// outstanding longer than the group's timeout, or NCCL reports an asynchronous error, it aborts
// the communicator (ncclCommAbort: the stuck kernels return and the streams drain), records an
// error naming the collective, the rank and the reason, and prints it once to stderr (the host
// may never call into the group again). After that every collective call, wait() and
// synchronize() on the group throws tandem::Error with that message; the group is unusable.
// Assumes: tensors are contiguous CUDA tensors on the group's device; every rank issues the
// same collectives in the same order. The group keeps the tensors of unfinished collectives
// alive until their events are reached, so dropping a Work (or the tensors) early does not free
// memory the communication stream still uses. The destructor lets unfinished collectives end
// (at most about the timeout, then aborts), stops the watchdog, then finalizes the communicator;
// it never throws.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/group/process_group.h"
#include "dist/store/store.h"

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
  Device comm_device() const override { return Device::cuda(device()); }

  // float32, float64, float16, bfloat16, int32, int64, uint8.
  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) override;
  // ncclAllGather / ncclReduceScatter straight between the flat buffers (no copies); Avg is ncclAvg.
  std::shared_ptr<Work> all_gather_into_tensor(Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                              ReduceOp op = ReduceOp::Sum) override;
  // An allreduce of one float on the device (NCCL has no barrier). A host synchronisation point:
  // its Work's wait() blocks the host as synchronize() does.
  std::shared_ptr<Work> barrier() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::dist
