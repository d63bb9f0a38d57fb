// cuBLAS is loaded on first use, not at program start: linking libcublas
// makes every process map and relocate ~150 MB of it (measured: VmHWM of an
// empty program grows from 1 MB to 155 MB), even a CPU-only run. So the
// library is not linked; instead this file defines the few cuBLAS entry
// points Tandem calls, each forwarding to the real one found with dlopen/dlsym
// the first time any of them is called. Thread-safe (static initialisation).
// A missing library is one clear error naming it.
#include <cublas_v2.h>
#include <dlfcn.h>

#include "core/error.h"

namespace {

void* cublas_library() {
  static void* handle = [] {
    void* h = nullptr;
    // Only the major version the build compiled against: an unversioned libcublas.so could be
    // another major (cuBLAS 12 beside cudart 13), whose ABI does not match the headers used here.
    for (const char* name : {"libcublas.so." TANDEM_CUBLAS_SOVERSION, TANDEM_CUBLAS_PATH}) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h) break;
    }
    TANDEM_CHECK(h != nullptr, "cannot load cuBLAS (libcublas.so." TANDEM_CUBLAS_SOVERSION " or "
                 TANDEM_CUBLAS_PATH "): ", dlerror());
    return h;
  }();
  return handle;
}

template <typename Fn>
Fn cublas_symbol(const char* name) {
  void* p = dlsym(cublas_library(), name);
  TANDEM_CHECK(p != nullptr, "cuBLAS has no symbol ", name, ": ", dlerror());
  return reinterpret_cast<Fn>(p);
}

#define TANDEM_FORWARD(name, ...)                                       \
  static const auto fn = cublas_symbol<decltype(&name)>(#name);         \
  return fn(__VA_ARGS__)

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) { TANDEM_FORWARD(cublasCreate_v2, handle); }

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) { TANDEM_FORWARD(cublasDestroy_v2, handle); }

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  TANDEM_FORWARD(cublasSetStream_v2, handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  TANDEM_FORWARD(cublasSetMathMode, handle, mode);
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) { TANDEM_FORWARD(cublasGetStatusName, status); }

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  TANDEM_FORWARD(cublasGetStatusString, status);
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                           int m, int n, int k, const float* alpha, const float* A, int lda,
                                           const float* B, int ldb, const float* beta, float* C, int ldc) {
  TANDEM_FORWARD(cublasSgemm_v2, handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// float64 (kernels/cuda/linear.cu: matmul and linear in double).
cublasStatus_t CUBLASWINAPI cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                           int m, int n, int k, const double* alpha, const double* A, int lda,
                                           const double* B, int ldb, const double* beta, double* C, int ldc) {
  TANDEM_FORWARD(cublasDgemm_v2, handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Batched products of equal-shaped matrices at fixed strides (kernels/cuda/index.cu: bmm).
cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                      cublasOperation_t transb, int m, int n, int k,
                                                      const float* alpha, const float* A, int lda,
                                                      long long int strideA, const float* B, int ldb,
                                                      long long int strideB, const float* beta, float* C, int ldc,
                                                      long long int strideC, int batchCount) {
  TANDEM_FORWARD(cublasSgemmStridedBatched, handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
                 beta, C, ldc, strideC, batchCount);
}

cublasStatus_t CUBLASWINAPI cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                      cublasOperation_t transb, int m, int n, int k,
                                                      const double* alpha, const double* A, int lda,
                                                      long long int strideA, const double* B, int ldb,
                                                      long long int strideB, const double* beta, double* C, int ldc,
                                                      long long int strideC, int batchCount) {
  TANDEM_FORWARD(cublasDgemmStridedBatched, handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
                 beta, C, ldc, strideC, batchCount);
}

// Mixed precision (kernels/cuda/linear.cu): f16/bf16 GEMM with float accumulation. cublas_api.h
// also declares a C++ overload taking a cudaDataType compute type, so the pointer type is spelled
// out rather than taken with decltype.
cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                                         void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t(CUBLASWINAPI*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                                           cublasGemmAlgo_t);
  static const auto fn = cublas_symbol<Fn>("cublasGemmEx");
  return fn(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType,
            algo);
}

}  // extern "C"
