// linear and matmul on CUDA with cuBLAS sgemm (float32; TF32 only with TANDEM_ALLOW_TF32=1) or dgemm
// (float64: the bias added and its gradient summed by the kernels below, in double). linear also
// takes float16 / bfloat16 operands (mixed precision): cublasGemmEx with CUBLAS_COMPUTE_32F
// (float accumulation, tensor cores), outputs and gradients in the operands' dtype.
// cuBLAS is column-major; a row-major [R, C] matrix is the column-major [C, R] matrix, its
// transpose. So each row-major product Z = A * B is computed as the column-major Z^T = B^T * A^T,
// with no data moved:
//   linear      y [N, out]  = x [N, in] * W^T        -> gemm(T, N): m=out, n=N,  k=in
//   grad input  dx [N, in]  = dy [N, out] * W        -> gemm(N, N): m=in,  n=N,  k=out
//   grad weight dW [out, in] = dy^T * x [N, in]      -> gemm(N, T): m=in,  n=out, k=N
//   matmul      c [M, N]    = a [M, K] * b [K, N]    -> gemm(N, N): m=N,   n=M,  k=K
// Bias add and bias gradient use the per-channel kernels of amp.cu with S = 1, each under a guard
// for the operands' device (a StreamGuard made for the call). Inputs may be
// strided (made contiguous first); outputs are contiguous. All work is on the compute stream.
#include <algorithm>

#include "kernels/cuda/amp.cuh"
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

const float kOne = 1.0f, kZero = 0.0f;
const double kOneD = 1.0, kZeroD = 0.0;

// y [N, C] += bias [C], float64.
__global__ void add_bias_f64_kernel(double* y, const double* bias, int64_t C, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { y[i] += bias[i % C]; }
}

// out[c] = sum over rows of dy [N, C], float64: one thread per column (bias gradients are short).
__global__ void column_sum_f64_kernel(const double* dy, double* out, int64_t N, int64_t C) {
  TANDEM_GRID_STRIDE_LOOP(c, C) {
    double acc = 0;
    for (int64_t r = 0; r < N; ++r) acc += dy[r * C + c];
    out[c] = acc;
  }
}

// Column-major C[m, n] = op(A)[m, k] * op(B)[k, n], leading dimensions as stored; handles empty
// sizes that cuBLAS rejects (zero leading dimensions) or treats specially (k = 0).
void sgemm(int dev, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a, int lda,
           const float* b, int ldb, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  StreamGuard on(dev);
  if (k == 0) {  // empty sum: C = 0
    TANDEM_CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(float) * size_t(m) * size_t(n), on.stream()));
    return;
  }
  TANDEM_CUBLAS_CHECK(cublasSgemm(cublas_handle(dev), ta, tb, m, n, k, &kOne, a, lda, b, ldb, &kZero, c, ldc));
}

// The same for any of f32 / f16 / bf16 storage (all three matrices one dtype), float compute, or
// f64 (double compute).
void gemm_any(int dev, DType t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
              int lda, const void* b, int ldb, void* c, int ldc) {
  if (t == kFloat32) {
    sgemm(dev, ta, tb, m, n, k, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb,
          static_cast<float*>(c), ldc);
    return;
  }
  if (m == 0 || n == 0) return;
  StreamGuard on(dev);
  if (k == 0) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(c, 0, element_size(t) * size_t(m) * size_t(n), on.stream()));
    return;
  }
  if (t == kFloat64) {
    TANDEM_CUBLAS_CHECK(cublasDgemm(cublas_handle(dev), ta, tb, m, n, k, &kOneD, static_cast<const double*>(a), lda,
                                    static_cast<const double*>(b), ldb, &kZeroD, static_cast<double*>(c), ldc));
    return;
  }
  const cudaDataType dt = cuda_dtype(t);
  TANDEM_CUBLAS_CHECK(cublasGemmEx(cublas_handle(dev), ta, tb, m, n, k, &kOne, a, dt, lda, b, dt, ldb, &kZero, c, dt,
                                   ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

Tensor linear_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const char* op = "linear_forward";
  DType dtype = kFloat32;
  const int dev = check_float_cuda(op, {x_in, weight_in, bias_in}, dtype);
  TANDEM_CHECK(x_in.dim() == 2, op, ": input must be 2-D [N, in], got ", x_in.str());
  TANDEM_CHECK(weight_in.dim() == 2 && weight_in.size(1) == x_in.size(1), op, ": weight must be [out, ",
               x_in.size(1), "], got ", weight_in.str());
  const int N = to_int(x_in.size(0), op, "batch size");
  const int in = to_int(x_in.size(1), op, "in_features");
  const int out = to_int(weight_in.size(0), op, "out_features");
  if (bias_in.defined())
    TANDEM_CHECK(bias_in.dim() == 1 && bias_in.size(0) == out, op, ": bias must be [", out, "], got ", bias_in.str());
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  Tensor y = Tensor::empty({N, out}, dtype, x_in.device());
  gemm_any(dev, dtype, CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, weight.raw_data(), std::max(in, 1), x.raw_data(),
           std::max(in, 1), y.raw_data(), std::max(out, 1));
  if (bias_in.defined()) {
    const Tensor bias = bias_in.contiguous();
    if (dtype != kFloat64) {
      add_channel_bias_any(StreamGuard(dev), y.raw_data(), bias.raw_data(), dtype, N, out, 1);
    } else if (y.numel() > 0) {
      StreamGuard on(dev);
      launch(on, add_bias_f64_kernel, grid_for(y.numel()), 256, 0, elem_ptr<double>(y), elem_ptr<const double>(bias),
             int64_t{out}, y.numel());
    }
  }
  return y;
}

LinearGrads linear_backward(const Tensor& grad_out_in, const Tensor& x_in, const Tensor& weight_in, bool need_input,
                            bool need_weight, bool need_bias) {
  const char* op = "linear_backward";
  DType dtype = kFloat32;
  const int dev = check_float_cuda(op, {grad_out_in, x_in, weight_in}, dtype);
  TANDEM_CHECK(x_in.dim() == 2 && weight_in.dim() == 2 && weight_in.size(1) == x_in.size(1), op,
               ": expected input [N, in] and weight [out, in], got ", x_in.str(), " and ", weight_in.str());
  const int N = to_int(x_in.size(0), op, "batch size");
  const int in = to_int(x_in.size(1), op, "in_features");
  const int out = to_int(weight_in.size(0), op, "out_features");
  TANDEM_CHECK(grad_out_in.shape() == Shape({N, out}), op, ": grad_output must be [", N, ", ", out, "], got ",
               grad_out_in.str());
  const Device device = x_in.device();
  const Tensor dy = grad_out_in.contiguous();
  LinearGrads grads;
  if (need_input) {
    const Tensor weight = weight_in.contiguous();
    grads.input = Tensor::empty({N, in}, dtype, device);
    gemm_any(dev, dtype, CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, weight.raw_data(), std::max(in, 1), dy.raw_data(),
             std::max(out, 1), grads.input.raw_data(), std::max(in, 1));
  }
  if (need_weight) {
    const Tensor x = x_in.contiguous();
    grads.weight = Tensor::empty({out, in}, dtype, device);
    gemm_any(dev, dtype, CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, x.raw_data(), std::max(in, 1), dy.raw_data(),
             std::max(out, 1), grads.weight.raw_data(), std::max(in, 1));
  }
  if (need_bias) {
    grads.bias = Tensor::empty({out}, dtype, device);
    if (N == 0) {
      grads.bias.zero_();
    } else if (dtype != kFloat64) {
      channel_sum_any(StreamGuard(dev), dy.raw_data(), grads.bias.raw_data(), dtype, N, out, 1);
    } else if (out > 0) {
      StreamGuard on(dev);
      launch(on, column_sum_f64_kernel, grid_for(out), 256, 0, elem_ptr<const double>(dy),
             elem_ptr<double>(grads.bias), int64_t{N}, int64_t{out});
    }
  }
  return grads;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const char* op = "matmul";
  const int dev = check_f32_f64_cuda(op, {a_in, b_in});
  TANDEM_CHECK(a_in.dim() == 2 && b_in.dim() == 2 && a_in.size(1) == b_in.size(0), op,
               ": expected a [M, K] and b [K, N], got ", a_in.str(), " and ", b_in.str());
  const int M = to_int(a_in.size(0), op, "M");
  const int K = to_int(a_in.size(1), op, "K");
  const int N = to_int(b_in.size(1), op, "N");
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor c = Tensor::empty({M, N}, a_in.dtype(), a_in.device());
  gemm_any(dev, a_in.dtype(), CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, b.raw_data(), std::max(N, 1), a.raw_data(),
           std::max(K, 1), c.raw_data(), std::max(N, 1));
  return c;
}

}  // namespace tandem::kernels::cuda
