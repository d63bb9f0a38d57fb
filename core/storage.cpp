#include "core/storage.h"

#include "core/allocator.h"

namespace tandem {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = allocator_for(device).allocate(nbytes);
}

Storage::~Storage() { allocator_for(device_).deallocate(data_, nbytes_); }

}  // namespace tandem
