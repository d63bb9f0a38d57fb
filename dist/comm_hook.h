// Communication hooks: how the reducer turns one bucket (a flat float32
// buffer holding gradients already divided by the world size) into its
// all-reduced value. A hook returns a Work; when that Work's wait() returns,
// the buffer must hold the result. Built in: plain allreduce, and fp16/bf16
// compression (the bucket travels in half precision and is written back in
// float32), as PyTorch's default_hooks. Users pass their own CommHook.
#pragma once

#include <functional>
#include <memory>

#include "dist/process_group.h"

namespace tandem::dist {

using CommHook = std::function<std::shared_ptr<Work>(ProcessGroup& group, Tensor& bucket)>;

std::shared_ptr<Work> allreduce_hook(ProcessGroup& group, Tensor& bucket);
std::shared_ptr<Work> fp16_compress_hook(ProcessGroup& group, Tensor& bucket);
std::shared_ptr<Work> bf16_compress_hook(ProcessGroup& group, Tensor& bucket);

// "allreduce", "fp16", "bf16" (throws naming the text otherwise).
CommHook comm_hook_by_name(const std::string& name);

}  // namespace tandem::dist
