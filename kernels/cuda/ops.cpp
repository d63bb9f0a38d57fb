// The CUDA backend's kernel table: every op of TANDEM_OPS_EVERY_BACKEND (kernels/ops.h; the CPU-only
// fast paths stay null), each kernel defined under tandem::kernels::cuda in kernels/cuda/<family>.cu.
#include "kernels/ops.h"

namespace tandem::kernels {
namespace backend_ns = cuda;

const Backend* cuda_backend() {
  static const Backend table = TANDEM_BACKEND_TABLE("cuda", TANDEM_OPS_EVERY_BACKEND);
  return &table;
}

}  // namespace tandem::kernels
