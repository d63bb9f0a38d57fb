// The CUDA backend's kernel table: every op of kernels/ops.h, each kernel defined under
// tandem::kernels::cuda in kernels/cuda/<family>.cu (float32).
#include "kernels/ops.h"

namespace tandem::kernels {
namespace backend_ns = cuda;

const Backend* cuda_backend() {
  static const Backend table = TANDEM_BACKEND_TABLE("cuda");
  return &table;
}

}  // namespace tandem::kernels
