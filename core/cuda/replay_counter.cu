// The kernel that advances a cuda::Graph's replay counter (core/cuda/context.h: random kernels
// under graph capture). Captured as the graph's last node, after every kernel that reads the
// counter, so replay r's random kernels read r and the next replay's read r + 1.
#include "core/cuda/context.h"
#include "core/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

__global__ void advance_replay_counter(uint64_t* counter) { *counter += 1; }

}  // namespace

void queue_replay_counter_advance(int device, uint64_t* counter) {
  StreamGuard on(device);
  launch(on, advance_replay_counter, 1, 1, 0, counter);
}

}  // namespace tandem::cuda
