// DeviceTimer's CUDA events (see core/device_timer.h): two timing events per timer, recorded on
// the device's compute stream under a guard; reading them queries, never synchronises.
#include "core/cuda/timer.h"

#include <limits>
#include <memory>

#include "core/cuda/context.h"

namespace tandem {

struct DeviceTimer::Events {
  int device = 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Events() {
    // Destroying an event whose record is pending is allowed: it is released once reached.
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

void DeviceTimer::EventsDeleter::operator()(Events* e) const { delete e; }

namespace cuda_detail {

DeviceTimer::EventsPtr make_timer_events(int device) {
  DeviceTimer::EventsPtr e(new DeviceTimer::Events());
  e->device = device;
  cuda::DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaEventCreate(&e->start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&e->stop));
  return e;
}

void record_timer_event(DeviceTimer::Events& events, bool stop) {
  cuda::StreamGuard on(events.device);
  TANDEM_CUDA_CHECK(cudaEventRecord(stop ? events.stop : events.start, on.stream()));
}

double timer_elapsed_ms(const DeviceTimer::Events& events) {
  cuda::DeviceGuard guard(events.device);
  const cudaError_t q = cudaEventQuery(events.stop);
  if (q == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return std::numeric_limits<double>::quiet_NaN();
  }
  TANDEM_CUDA_CHECK(q);
  float ms = 0.0f;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  return ms;
}

}  // namespace cuda_detail
}  // namespace tandem
