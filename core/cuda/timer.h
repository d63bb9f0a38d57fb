// Internal (not installed): the CUDA side of DeviceTimer (core/device_timer.h). Defined in
// core/cuda/timer.cpp with the CUDA backend, and by core/cuda/no_cuda.cpp (throwing) otherwise.
#pragma once

#include <memory>

#include "core/device_timer.h"

namespace tandem::cuda_detail {

// Two timing events of `device` (start, stop).
DeviceTimer::EventsPtr make_timer_events(int device);
// Records the start or stop event on the device's compute stream.
void record_timer_event(DeviceTimer::Events& events, bool stop);
// cudaEventElapsedTime(start, stop), or NaN while stop has not been reached; never waits.
double timer_elapsed_ms(const DeviceTimer::Events& events);

}  // namespace tandem::cuda_detail
