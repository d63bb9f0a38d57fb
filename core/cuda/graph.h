// CUDA graphs for a whole training step (the trainer's --cuda-graph): capture the kernels one
// step queues on a device's compute stream once, then replay them with one launch per step.
// Owns: one captured and instantiated graph (cudaStreamBeginCapture / cudaStreamEndCapture /
//   cudaGraphInstantiate / cudaGraphLaunch on kernels::cuda::compute_stream(device)).
// Memory: the capture allocates from a private pool of the device's caching allocator, so every
//   block the graph touches stays reserved for its replays (even blocks the captured step freed)
//   until reset() or destruction, which first wait for the queued replays; empty_cache() never
//   frees them.
// Deferred kernel errors (an out-of-range nll_loss target) found by a replay are reported by the
//   next device-to-host copy, as for uncaptured work.
// Assumes (the caller's contract, not checked here):
//  - the captured region does no host synchronisation (no .item(), no device-to-host copy, no
//    GradScaler::step, whose found_inf read syncs): run a warm-up step uncaptured first, so that
//    library handles and algorithm choices are made outside the capture;
//  - every tensor the region reads or writes keeps its storage (same device address) for as long
//    as the graph is replayed: copy each new batch into the captured input tensors; keep the
//    outputs, parameters, gradients and optimizer state alive, and never set grads to none;
//  - capture runs on the thread that later replays (capture mode thread-local).
// Guarantees: replay() queues the captured work on the compute stream, ordered after what is
// already queued there, and returns without waiting. A random kernel captured (dropout) draws new
// numbers on every replay, from the distribution it draws from eagerly: it reads the graph's
// replay counter, which the graph advances on the device (core/cuda/context.h); the host
// Generator is drawn at capture only. Without the CUDA backend every call but
// supported() throws "built without CUDA".
#pragma once

#include <memory>

#include "core/error.h"

namespace tandem::cuda {

class Graph {
 public:
  explicit Graph(int device);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void begin_capture();  // from here on, work queued on the compute stream is recorded, not run
  void end_capture();    // stops recording and instantiates; throws naming the CUDA error
  void replay();         // one cudaGraphLaunch on the compute stream
  void reset();          // waits for queued replays, drops the graph and its pool (capture again after shapes change)
  bool captured() const;
  int device() const { return device_; }

  static bool supported();  // true in builds with the CUDA backend

 private:
  void release_memory();
  struct Impl;
  int device_;
  std::unique_ptr<Impl> impl_;
};

#ifndef TANDEM_WITH_CUDA
// Builds without CUDA: the class exists so callers compile; using it is a clear error.
struct Graph::Impl {};
inline Graph::Graph(int device) : device_(device) {
  TANDEM_FAIL("cuda::Graph: Tandem was built without CUDA (reconfigure with -DTANDEM_CUDA=ON)");
}
inline Graph::~Graph() = default;
inline void Graph::begin_capture() {}
inline void Graph::end_capture() {}
inline void Graph::replay() {}
inline void Graph::reset() {}
inline void Graph::release_memory() {}
inline bool Graph::captured() const { return false; }
inline bool Graph::supported() { return false; }
#endif

}  // namespace tandem::cuda
