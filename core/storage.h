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

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void()> release_;  // set for memory owned elsewhere
};

}  // namespace tandem
