// DeviceTimer: the time a span of work takes where it runs, without waiting for it. On a CUDA
// device the span is the stretch of the device's compute stream between start() and stop()
// (two timing events recorded there), read later with elapsed_ms(), which never blocks: it is
// NaN until the stream has passed stop(). On the CPU it is host wall time between the two calls.
// Used by the DDP reducer to measure the communication backward could not hide on a GPU, where
// the host never waits for it. Not thread-safe; start() again begins a new span.
#pragma once

#include <chrono>
#include <memory>

#include "core/device.h"

namespace tandem {

class DeviceTimer {
 public:
  explicit DeviceTimer(Device device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  void start();
  void stop();
  // Milliseconds between the last start() and stop(); NaN before both were called, and on a CUDA
  // device while the stream has not reached stop() yet.
  double elapsed_ms() const;
  Device device() const { return device_; }

  struct Events;  // the CUDA events (core/cuda/timer.cpp)
  struct EventsDeleter {
    void operator()(Events* e) const;  // defined beside Events
  };
  using EventsPtr = std::unique_ptr<Events, EventsDeleter>;

 private:
  Device device_;
  EventsPtr events_;
  std::chrono::steady_clock::time_point t0_{}, t1_{};
  bool started_ = false, stopped_ = false;
};

}  // namespace tandem
