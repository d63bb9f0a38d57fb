// Built instead of the CUDA backend when TANDEM_CUDA is OFF or CUDA is absent:
// every CUDA entry point of core throws a clear error, and no device exists.
#include "core/allocator.h"
#include "core/cuda/memory.h"
#include "core/cuda/timer.h"
#include "core/error.h"
#include "core/tensor.h"

namespace tandem {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  TANDEM_FAIL(what, ": Tandem was built without CUDA (reconfigure with -DTANDEM_CUDA=ON)");
}
}  // namespace

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "Tandem was built without CUDA"; }
void set_cuda_device(int) { no_cuda("set_cuda_device"); }
void synchronize(Device device) {
  if (device.is_cuda()) no_cuda("synchronize(cuda)");
}
CachingAllocator& cuda_allocator(int) { no_cuda("cuda_allocator"); }
namespace cuda {
uint64_t host_sync_count() { return 0; }
uint64_t host_upload_count() { return 0; }
}  // namespace cuda

namespace cuda_detail {
void copy(Tensor&, const Tensor&) { no_cuda("copy to or from a CUDA tensor"); }
void fill(Tensor&, double) { no_cuda("fill_ on a CUDA tensor"); }
void add_(Tensor&, const Tensor&, double) { no_cuda("add_ on a CUDA tensor"); }
}  // namespace cuda_detail

struct DeviceTimer::Events {};
void DeviceTimer::EventsDeleter::operator()(Events* e) const { delete e; }

namespace cuda_detail {
DeviceTimer::EventsPtr make_timer_events(int) { no_cuda("DeviceTimer on a CUDA device"); }
void record_timer_event(DeviceTimer::Events&, bool) { no_cuda("DeviceTimer on a CUDA device"); }
double timer_elapsed_ms(const DeviceTimer::Events&) { no_cuda("DeviceTimer on a CUDA device"); }
}  // namespace cuda_detail

}  // namespace tandem
