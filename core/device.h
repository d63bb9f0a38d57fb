// Where a tensor's memory lives: the host, or one CUDA device by index.
#pragma once

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

}  // namespace tandem
