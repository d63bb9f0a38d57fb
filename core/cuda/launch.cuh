// Internal to the .cu files of the CUDA backend: the one way to launch a kernel. launch() takes a
// StreamGuard (core/cuda/context.h), which made the kernel's device current for its scope and
// holds that device's compute stream, so a launch without a guard, or on another device's stream,
// cannot be written; it checks the launch (bad configuration, no kernel image for this GPU).
// Also the device side of the deferred kernel errors (report_kernel_error).
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

#ifdef __CUDACC__
// Called by a kernel thread that found bad input (context.h's deferred errors): the first report
// on the device claims the record, later ones are dropped. The caller then skips the element, so no
// memory outside the operands is read or written.
__device__ inline void report_kernel_error(KernelErrorRecord* rec, int code, int op, long long a, long long b,
                                           long long c) {
  if (atomicCAS(&rec->code, int(kNoKernelError), code) == int(kNoKernelError)) {
    rec->op = op;
    rec->a = a;
    rec->b = b;
    rec->c = c;
  }
}
#endif

}  // namespace tandem::cuda
