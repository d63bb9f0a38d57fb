// A block of memory on one device, owned through its allocator. Tensors share
// a Storage through shared_ptr; views differ only in shape/strides/offset.
#pragma once

#include <cstddef>
#include <memory>

#include "core/device.h"

namespace tandem {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
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
};

}  // namespace tandem
