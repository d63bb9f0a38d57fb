#include "core/storage.h"

#include "core/allocator.h"

namespace tandem {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = allocator_for(device).allocate(nbytes);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void()> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) release_();
  else allocator_for(device_).deallocate(data_, nbytes_);
}

}  // namespace tandem
