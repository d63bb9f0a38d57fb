// make_process_group: the one place that turns a backend name into a ProcessGroup, so callers
// (environment initialisation, apps, tests) never name a concrete backend class.
//   "gloo" -> ProcessGroupGloo (CPU tensors); "nccl" -> ProcessGroupNccl (CUDA tensors; a build
//   without CUDA throws saying so); "auto" -> nccl when this build has CUDA and a device is
//   visible, else gloo.
// NCCL device: `device` when >= 0, else LOCAL_RANK (0 when unset), which must be below the
// number of visible devices (CUDA_VISIBLE_DEVICES respected by the runtime).
#pragma once

#include <memory>
#include <string>

#include "dist/group/process_group.h"
#include "dist/store/store.h"

namespace tandem::dist {

std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend, std::shared_ptr<Store> store,
                                                 int rank, int size, Millis timeout, int device = -1);

}  // namespace tandem::dist
