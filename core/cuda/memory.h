// Internal (not installed): the CUDA side of the tensor mechanics in
// core/tensor.cpp. Defined in core/cuda/memory.cu when the CUDA backend is
// built, and by core/cuda/no_cuda.cpp (throwing) otherwise. All work is queued
// on the device's compute stream; device-to-host copies wait for it.
#pragma once

namespace tandem {
class Tensor;
namespace cuda_detail {

// dst and src have the same shape; at least one is on a CUDA device.
void copy(Tensor& dst, const Tensor& src);
void fill(Tensor& t, double value);
void add_(Tensor& dst, const Tensor& src, double alpha);

}  // namespace cuda_detail
}  // namespace tandem
