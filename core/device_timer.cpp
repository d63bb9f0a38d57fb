// DeviceTimer's host side (see the header); the CUDA events live in core/cuda/timer.cpp, or in
// core/cuda/no_cuda.cpp, which refuses CUDA devices, in builds without CUDA.
#include "core/device_timer.h"

#include <limits>

#include "core/cuda/timer.h"

namespace tandem {

DeviceTimer::DeviceTimer(Device device)
    : device_(device), events_(device.is_cuda() ? cuda_detail::make_timer_events(device.index) : nullptr) {}

DeviceTimer::~DeviceTimer() = default;

void DeviceTimer::start() {
  if (events_) {
    cuda_detail::record_timer_event(*events_, /*stop=*/false);
  } else {
    t0_ = std::chrono::steady_clock::now();
  }
  started_ = true;
  stopped_ = false;
}

void DeviceTimer::stop() {
  if (events_) {
    cuda_detail::record_timer_event(*events_, /*stop=*/true);
  } else {
    t1_ = std::chrono::steady_clock::now();
  }
  stopped_ = started_;
}

double DeviceTimer::elapsed_ms() const {
  if (!stopped_) return std::numeric_limits<double>::quiet_NaN();
  if (events_) return cuda_detail::timer_elapsed_ms(*events_);
  return std::chrono::duration<double, std::milli>(t1_ - t0_).count();
}

}  // namespace tandem
