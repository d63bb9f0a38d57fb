// The CUDA side of Tensor::copy_, fill_ and add_ (declared in core/cuda/memory.h).
//
// Ordering: all device work is queued on the compute stream of the device involved
// (core/cuda/context.h), so it is ordered after every kernel queued before it.
//  - host -> device: cudaMemcpyAsync on the destination's stream. From pageable host memory the
//    driver stages the data before the call returns, so the host buffer may be reused at once.
//    From pinned (page-locked) host memory the copy is truly asynchronous, and nothing tells us
//    how long the caller keeps the buffer, so we wait for the stream then.
//  Each upload is counted (host_upload_count), and each wait below is a counted host
//  synchronisation (core/cuda/context.h's stream_synchronize).
//  - device -> host: cudaMemcpyAsync, then wait for the source's stream; that wait also surfaces
//    deferred kernel errors (wait_and_check_kernel_errors), e.g. an out-of-range nll_loss target.
//  - device -> other device: the source stream waits for the destination stream's queued work
//    (an event), copies peer-to-peer, and the destination stream waits for the copy (an event).
// Layouts and dtypes: same-dtype contiguous copies are one memcpy. Anything else (strided views,
// dtype casts between any of the seven dtypes) runs one elementwise kernel on the device, or the
// CPU's conversion on the host side for host<->device casts. Casts convert through double, as the
// CPU path does (float -> float16/bfloat16 round to nearest even).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/cuda/memory.h"
#include "core/tensor.h"
#include "core/cuda/context.h"
#include "core/cuda/launch.cuh"

namespace tandem::cuda_detail {
namespace {

using cuda::wait_and_check_kernel_errors;
using cuda::compute_stream;
using cuda::DeviceGuard;
using cuda::grid_for;
using cuda::StreamGuard;

constexpr int kMaxDims = 8;

// Shape and element strides of a copy's source and destination, collapsed to one dimension when
// both are contiguous.
struct CopyLayout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t src_stride[kMaxDims];
  int64_t dst_stride[kMaxDims];
};

CopyLayout make_layout(const Tensor& dst, const Tensor* src) {
  CopyLayout l{};
  const bool contiguous = dst.is_contiguous() && (!src || src->is_contiguous());
  if (contiguous || dst.dim() == 0) {
    l.ndim = 1;
    l.shape[0] = dst.numel();
    l.src_stride[0] = 1;
    l.dst_stride[0] = 1;
    return l;
  }
  TANDEM_CHECK(dst.dim() <= kMaxDims, "CUDA copy: at most ", kMaxDims, " dimensions supported for strided copies, got ",
               dst.str());
  l.ndim = static_cast<int>(dst.dim());
  for (int d = 0; d < l.ndim; ++d) {
    l.shape[d] = dst.shape()[d];
    l.dst_stride[d] = dst.strides()[d];
    l.src_stride[d] = src ? src->strides()[d] : 0;
  }
  return l;
}

__device__ double load_elem(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::Float32: return static_cast<const float*>(base)[i];
    case DType::Float64: return static_cast<const double*>(base)[i];
    case DType::Float16: return __half2float(__ushort_as_half(static_cast<const unsigned short*>(base)[i]));
    case DType::BFloat16:
      return __bfloat162float(__ushort_as_bfloat16(static_cast<const unsigned short*>(base)[i]));
    case DType::Int64: return static_cast<double>(static_cast<const long long*>(base)[i]);
    case DType::Int32: return static_cast<const int*>(base)[i];
    case DType::UInt8: return static_cast<const unsigned char*>(base)[i];
  }
  return 0;
}

__device__ void store_elem(DType t, void* base, int64_t i, double v) {
  switch (t) {
    case DType::Float32: static_cast<float*>(base)[i] = static_cast<float>(v); return;
    case DType::Float64: static_cast<double*>(base)[i] = v; return;
    case DType::Float16:
      static_cast<unsigned short*>(base)[i] = __half_as_ushort(__float2half_rn(static_cast<float>(v)));
      return;
    case DType::BFloat16:
      static_cast<unsigned short*>(base)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(v)));
      return;
    case DType::Int64: static_cast<long long*>(base)[i] = static_cast<long long>(v); return;
    case DType::Int32: static_cast<int*>(base)[i] = static_cast<int>(v); return;
    case DType::UInt8: static_cast<unsigned char*>(base)[i] = static_cast<unsigned char>(v); return;
  }
}

// Moves one element of `size` bytes without conversion (same-dtype copies keep int64 exact).
__device__ void move_elem(int size, const void* src, int64_t si, void* dst, int64_t di) {
  switch (size) {
    case 1: static_cast<unsigned char*>(dst)[di] = static_cast<const unsigned char*>(src)[si]; return;
    case 2: static_cast<unsigned short*>(dst)[di] = static_cast<const unsigned short*>(src)[si]; return;
    case 4: static_cast<unsigned int*>(dst)[di] = static_cast<const unsigned int*>(src)[si]; return;
    case 8:
      static_cast<unsigned long long*>(dst)[di] = static_cast<const unsigned long long*>(src)[si];
      return;
  }
}

__device__ void offsets(const CopyLayout& l, int64_t i, int64_t& so, int64_t& dofs) {
  so = 0;
  dofs = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    const int64_t idx = i % l.shape[d];
    i /= l.shape[d];
    so += idx * l.src_stride[d];
    dofs += idx * l.dst_stride[d];
  }
}

__global__ void copy_kernel(const void* src, DType st, void* dst, DType dt, CopyLayout l, int64_t n,
                            int same_size) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t so, dofs;
    offsets(l, i, so, dofs);
    if (same_size) {
      move_elem(same_size, src, so, dst, dofs);
    } else {
      store_elem(dt, dst, dofs, load_elem(st, src, so));
    }
  }
}

__global__ void fill_kernel(void* dst, DType dt, CopyLayout l, int64_t n, double value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t so, dofs;
    offsets(l, i, so, dofs);
    store_elem(dt, dst, dofs, value);
  }
}

template <typename T>
__global__ void axpy_kernel(T* dst, const T* src, T alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += alpha * src[i];
}

// Half accumulation (FSDP's mixed-precision gradients): float math, one rounding, as the CPU path.
template <typename T>
__global__ void half_axpy_kernel(T* dst, const T* src, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = T(float(dst[i]) + alpha * float(src[i]));
}

// dst and src on the same device: one memcpy or one elementwise kernel.
void copy_same_device(Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  StreamGuard on(dst.device().index);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.raw_data() != src.raw_data())
      TANDEM_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, on.stream()));
    return;
  }
  const CopyLayout l = make_layout(dst, &src);
  const int same_size = dst.dtype() == src.dtype() ? static_cast<int>(element_size(dst.dtype())) : 0;
  launch(on, copy_kernel, grid_for(n), 256, 0, src.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), l, n, same_size);
}

bool is_pinned_host(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // unknown: treat as pinned, which only costs a wait
  }
  return attr.type == cudaMemoryTypeHost;
}

// src on the host, dst on a device.
void copy_host_to_device(Tensor& dst, const Tensor& src) {
  const int dev = dst.device().index;
  // The bytes to upload: src itself when it already has dst's dtype and is contiguous, else a
  // contiguous host tensor of dst's dtype made by the CPU copy (which does the cast).
  Tensor host = src;
  if (src.dtype() != dst.dtype() || !src.is_contiguous()) {
    host = Tensor::empty(src.shape(), dst.dtype(), Device::cpu());
    host.copy_(src);
  }
  // Upload into dst directly when it is contiguous, else into a contiguous device temporary
  // that is then scattered into dst's layout on the device.
  Tensor target = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  StreamGuard on(dev);
  TANDEM_CUDA_CHECK(
      cudaMemcpyAsync(target.raw_data(), host.raw_data(), target.nbytes(), cudaMemcpyHostToDevice, on.stream()));
  cuda::note_host_upload();
  if (is_pinned_host(host.raw_data())) cuda::stream_synchronize(on.stream());
  if (!target.is_same(dst)) copy_same_device(dst, target);
}

// src on a device, dst on the host.
void copy_device_to_host(Tensor& dst, const Tensor& src) {
  const int dev = src.device().index;
  Tensor packed = src.is_contiguous() ? src : src.contiguous();  // same dtype, on the device
  const bool direct = dst.dtype() == src.dtype() && dst.is_contiguous();
  Tensor host = direct ? dst : Tensor::empty(src.shape(), src.dtype(), Device::cpu());
  {
    StreamGuard on(dev);
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(host.raw_data(), packed.raw_data(), host.nbytes(), cudaMemcpyDeviceToHost, on.stream()));
  }
  wait_and_check_kernel_errors(dev);  // the copy and the error record's read in one wait
  if (!direct) dst.copy_(host);  // host-to-host: the CPU path casts and handles dst's layout
}

// src and dst on different devices.
void copy_across_devices(Tensor& dst, const Tensor& src) {
  const int sdev = src.device().index, ddev = dst.device().index;
  Tensor packed = src.is_contiguous() ? src : src.contiguous();
  // Receive into dst when the bytes can land as they are, else into a contiguous temporary of
  // src's dtype on the destination device, converted into dst's layout/dtype there.
  const bool direct = dst.dtype() == src.dtype() && dst.is_contiguous();
  Tensor landing = direct ? dst : Tensor::empty(src.shape(), src.dtype(), dst.device());
  const cudaStream_t sstream = compute_stream(sdev), dstream = compute_stream(ddev);
  cudaEvent_t dst_ready = nullptr, copied = nullptr;
  {
    DeviceGuard guard(ddev);
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&dst_ready, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventRecord(dst_ready, dstream));
  }
  {
    DeviceGuard guard(sdev);
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(sstream, dst_ready, 0));
    TANDEM_CUDA_CHECK(
        cudaMemcpyPeerAsync(landing.raw_data(), ddev, packed.raw_data(), sdev, landing.nbytes(), sstream));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventRecord(copied, sstream));
  }
  {
    DeviceGuard guard(ddev);
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(dstream, copied, 0));
  }
  // Destroying an event whose work is pending is allowed: resources go once it completes.
  TANDEM_CUDA_CHECK(cudaEventDestroy(dst_ready));
  TANDEM_CUDA_CHECK(cudaEventDestroy(copied));
  // `packed` may now be freed to the source device's cache while the copy is pending; the next
  // user of that block queues on sstream, after the copy. The landing buffer is used on dstream,
  // after the wait above.
  if (!direct) copy_same_device(dst, landing);
}

}  // namespace

void copy(Tensor& dst, const Tensor& src) {
  TANDEM_CHECK(dst.shape() == src.shape(), "copy_: shape ", shape_str(src.shape()), " into ", shape_str(dst.shape()));
  if (dst.numel() == 0) return;
  const Device dd = dst.device(), sd = src.device();
  if (dd.is_cuda()) cuda::check_device_index(dd.index);
  if (sd.is_cuda()) cuda::check_device_index(sd.index);
  if (dd.is_cuda() && sd.is_cuda()) {
    if (dd == sd) {
      copy_same_device(dst, src);
    } else {
      copy_across_devices(dst, src);
    }
  } else if (dd.is_cuda()) {
    copy_host_to_device(dst, src);
  } else {
    TANDEM_CHECK(sd.is_cuda(), "CUDA copy called with two host tensors");
    copy_device_to_host(dst, src);
  }
}

void fill(Tensor& t, double value) {
  TANDEM_CHECK(t.device().is_cuda(), "CUDA fill on a ", t.str());
  const int64_t n = t.numel();
  if (n == 0) return;
  StreamGuard on(t.device().index);
  if (value == 0.0 && !std::signbit(value) && t.is_contiguous()) {  // +0.0: all-zero bits in every dtype
    TANDEM_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), on.stream()));
    return;
  }
  const CopyLayout l = make_layout(t, nullptr);
  launch(on, fill_kernel, grid_for(n), 256, 0, t.raw_data(), t.dtype(), l, n, value);
}

void add_(Tensor& dst, const Tensor& src, double alpha) {
  TANDEM_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(), "add_: ",
               src.str(), " into ", dst.str());
  TANDEM_CHECK(dst.is_contiguous(), "add_: destination must be contiguous, got ", dst.str());
  TANDEM_CHECK(dst.dtype() == kFloat32 || dst.dtype() == kFloat64 || dst.dtype() == kInt64 ||
                   dst.dtype() == kFloat16 || dst.dtype() == kBFloat16,
               "add_: unsupported dtype ", dtype_name(dst.dtype()),
               " on CUDA (float32, float64, float16, bfloat16 or int64 expected)");
  const int64_t n = dst.numel();
  if (n == 0) return;
  Tensor s = src.contiguous();
  StreamGuard on(dst.device().index);
  if (dst.dtype() == kFloat32) {
    // The CPU path computes float(alpha) * src in float; so does this.
    launch(on, axpy_kernel<float>, grid_for(n), 256, 0, static_cast<float*>(dst.raw_data()), static_cast<const float*>(s.raw_data()), static_cast<float>(alpha), n);
  } else if (dst.dtype() == kBFloat16) {
    launch(on, half_axpy_kernel<__nv_bfloat16>, grid_for(n), 256, 0, static_cast<__nv_bfloat16*>(dst.raw_data()),
           static_cast<const __nv_bfloat16*>(s.raw_data()), static_cast<float>(alpha), n);
  } else if (dst.dtype() == kFloat16) {
    launch(on, half_axpy_kernel<__half>, grid_for(n), 256, 0, static_cast<__half*>(dst.raw_data()),
           static_cast<const __half*>(s.raw_data()), static_cast<float>(alpha), n);
  } else if (dst.dtype() == kInt64) {  // alpha is whole (checked by Tensor::add_)
    launch(on, axpy_kernel<int64_t>, grid_for(n), 256, 0, static_cast<int64_t*>(dst.raw_data()),
           static_cast<const int64_t*>(s.raw_data()), static_cast<int64_t>(alpha), n);
  } else {
    launch(on, axpy_kernel<double>, grid_for(n), 256, 0, static_cast<double*>(dst.raw_data()), static_cast<const double*>(s.raw_data()), alpha, n);
  }
}

}  // namespace tandem::cuda_detail
