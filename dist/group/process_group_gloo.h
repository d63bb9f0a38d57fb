// ProcessGroupGloo: collectives over CPU tensors with Gloo's TCP transport (Debian's libgloo).
// Owns one Gloo context, made by a full-mesh rendezvous through the Store, and one worker thread
// that runs the issued collectives one at a time in issue order (Gloo calls block), so every
// rank runs them in the same order when every rank issues them in the same order.
// Assumes: tensors are contiguous (checked when the collective is issued, on the caller's thread)
// and stay untouched until their Work completes (the Work keeps them alive). CPU tensors are used
// in place; CUDA tensors travel through host copies made on the worker thread (the device-to-host
// copy waits for the device's queued work; the result is queued back on the device's compute
// stream before the Work completes), as PyTorch's Gloo group does: correct, not fast.
// Guarantees: every collective ends within the group's timeout (Gloo's own timeout), and its
// Work then reports success or an error naming the operation and Gloo's reason (a peer that
// closed its connection, a timeout), with the peers Gloo names by address mapped to ranks
// ("[127.0.0.1]:41235 is rank 1"). After a timeout each failed rank records the collective in the
// store and waits briefly (timeout/4, 0.5..3 s) for the others: the ranks that never report are
// named as the stopped, stuck or gone peers (or the message says the store did not answer).
// Work::wait(t) with t >= the group's timeout keeps waiting past t for a started collective
// until Gloo ends it and the diagnosis is done (bounded: group timeout + diagnosis + the store's
// timeout + 3 s), so the caller gets that message; a shorter wait ends at t as asked.
// After one collective fails the group is broken: later collectives fail at once, naming the
// first failure. The destructor finishes queued work (bounded by the timeout) and stops the
// thread; it never hangs. The group keeps the store alive (the diagnosis uses it from the worker
// thread; a long blocking store call on another thread delays it, bounded by that call).
// Intra-host all-reduce: when every rank shares this host, allreduce runs through one
// shared-memory segment (dist/group/shm_allreduce.h) instead of Gloo's TCP pairs over loopback, with
// the same ordering, timeout and failure rules (a late peer is named; a peer whose process is
// gone fails the collective at once); TANDEM_SHM=0 turns it off. Broadcast (DDP broadcasts the
// BatchNorm buffers every iteration) and allgather (SyncBatchNorm's statistics) go the same way;
// barrier always uses Gloo.
// Network interface: TANDEM_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) when set; otherwise the local
// address whose route reaches MASTER_ADDR (127.0.0.1 for loopback jobs); otherwise the
// hostname's address. Gloo's headers stay out of this header (pimpl).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/group/process_group.h"
#include "dist/store/store.h"

namespace tandem::dist {

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Meets the other size-1 ranks through `store` (waiting at most `timeout`), then connects to
  // every one of them. Throws tandem::Error naming the store and the rank on failure.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, Millis timeout);
  ~ProcessGroupGloo() override;
  ProcessGroupGloo(const ProcessGroupGloo&) = delete;
  ProcessGroupGloo& operator=(const ProcessGroupGloo&) = delete;

  std::string backend() const override { return "gloo"; }

  // Supported dtypes: float32, float64, float16, bfloat16, int32, int64, uint8 (the 16-bit
  // floats are reduced in float32 and rounded once per pairwise step, as Gloo does for fp16).
  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  // Any dtype; same shape on every rank.
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override;
  // Any dtype; outputs must be size() contiguous CPU tensors of input's shape and dtype.
  std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> barrier() override;
  // Any dtype / the reducible ones; through shared memory when allreduce is (same rules), else
  // Gloo's allgather and alltoall over TCP. CUDA tensors travel through host copies, as above.
  std::shared_ptr<Work> all_gather_into_tensor(Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                              ReduceOp op = ReduceOp::Sum) override;
  // In shared memory when allreduce runs through it (see allreduce_transport), else as the base.
  Tensor comm_buffer(int64_t numel, DType dtype, Device device) override;

  // The local address Gloo listens on, e.g. "127.0.0.1" (for logs and tests).
  std::string local_address() const;
  // How allreduce moves data: "shared memory (4096 KiB slots)" when every rank is on this host
  // (same boot and namespaces) and TANDEM_SHM is not 0 on any rank, else "tcp (<why not>)".
  std::string allreduce_transport() const;
  // How many allreduces completed by each path so far (for tests and benchmarks): in place on a
  // comm_buffer, staged through the shared slots, or over Gloo's TCP pairs.
  struct AllreducePaths {
    int64_t in_place = 0, through_slots = 0, tcp = 0;
    int64_t reduce_scatter_in_place = 0, reduce_scatter_through_slots = 0;  // reduce_scatter_tensor's, on shm
  };
  AllreducePaths allreduce_paths() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The local address this process would use to reach `host` (the source address of its route),
// found with a connected UDP socket (no packet is sent). Throws naming the host if it does not
// resolve or no route exists.
std::string local_address_toward(const std::string& host);

}  // namespace tandem::dist
