// ShmAllreduce: all-reduce (and broadcast, all-gather, reduce-scatter) between the ranks of one host through shared memory,
// the intra-host transport of ProcessGroupGloo (Gloo's TCP pairs over loopback cost two kernel
// copies per byte and per hop, on the cores that also compute).
// Owns: the mapping of the segment (POSIX shm, named only while the ranks attach, then
// unlinked, so nothing stays in /dev/shm even when a rank is killed) and this rank's barrier
// sequence. Layout: a control block (per rank: an arrival counter on its own cache line, the
// pid, the call it is in) then two sets of `size` slots of `slot_bytes` each, used alternately
// chunk by chunk.
// Buffers (allocate(), behind ProcessGroup::comm_buffer): each rank's buffer is a segment of its
// own that every peer maps too. An allreduce over a range that every rank passes at the same
// offset of such a buffer runs in place: rank r sums the r-th part reading the peers' buffers
// where they lie and writes the sum into every buffer, block by block while it is in cache, then
// one barrier (every part is in every buffer, and no peer still touches this rank's buffer, when
// the call returns). Well under half the memory traffic of the slot path, and no staging copy.
// A reduce-scatter whose input lies in such a buffer runs in place the same way: rank r folds
// the r-th part of every rank's input where it lies into its output, then one barrier.
// Both paths sum in rank order ((x0 + x1) + x2 ...), so a tensor reduces to the same bits in
// place or through the slots, on every rank.
// Every call first publishes (kind, buffer, offset or root, count, element size) and passes
// one barrier, so all ranks choose the same path, and mismatched kinds, roots and sizes fail
// naming the ranks instead of corrupting data or hanging.
// Slot path, per chunk of at most slot_bytes: every rank copies its chunk into its slot;
// barrier; small chunks: every rank reduces all slots itself, in rank order; large ones: rank r
// reduces the r-th of `size` parts of all slots (in rank order) into its own slot and tensor,
// barrier, then copies the others' parts. Results are bit-identical on every rank and
// deterministic. Alternating sets makes a third barrier unnecessary: a set is written again
// only after the next chunk's first barrier, which every rank passes after it has finished
// reading that set.
// Waits: spin briefly, then futex on the shared counter (no core burnt while the peer
// computes); every wait ends by the collective's deadline, and sooner when a peer's process is
// gone. Errors name the peer: "Timed out waiting 2000ms for rank 1 (pid 4242) ..." or "rank 1
// (pid 4242) exited ...".
// Assumes: one worker thread per group calls allreduce, broadcast and allgather (collectives in
// the same order on every rank, as ProcessGroup requires); allocate() runs on the caller's thread
// and only uses the store.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/store/store.h"

namespace tandem::dist {

class ShmAllreduce {
 public:
  // c[i] = op(a[i], b[i]) for n elements; c may alias a or b.
  using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

  // Collective over `store` (keys under `prefix`): every rank learns whether all `size` ranks
  // share this host (same boot, and the same mount, IPC, network and PID namespaces), and if
  // so rank 0 makes the segment and the others attach. Returns nullptr on every rank (with
  // `why_not` saying why) when they do not, when TANDEM_SHM=0, when size < 2, or when any rank
  // could not map the segment; all ranks get the same answer. Throws only when the store does.
  static std::unique_ptr<ShmAllreduce> create(Store& store, const std::string& prefix, int rank, int size,
                                              Millis timeout, std::string& why_not);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // In place on `data` (count elements of elem_size bytes), within `timeout` for the whole call.
  // Throws tandem::Error naming the late or exited peer; after a throw the segment's barriers
  // are out of step, so the caller must treat the group as broken.
  void allreduce(void* data, size_t count, size_t elem_size, const ReduceFn& fn, Millis timeout);
  // Copies root's `nbytes` at `data` to every rank's `data`, chunk by chunk through root's slots
  // (root writes, barrier, the others read). Same timeout, failure and size-check rules.
  void broadcast(void* data, size_t nbytes, int root, Millis timeout);
  // outputs[r] (size() of them, nbytes each) receives rank r's `nbytes` at `input`, chunk by chunk
  // through every rank's slot (each writes its own, barrier, each reads all).
  void allgather(const void* input, const std::vector<void*>& outputs, size_t nbytes, Millis timeout);
  // `output` (count elements) receives the reduction, in rank order, of every rank's elements
  // [rank*count, (rank+1)*count) of `input` (size()*count elements). In place when every rank's
  // input lies at the same offset of a buffer from allocate() (and the output is apart from the
  // input, or exactly this rank's part of it): each rank folds its part of the peers' inputs where
  // they lie into its output, block by block, then one barrier (no peer reads its input any more).
  // Otherwise chunk by chunk through the slots: each rank copies its input's part for every rank
  // into its slot, barrier, each reduces its own parts of all slots. Both give the same bits.
  void reduce_scatter(const void* input, void* output, size_t count, size_t elem_size, const ReduceFn& fn,
                      Millis timeout);

  // A zero-filled buffer of `bytes` that every rank maps (collective through `store`: every rank
  // calls it in the same order with the same size). data is null on every rank when any rank
  // could not map it (callers then use ordinary memory). `release` unmaps this rank's mappings
  // of it and must run before the ShmAllreduce is destroyed or after; either order is safe.
  struct Buffer {
    void* data = nullptr;
    std::function<void()> release;
  };
  Buffer allocate(Store& store, size_t bytes, Millis timeout);

  // All-reduces that ran in place on a buffer / through the slots; the same for reduce-scatters.
  int64_t in_place_calls() const { return in_place_calls_.load(); }
  int64_t slot_calls() const { return slot_calls_.load(); }
  int64_t reduce_scatter_in_place_calls() const { return rs_in_place_calls_.load(); }
  int64_t reduce_scatter_slot_calls() const { return rs_slot_calls_.load(); }

  size_t slot_bytes() const { return slot_bytes_; }

 private:
  ShmAllreduce() = default;
  struct Registry;
  void barrier(std::chrono::steady_clock::time_point deadline, Millis timeout);
  // Publishes this rank's call, passes a barrier, fails naming a rank in another kind of
  // collective or whose count or element size differ; true when every rank published the same
  // (buffer, offset).
  bool agree(int32_t kind, int32_t buffer, int64_t offset, size_t count, size_t elem_size,
             std::chrono::steady_clock::time_point deadline, Millis timeout);
  // The buffer from allocate() that holds [data, data + nbytes) (buffer -1 and no copies when none),
  // the offset in it and every rank's copy of that range, in rank order.
  std::vector<unsigned char*> locate(const void* data, size_t nbytes, int32_t& buffer, int64_t& offset) const;
  unsigned char* slot(int set, int rank) const;
  void reduce_through_slots(unsigned char* data, size_t count, size_t elem_size, const ReduceFn& fn,
                            std::chrono::steady_clock::time_point deadline, Millis timeout);
  // `copies`: every rank's copy of the tensor, in rank order (this rank's own at rank_).
  void reduce_in_place(const std::vector<unsigned char*>& copies, size_t count, size_t elem_size,
                       const ReduceFn& fn, std::chrono::steady_clock::time_point deadline, Millis timeout);
  void reduce_scatter_in_place(const std::vector<unsigned char*>& copies, unsigned char* out, size_t count,
                               size_t elem_size, const ReduceFn& fn, std::chrono::steady_clock::time_point deadline,
                               Millis timeout);

  std::string prefix_;
  std::shared_ptr<Registry> registry_;  // the buffers; shared with their release functions
  int buffers_made_ = 0;
  std::atomic<int64_t> in_place_calls_{0}, slot_calls_{0}, rs_in_place_calls_{0}, rs_slot_calls_{0};
  int rank_ = 0, size_ = 1;
  size_t slot_bytes_ = 0, segment_bytes_ = 0;
  void* base_ = nullptr;
  uint32_t seq_ = 0;  // barriers passed
  int set_ = 0;       // the slot set the next chunk uses
};

}  // namespace tandem::dist
