// Internal to the .cu files of the CUDA backend: the one way to launch a kernel. launch() takes a
// StreamGuard (core/cuda/context.h), which made the kernel's device current for its scope and
// holds that device's compute stream, so a launch without a guard, or on another device's stream,
// cannot be written; it checks the launch (bad configuration, no kernel image for this GPU).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda/context.h"

namespace tandem::cuda {

template <typename... Params, typename... Args>
void launch(const StreamGuard& on, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            Args&&... args) {
  kernel<<<grid, block, shared_bytes, on.stream()>>>(std::forward<Args>(args)...);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
