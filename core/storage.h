// A block of memory on one device, owned through its allocator. Tensors share
// a Storage through shared_ptr; views differ only in shape/strides/offset.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"

namespace tandem {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Memory owned elsewhere (e.g. a shared-memory mapping): `release` runs when the last tensor
  // using it goes away, instead of the device allocator's deallocate.
  Storage(void* data, size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // The memory. Where it is absent (free_memory() was called), the access hook runs first and
  // must make it present (allocate_memory() and fill it) or throw.
  void* data() {
    if (data_ == nullptr && access_hook_) run_access_hook();
    return data_;
  }
  const void* data() const { return const_cast<Storage*>(this)->data(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // Memory that comes and goes, for parameters sharded across ranks (dist/parallel/fsdp.h), as
  // PyTorch's FSDP resizes a flat parameter's storage to 0 and back: tensors and views over this
  // Storage stay valid while it has no memory, and the next read of their data runs the access
  // hook. Only for storage the device allocator owns (the first constructor).
  void free_memory();      // back to the allocator; has_memory() is then false (a no-op if absent)
  void allocate_memory();  // fresh memory, contents undefined (a no-op if present)
  bool has_memory() const { return data_ != nullptr || nbytes_ == 0; }
  // Moves this storage's memory into a new Storage, which returns it to the allocator when it goes;
  // this one is left without memory. (A reader that took the pointer before keeps valid memory for
  // as long as the returned Storage lives.)
  std::shared_ptr<Storage> take_memory();
  // Takes `from`'s memory (same size and device), leaving `from` without; this one must have none.
  void adopt_memory(Storage& from);
  // hook(*this) runs on the reading thread when data() finds the memory absent; an empty hook
  // removes it (data() then returns null while the memory is absent).
  void set_access_hook(std::function<void(Storage&)> hook);

 private:
  struct Unallocated {};
  Storage(size_t nbytes, Device device, Unallocated) : nbytes_(nbytes), device_(device) {}
  void run_access_hook();

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void()> release_;  // set for memory owned elsewhere
  std::function<void(Storage&)> access_hook_;
};

}  // namespace tandem
