#include "core/storage.h"

#include "core/allocator.h"
#include "core/error.h"

namespace tandem {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = allocator_for(device).allocate(nbytes);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void()> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) release_();
  else if (data_ != nullptr || nbytes_ == 0) allocator_for(device_).deallocate(data_, nbytes_);
}

void Storage::free_memory() {
  TANDEM_CHECK(!release_, "Storage::free_memory: this memory is owned elsewhere (a mapping), not by the allocator");
  if (data_ == nullptr) return;
  allocator_for(device_).deallocate(data_, nbytes_);
  data_ = nullptr;
}

void Storage::allocate_memory() {
  TANDEM_CHECK(!release_, "Storage::allocate_memory: this memory is owned elsewhere (a mapping)");
  if (data_ != nullptr || nbytes_ == 0) return;
  data_ = allocator_for(device_).allocate(nbytes_);
}

std::shared_ptr<Storage> Storage::take_memory() {
  TANDEM_CHECK(!release_, "Storage::take_memory: this memory is owned elsewhere (a mapping)");
  std::shared_ptr<Storage> out(new Storage(nbytes_, device_, Unallocated{}));
  out->data_ = data_;
  data_ = nullptr;
  return out;
}

void Storage::adopt_memory(Storage& from) {
  TANDEM_CHECK(!release_ && !from.release_, "Storage::adopt_memory: memory owned elsewhere (a mapping)");
  TANDEM_CHECK(from.nbytes_ == nbytes_ && from.device_ == device_, "Storage::adopt_memory: ", from.nbytes_,
               " bytes on ", from.device_.str(), " offered to a storage of ", nbytes_, " bytes on ", device_.str());
  TANDEM_CHECK(data_ == nullptr, "Storage::adopt_memory: this storage still has its memory");
  data_ = from.data_;
  from.data_ = nullptr;
}

void Storage::set_access_hook(std::function<void(Storage&)> hook) { access_hook_ = std::move(hook); }

void Storage::run_access_hook() {
  if (nbytes_ == 0) return;
  access_hook_(*this);
  TANDEM_CHECK(data_ != nullptr, "Storage: the access hook left the memory absent");
}

}  // namespace tandem
