// conv2d on CUDA: cuDNN forward, backward data and backward filter (cross-correlation, with
// dilation and groups from Conv2dArgs: cudnnSetConvolution2dDescriptor, cudnnSetConvolutionGroupCount), with the per-channel bias add and bias gradient of kernels/cuda/amp.cu.
// dtypes: float32, float64 (CUDNN_DATA_DOUBLE with double compute and double scaling factors, as
// cuDNN requires; for gradient checks), and float16 / bfloat16 for mixed precision (all operands
// one dtype; tensors CUDNN_DATA_HALF / CUDNN_DATA_BFLOAT16 with CUDNN_DATA_FLOAT compute,
// tensor-core algorithms allowed; outputs and gradients in the operands' dtype; bias kernels in
// kernels/cuda/amp.cu).
//
// Algorithms: chosen once per (device, op, shape, TF32 setting) with cuDNN's heuristic
// (cudnnGet*Algorithm_v7) and cached. Among the candidates cuDNN reports as supported we take
// the first deterministic one (so a seeded run repeats exactly), else the first one. Unless
// TANDEM_ALLOW_TF32=1, the math type is CUDNN_FMA_MATH and tensor-op (TF32) candidates are
// skipped, so results match float32 CPU math to rounding. Workspace comes from the caching
// allocator and is handed back right after the call is queued (safe in stream order).
// Inputs may be strided (made contiguous first); outputs are contiguous.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "kernels/ops.h"
#include "kernels/cuda/amp.cuh"
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"

namespace tandem::kernels::cuda {
namespace {

// ---- cuDNN descriptors (RAII) ----

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(int n, int c, int h, int w, cudnnDataType_t t) {
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    TANDEM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, t, n, c, h, w));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(int k, int c, int r, int s, cudnnDataType_t t) {
    TANDEM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    TANDEM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d, t, CUDNN_TENSOR_NCHW, k, c, r, s));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(int ph, int pw, int sh, int sw, int dh, int dw, int groups, bool lowp, bool f64) {
    TANDEM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    // Float compute for every storage type but double (for half storage: cuDNN's "pseudo half"
    // configuration).
    TANDEM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, ph, pw, sh, sw, dh, dw, CUDNN_CROSS_CORRELATION,
                                                       f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    if (groups > 1) TANDEM_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, groups));
    TANDEM_CUDNN_CHECK(
        cudnnSetConvolutionMathType(d, lowp || allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// A workspace block from the caching allocator, handed back when the scope ends.
struct Workspace {
  Allocator& alloc;
  size_t nbytes;
  void* ptr = nullptr;
  Workspace(int device, size_t n) : alloc(tandem::cuda_allocator(device)), nbytes(n) {
    if (n > 0) ptr = alloc.allocate(n);
  }
  ~Workspace() {
    if (ptr) alloc.deallocate(ptr, nbytes);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

// ---- shapes, descriptors and the algorithm cache ----

struct ConvGeometry {
  int n, c, h, w, k, r, s, p, q, ph, pw, sh, sw, dh = 1, dw = 1, groups = 1;
  DType dtype = kFloat32;
  bool lowp() const { return dtype != kFloat32 && dtype != kFloat64; }
};

ConvGeometry geometry(const char* op, const Tensor& x, const Tensor& weight, const Conv2dArgs& a) {
  TANDEM_CHECK(x.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ", x.str());
  TANDEM_CHECK(weight.dim() == 4, op, ": weight must be 4-D [K, C / groups, R, S], got ", weight.str());
  TANDEM_CHECK(a.groups >= 1 && a.dilation_h >= 1 && a.dilation_w >= 1, op,
               ": groups and dilation must be >= 1, got groups ", a.groups, ", dilation (", a.dilation_h, ", ",
               a.dilation_w, ")");
  TANDEM_CHECK(weight.size(1) * a.groups == x.size(1) && weight.size(0) % a.groups == 0, op, ": weight ",
               weight.str(), " with groups ", a.groups, " expects ", weight.size(1) * a.groups,
               " input channels (and output channels divisible by groups), input ", x.str(), " has ", x.size(1));
  TANDEM_CHECK(a.stride_h >= 1 && a.stride_w >= 1 && a.pad_h >= 0 && a.pad_w >= 0, op,
               ": stride must be >= 1 and padding >= 0, got stride (", a.stride_h, ", ", a.stride_w, "), padding (",
               a.pad_h, ", ", a.pad_w, ")");
  const int64_t hp = x.size(2) + 2 * a.pad_h, wp = x.size(3) + 2 * a.pad_w;
  const int64_t er = a.dilation_h * (weight.size(2) - 1) + 1, es = a.dilation_w * (weight.size(3) - 1) + 1;
  TANDEM_CHECK(hp >= er && wp >= es, op, ": (dilated) kernel ", er, "x", es, " larger than the padded input ", hp, "x",
               wp);
  ConvGeometry g{};
  g.n = to_int(x.size(0), op, "batch size");
  g.c = to_int(x.size(1), op, "input channels");
  g.h = to_int(x.size(2), op, "input height");
  g.w = to_int(x.size(3), op, "input width");
  g.k = to_int(weight.size(0), op, "output channels");
  g.r = to_int(weight.size(2), op, "kernel height");
  g.s = to_int(weight.size(3), op, "kernel width");
  g.ph = to_int(a.pad_h, op, "pad_h");
  g.pw = to_int(a.pad_w, op, "pad_w");
  g.sh = to_int(a.stride_h, op, "stride_h");
  g.sw = to_int(a.stride_w, op, "stride_w");
  g.dh = to_int(a.dilation_h, op, "dilation_h");
  g.dw = to_int(a.dilation_w, op, "dilation_w");
  g.groups = to_int(a.groups, op, "groups");
  g.p = static_cast<int>((hp - er) / g.sh + 1);
  g.q = static_cast<int>((wp - es) / g.sw + 1);
  to_int(x.numel(), op, "input elements");
  to_int(int64_t(g.n) * g.k * g.p * g.q, op, "output elements");
  return g;
}

enum class ConvOp { Forward, BackwardData, BackwardFilter };

struct AlgoChoice {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
};

using AlgoKey =
    std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, bool, int>;

std::mutex g_algo_mu;
std::map<AlgoKey, AlgoChoice>& algo_cache() {
  static auto* cache = new std::map<AlgoKey, AlgoChoice>();  // leaked: lives with the process
  return *cache;
}

// Tensor-op math is what half storage is for; for float32 it means TF32, allowed only on request.
bool math_allowed(cudnnMathType_t m, bool lowp) {
  return lowp || allow_tf32() || (m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

// Picks among cuDNN's heuristic candidates (see the file comment).
template <typename Perf>
bool pick(const std::vector<Perf>& perf, int returned, bool lowp, Perf& out) {
  const Perf* first = nullptr;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || !math_allowed(p.mathType, lowp)) continue;
    if (!first) first = &p;
    if (p.determinism == CUDNN_DETERMINISTIC) {
      out = p;
      return true;
    }
  }
  if (!first) return false;
  out = *first;
  return true;
}

// The math type to set on the descriptor for a chosen candidate: FMA unless TF32 is allowed.
cudnnMathType_t math_for(cudnnMathType_t candidate, bool lowp) {
  return lowp || allow_tf32() ? candidate : CUDNN_FMA_MATH;
}

struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  explicit Descriptors(const ConvGeometry& g)
      : x(g.n, g.c, g.h, g.w, cudnn_dtype(g.dtype)),
        y(g.n, g.k, g.p, g.q, cudnn_dtype(g.dtype)),
        w(g.k, g.c / g.groups, g.r, g.s, cudnn_dtype(g.dtype)),
        conv(g.ph, g.pw, g.sh, g.sw, g.dh, g.dw, g.groups, g.lowp(), g.dtype == kFloat64) {}
};

AlgoChoice choose(ConvOp op, int device, const ConvGeometry& g, cudnnHandle_t handle, const Descriptors& d) {
  const AlgoKey key{device, static_cast<int>(op), g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.ph, g.pw, g.sh, g.sw,
                    g.dh, g.dw, g.groups, allow_tf32(), static_cast<int>(g.dtype)};
  {
    std::lock_guard<std::mutex> lock(g_algo_mu);
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) return it->second;
  }
  AlgoChoice choice{};
  int max_count = 0, returned = 0;
  switch (op) {
    case ConvOp::Forward: {
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.d, d.w.d, d.conv.d, d.y.d, max_count,
                                                                &returned, perf.data()));
      cudnnConvolutionFwdAlgoPerf_t best{};
      if (pick(perf, returned, g.lowp(), best)) {
        choice.algo = best.algo;
        choice.math = math_for(best.mathType, g.lowp());
      } else {
        choice.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        choice.math = math_for(CUDNN_DEFAULT_MATH, g.lowp());
      }
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, choice.math));
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
          handle, d.x.d, d.w.d, d.conv.d, d.y.d, static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo),
          &choice.workspace));
      break;
    }
    case ConvOp::BackwardData: {
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max_count, 1));
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w.d, d.y.d, d.conv.d, d.x.d, max_count,
                                                                     &returned, perf.data()));
      cudnnConvolutionBwdDataAlgoPerf_t best{};
      if (pick(perf, returned, g.lowp(), best)) {
        choice.algo = best.algo;
        choice.math = math_for(best.mathType, g.lowp());
      } else {
        choice.algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
        choice.math = math_for(CUDNN_DEFAULT_MATH, g.lowp());
      }
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, choice.math));
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          handle, d.w.d, d.y.d, d.conv.d, d.x.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo),
          &choice.workspace));
      break;
    }
    case ConvOp::BackwardFilter: {
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max_count, 1));
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                                       max_count, &returned, perf.data()));
      cudnnConvolutionBwdFilterAlgoPerf_t best{};
      if (pick(perf, returned, g.lowp(), best)) {
        choice.algo = best.algo;
        choice.math = math_for(best.mathType, g.lowp());
      } else {
        choice.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
        choice.math = math_for(CUDNN_DEFAULT_MATH, g.lowp());
      }
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, choice.math));
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, d.x.d, d.y.d, d.conv.d, d.w.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo),
          &choice.workspace));
      break;
    }
  }
  std::lock_guard<std::mutex> lock(g_algo_mu);
  algo_cache().emplace(key, choice);
  return choice;
}

// cuDNN's alpha and beta: double for double data, float otherwise.
struct Scaling {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  bool f64;
  explicit Scaling(DType t) : f64(t == kFloat64) {}
  const void* one() const { return f64 ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return f64 ? static_cast<const void*>(&d0) : &f0; }
};

}  // namespace

// ---- shared launchers ----

// ---- conv2d ----

Tensor conv2d_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dArgs& args) {
  const char* op = "conv2d_forward";
  DType dtype = kFloat32;
  const int dev = check_float_cuda(op, {x_in, weight_in, bias_in}, dtype);
  ConvGeometry g = geometry(op, x_in, weight_in, args);
  g.dtype = dtype;
  if (bias_in.defined())
    TANDEM_CHECK(bias_in.dim() == 1 && bias_in.size(0) == g.k, op, ": bias must be [", g.k, "], got ",
                 bias_in.str());
  Tensor y = Tensor::empty({g.n, g.k, g.p, g.q}, dtype, x_in.device());
  if (y.numel() == 0) return y;
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const cudnnHandle_t handle = cudnn_handle(dev);
  StreamGuard on(dev);
  Descriptors d(g);
  const AlgoChoice c = choose(ConvOp::Forward, dev, g, handle, d);
  TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, c.math));
  Workspace ws(dev, c.workspace);
  const Scaling k(dtype);
  TANDEM_CUDNN_CHECK(cudnnConvolutionForward(handle, k.one(), d.x.d, x.raw_data(), d.w.d, weight.raw_data(), d.conv.d,
                                             static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.ptr, ws.nbytes,
                                             k.zero(), d.y.d, y.raw_data()));
  if (bias_in.defined()) {
    const Tensor bias = bias_in.contiguous();
    add_channel_bias_any(on, y.raw_data(), bias.raw_data(), dtype, g.n, g.k, int64_t(g.p) * g.q);
  }
  return y;
}

Conv2dGrads conv2d_backward(const Tensor& grad_out_in, const Tensor& x_in, const Tensor& weight_in,
                            const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias) {
  const char* op = "conv2d_backward";
  DType dtype = kFloat32;
  const int dev = check_float_cuda(op, {grad_out_in, x_in, weight_in}, dtype);
  ConvGeometry g = geometry(op, x_in, weight_in, args);
  g.dtype = dtype;
  const Shape out_shape{g.n, g.k, g.p, g.q};
  TANDEM_CHECK(grad_out_in.shape() == out_shape, op, ": grad_output must be ", shape_str(out_shape), ", got ",
               grad_out_in.str());
  const Device device = x_in.device();
  Conv2dGrads grads;
  if (need_input) grads.input = Tensor::empty(x_in.shape(), dtype, device);
  if (need_weight) grads.weight = Tensor::empty(weight_in.shape(), dtype, device);
  if (need_bias) grads.bias = Tensor::empty({g.k}, dtype, device);
  if (grad_out_in.numel() == 0) {  // empty batch: zero gradients, nothing for cuDNN to do
    for (Tensor* t : {&grads.input, &grads.weight, &grads.bias})
      if (t->defined()) t->zero_();
    return grads;
  }
  const Tensor dy = grad_out_in.contiguous();
  const cudnnHandle_t handle = cudnn_handle(dev);
  StreamGuard on(dev);
  Descriptors d(g);
  const Scaling k(dtype);
  if (need_input) {
    const Tensor weight = weight_in.contiguous();
    const AlgoChoice c = choose(ConvOp::BackwardData, dev, g, handle, d);
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, c.math));
    Workspace ws(dev, c.workspace);
    TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, k.one(), d.w.d, weight.raw_data(), d.y.d, dy.raw_data(),
                                                    d.conv.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                                    ws.ptr, ws.nbytes, k.zero(), d.x.d, grads.input.raw_data()));
  }
  if (need_weight) {
    const Tensor x = x_in.contiguous();
    const AlgoChoice c = choose(ConvOp::BackwardFilter, dev, g, handle, d);
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, c.math));
    Workspace ws(dev, c.workspace);
    TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, k.one(), d.x.d, x.raw_data(), d.y.d, dy.raw_data(),
                                                      d.conv.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                                      ws.ptr, ws.nbytes, k.zero(), d.w.d, grads.weight.raw_data()));
  }
  if (need_bias)
    channel_sum_any(on, dy.raw_data(), grads.bias.raw_data(), dtype, g.n, g.k, int64_t(g.p) * g.q);
  return grads;
}

}  // namespace tandem::kernels::cuda
