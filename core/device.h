// Where a tensor's memory lives: the host, or one CUDA device by index.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  // "cpu", "cuda", "cuda:1"; throws naming the text otherwise.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// True when this build contains the CUDA backend.
bool cuda_compiled();
// Number of CUDA devices visible to this process (0 without CUDA, without a
// driver, or with CUDA_VISIBLE_DEVICES=-1).
int cuda_device_count();
// Why cuda_device_count() is 0, for error messages: "" when devices are visible; "built without
// CUDA"; "CUDA_VISIBLE_DEVICES=... hides every device"; or the runtime's error by name and text
// (e.g. "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime
// version", a driver older than the toolkit), so a broken driver never reads as "no GPU".
std::string cuda_unavailable_reason();
// Makes CUDA device `index` the calling thread's current device (cudaSetDevice). A process calls it
// once, when it picks its device, before creating anything on the GPU; every kernel launch still
// runs under a guard for its tensors' device. Throws naming the index and what is visible, or
// "built without CUDA".
void set_cuda_device(int index);
// Blocks the host until the work queued on `device`'s compute stream has run (as
// torch.cuda.synchronize), then reports a deferred kernel error if one was found. Nothing for the CPU.
void synchronize(Device device);

namespace cuda {
// How many times this process has blocked the host on a CUDA device: every stream or device
// synchronisation the engine issues (synchronize above, device-to-host copies and so .item(), the
// wait after a pinned upload, the read of the deferred kernel-error record, empty_cache, the
// release of a graph's pool, waiting on an NCCL work). All of them go through one counter in
// core/cuda/context.cpp. Always 0 in a build without CUDA. Monotonic; compare two readings.
uint64_t host_sync_count();
// How many host-to-device copies the engine has queued (Tensor::copy_ / to(cuda) from host
// memory). They need not block the host, but each is work in a step that could stay on the
// device. Always 0 in a build without CUDA.
uint64_t host_upload_count();
}  // namespace cuda

}  // namespace tandem
