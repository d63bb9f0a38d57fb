// The CPU backend's kernel table: every op of kernels/ops.h, each kernel defined under
// tandem::kernels::cpu in kernels/cpu/<family>.cpp.
#include "kernels/ops.h"

namespace tandem::kernels {
namespace backend_ns = cpu;

const Backend& cpu_backend() {
  static const Backend table = TANDEM_BACKEND_TABLE("cpu", TANDEM_OPS);
  return table;
}

}  // namespace tandem::kernels
