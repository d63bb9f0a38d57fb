// CUDA copies, casts, fill_ and add_ (core/cuda/memory.cu) against the CPU paths of Tensor:
// round trips of every dtype, casts on the device and across host/device, strided sources and
// destinations on either side, fills, add_, and a copy between two devices where two exist.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/device_timer.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/linear.h"
#include "gpu_test_util.h"

using namespace tandem;
using namespace tandem::gpu_test;

namespace {

const DType kAllDtypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8};

// Values every dtype holds exactly: small non-negative integers and halves.
Tensor exact_values(const Shape& shape, DType dtype) {
  std::vector<double> v(shape_numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = is_floating(dtype) ? double(i % 97) * 0.5 : double(i % 97);
  return Tensor::from_vector<double>(v, shape).to(dtype);
}

}  // namespace

TEST(CudaMemory, RoundTripEveryDtype) {
  TANDEM_NEED_GPUS(1);
  for (DType dt : kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor host = exact_values({3, 5, 7}, dt);
    const Tensor dev = host.to(gpu());
    EXPECT_TRUE(dev.device().is_cuda());
    EXPECT_EQ(dev.dtype(), dt);
    EXPECT_TRUE(same(dev.to(Device::cpu()), host));
  }
}

TEST(CudaMemory, Int64StaysExact) {
  TANDEM_NEED_GPUS(1);
  const int64_t big = (int64_t{1} << 53) + 1;  // not representable as a double
  const Tensor host = Tensor::from_vector<int64_t>({big, -big, 7, big + 2, 0, -1}, {2, 3});
  const Tensor dev = host.to(gpu());
  EXPECT_EQ(dev.to_vector<int64_t>(), host.to_vector<int64_t>());
  // A strided device-to-device copy of the same dtype moves bits, no conversion.
  EXPECT_EQ(dev.transpose(0, 1).contiguous().to_vector<int64_t>(),
            host.transpose(0, 1).contiguous().to_vector<int64_t>());
}

TEST(CudaMemory, CastsOnDeviceMatchCpuCasts) {
  TANDEM_NEED_GPUS(1);
  Generator gen(11);
  const Tensor f32 = random_cpu({4, 33}, gen, -70000.0, 70000.0);  // beyond float16's range too
  const Tensor small = random_cpu({4, 33}, gen, -3.0, 3.0);
  for (const Tensor* src : {&f32, &small}) {
    const Tensor dsrc = src->to(gpu());
    for (DType to : {kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
      SCOPED_TRACE(dtype_name(to));
      const Tensor on_device = dsrc.to(to);
      EXPECT_TRUE(on_device.device().is_cuda());
      EXPECT_TRUE(same(on_device, src->to(to)));
      // and back to float32 on the device
      EXPECT_TRUE(same(on_device.to(kFloat32), src->to(to).to(kFloat32)));
    }
  }
  const Tensor f64 = random_cpu({17}, gen, -1.0, 1.0, kFloat64);
  EXPECT_TRUE(same(f64.to(gpu()).to(kFloat32), f64.to(kFloat32)));
}

TEST(CudaMemory, CastsAcrossHostAndDevice) {
  TANDEM_NEED_GPUS(1);
  Generator gen(12);
  const Tensor src = random_cpu({6, 10}, gen, -5.0, 5.0);
  // host float32 -> device float16 / bfloat16 / float64
  for (DType to : {kFloat16, kBFloat16, kFloat64}) {
    SCOPED_TRACE(dtype_name(to));
    Tensor dst = Tensor::empty({6, 10}, to, gpu());
    dst.copy_(src);
    EXPECT_TRUE(same(dst, src.to(to)));
    // device -> host float64 with a cast on the way down
    Tensor back = Tensor::empty({6, 10}, kFloat64);
    back.copy_(dst);
    EXPECT_TRUE(same(back, src.to(to).to(kFloat64)));
  }
}

TEST(CudaMemory, StridedSourcesAndDestinations) {
  TANDEM_NEED_GPUS(1);
  Generator gen(13);
  const Tensor host = random_cpu({5, 6, 7}, gen);
  const Tensor dev = host.to(gpu());
  // strided source on the device
  EXPECT_TRUE(same(dev.transpose(0, 2).contiguous(), host.transpose(0, 2).contiguous()));
  EXPECT_TRUE(same(dev.slice(1, 1, 6, 2).contiguous(), host.slice(1, 1, 6, 2).contiguous()));
  EXPECT_TRUE(same(dev.select(2, 3).to(Device::cpu()), host.select(2, 3)));
  // strided source on the host, uploaded
  EXPECT_TRUE(same(host.transpose(1, 2).to(gpu()), host.transpose(1, 2).contiguous()));
  // strided destination on the device, from host and from device
  Tensor dbig = Tensor::zeros({5, 6, 7}, kFloat32, gpu());
  Tensor hbig = Tensor::zeros({5, 6, 7});
  const Tensor patch = random_cpu({5, 3, 7}, gen);
  Tensor dview = dbig.slice(1, 0, 6, 2);
  dview.copy_(patch);
  Tensor hview = hbig.slice(1, 0, 6, 2);
  hview.copy_(patch);
  EXPECT_TRUE(same(dbig, hbig));
  Tensor dview2 = dbig.transpose(0, 2);
  dview2.copy_(dev.transpose(0, 2));
  EXPECT_TRUE(same(dbig, host));
  // strided destination on the host, from the device, with a cast
  Tensor hdst = Tensor::zeros({7, 6, 5}, kFloat64);
  Tensor hdst_view = hdst.transpose(0, 2);
  hdst_view.copy_(dev);
  EXPECT_TRUE(same(hdst, host.transpose(0, 2).to(kFloat64)));
}

TEST(CudaMemory, FillEveryDtypeAndLayout) {
  TANDEM_NEED_GPUS(1);
  for (DType dt : kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor d = Tensor::full({4, 9}, 3.0, dt, gpu());
    EXPECT_TRUE(same(d, Tensor::full({4, 9}, 3.0, dt)));
    d.zero_();
    EXPECT_TRUE(same(d, Tensor::zeros({4, 9}, dt)));
    // a strided fill touches only the view
    Tensor col = d.select(1, 2);
    col.fill_(5.0);
    Tensor ref = Tensor::zeros({4, 9}, dt);
    Tensor ref_col = ref.select(1, 2);
    ref_col.fill_(5.0);
    EXPECT_TRUE(same(d, ref));
  }
  Tensor neg_zero = Tensor::full({3}, -0.0, kFloat32, gpu());
  for (float v : neg_zero.to_vector<float>()) EXPECT_TRUE(std::signbit(v));
}

TEST(CudaMemory, AddInPlaceMatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(14);
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = random_cpu({8, 13}, gen, -1.0, 1.0, dt);
    const Tensor b = random_cpu({13, 8}, gen, -1.0, 1.0, dt);
    Tensor da = a.to(gpu());
    const Tensor db = b.to(gpu());
    da.add_(db.transpose(0, 1), -0.75);  // strided source
    a.add_(b.transpose(0, 1), -0.75);
    EXPECT_TRUE(close(da, a, 1e-6, 1e-6));
  }
  // int64 counters (BatchNorm's num_batches_tracked) add on the device; a fractional alpha and a
  // dtype with no CUDA add are refused by name.
  Tensor ints = Tensor::from_vector<int64_t>({5, -7, int64_t{1} << 40}, {3});
  const Tensor step = Tensor::from_vector<int64_t>({1, 2, -3}, {3});
  Tensor dints = ints.to(gpu());
  dints.add_(step.to(gpu()), -2.0);
  ints.add_(step, -2.0);
  EXPECT_EQ(dints.to(Device::cpu()).to_vector<int64_t>(), ints.to_vector<int64_t>());
  EXPECT_EQ(ints.to_vector<int64_t>(), (std::vector<int64_t>{3, -11, (int64_t{1} << 40) + 6}));
  EXPECT_TRUE(throws_with([&] { dints.add_(dints, 0.5); }, {"add_", "whole number", "int64"}));
  Tensor bytes = Tensor::zeros({3}, kUInt8, gpu());
  EXPECT_TRUE(throws_with([&] { bytes.add_(bytes); }, {"add_", "uint8", "on CUDA"}));
}

TEST(CudaMemory, CopyBetweenTwoDevices) {
  TANDEM_NEED_GPUS(2);
  Generator gen(15);
  const Tensor host = random_cpu({9, 11}, gen);
  const Tensor d0 = host.to(Device::cuda(0));
  const Tensor d1 = d0.to(Device::cuda(1));
  EXPECT_EQ(d1.device().index, 1);
  EXPECT_TRUE(same(d1, host));
  Tensor d1_half = Tensor::empty({11, 9}, kFloat16, Device::cuda(1));
  d1_half.copy_(d0.transpose(0, 1));  // strided source, cast, other device
  EXPECT_TRUE(same(d1_half, host.transpose(0, 1).to(kFloat16)));
}

TEST(CudaDeviceTimer, TimesTheStreamWithoutWaiting) {
  TANDEM_NEED_GPUS(1);
  DeviceTimer t(gpu());
  Tensor x = Tensor::zeros({1 << 22}, kFloat32, gpu());
  t.start();
  for (int i = 0; i < 20; ++i) x.add_(x, 1.0);
  t.stop();
  synchronize(gpu());  // the stream has passed stop()
  EXPECT_GT(t.elapsed_ms(), 0.0);
  EXPECT_TRUE(std::isfinite(t.elapsed_ms()));
}

// Kernels on cuda:1 while the thread's current device is cuda:0: every launch must run under a
// guard for its tensors' device (a launch on the wrong device fails or reads foreign memory).
TEST(CudaDeviceGuard, KernelsOnTheSecondDeviceMatchTheCpu) {
  TANDEM_NEED_GPUS(2);
  set_cuda_device(0);
  Generator gen(9);
  const Tensor x = random_cpu({16, 32}, gen), w = random_cpu({8, 32}, gen), b = random_cpu({8}, gen);
  const Device d1 = Device::cuda(1);
  const Tensor y = kernels::linear_forward(x.to(d1), w.to(d1), b.to(d1));  // GEMM, then the bias add
  EXPECT_TRUE(y.device() == d1);
  EXPECT_TRUE(close(y, kernels::linear_forward(x, w, b), 1e-5, 1e-5));
  const Tensor dy = random_cpu({16, 8}, gen);
  const auto got = kernels::linear_backward(dy.to(d1), x.to(d1), w.to(d1), true, true, true);
  const auto ref = kernels::linear_backward(dy, x, w, true, true, true);
  EXPECT_TRUE(close(got.bias, ref.bias, 1e-5, 1e-5));  // the bias gradient ran after the GEMM's guard
  EXPECT_TRUE(close(got.weight, ref.weight, 1e-5, 1e-5));
}
