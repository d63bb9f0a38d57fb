// cuBLAS is loaded on first use (kernels/cuda/cublas_loader.cpp). This runs
// without a GPU: loading the library and asking it for a status string needs
// no device, so it shows that the forwarding entry points resolve.
#ifdef TANDEM_WITH_CUDA
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <string>

TEST(CublasLoader, ForwardsToTheLibraryLoadedOnFirstUse) {
  const std::string name = cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(name, "CUBLAS_STATUS_NOT_INITIALIZED");
  const std::string text = cublasGetStatusString(CUBLAS_STATUS_SUCCESS);
  EXPECT_FALSE(text.empty());
}
#endif
