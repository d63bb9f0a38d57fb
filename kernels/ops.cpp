// The op table's lookups (kernels/ops.h): the backend of a device, the ops a backend registers.
#include "kernels/ops.h"

#include <atomic>
#include <string_view>

#include "kernels/dispatch.h"

namespace tandem::kernels {

#ifndef TANDEM_WITH_CUDA
const Backend* cuda_backend() { return nullptr; }
#endif

std::vector<const Backend*> backends() {
  std::vector<const Backend*> out{&cpu_backend()};
  if (const Backend* cuda = cuda_backend()) out.push_back(cuda);
  return out;
}

std::vector<const char*> table_ops() {
  return {
#define TANDEM_OP_NAME(op, ...) #op,
      TANDEM_OPS(TANDEM_OP_NAME)
#undef TANDEM_OP_NAME
  };
}

std::vector<const char*> cpu_only_ops() {
  return {
#define TANDEM_OP_NAME(op, ...) #op,
      TANDEM_OPS_CPU_ONLY(TANDEM_OP_NAME)
#undef TANDEM_OP_NAME
  };
}

std::vector<const char*> registered_ops(const Backend& backend) {
  std::vector<const char*> out;
#define TANDEM_OP_IF_REGISTERED(op, ...) \
  if (backend.op != nullptr) out.push_back(#op);
  TANDEM_OPS(TANDEM_OP_IF_REGISTERED)
#undef TANDEM_OP_IF_REGISTERED
  return out;
}

const Backend& backend_for(Device device, const char* op) {
  if (!device.is_cuda()) return cpu_backend();
  const Backend* cuda = cuda_backend();
  if (cuda == nullptr) throw_no_cuda(op);
  return *cuda;
}

void throw_missing_kernel(const char* op, const Backend& backend) {
  TANDEM_FAIL(op, ": the ", backend.backend_name, " backend has no kernel for this op");
}

namespace {
constexpr int kFastPaths = 0
#define TANDEM_OP_ONE(op, ...) +1
    TANDEM_OPS_FAST_PATHS(TANDEM_OP_ONE)
#undef TANDEM_OP_ONE
    ;
std::atomic<int64_t> g_fast_path_calls[kFastPaths];
}  // namespace

std::vector<const char*> fast_path_ops() {
  return {
#define TANDEM_OP_NAME(op, ...) #op,
      TANDEM_OPS_FAST_PATHS(TANDEM_OP_NAME)
#undef TANDEM_OP_NAME
  };
}

void count_fast_path(FastPath path) {
  g_fast_path_calls[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
}

int64_t fast_path_count(const char* op) {
  const std::vector<const char*> names = fast_path_ops();
  for (size_t i = 0; i < names.size(); ++i) {
    if (std::string_view(names[i]) == op) return g_fast_path_calls[i].load(std::memory_order_relaxed);
  }
  return -1;
}

// Each entry point has the signature of its op's kernels (an overload of that type must exist:
// binary also takes a scalar operand).
namespace {
#define TANDEM_OP_ENTRY_MATCHES(op, ...) [[maybe_unused]] constexpr op_sig::op* op##_entry_point = &kernels::op;
TANDEM_OPS_ENTRY_POINTS(TANDEM_OP_ENTRY_MATCHES)
#undef TANDEM_OP_ENTRY_MATCHES
}  // namespace

}  // namespace tandem::kernels
