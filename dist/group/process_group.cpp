// make_process_group (dist/group/process_group_factory.h), and the stand-in for ProcessGroupNccl in
// builds without CUDA: its constructor throws a tandem::Error saying that NCCL needs a CUDA
// build, so code that names the class still links and fails clearly at run time.
#include "dist/group/process_group.h"

#include <cstdlib>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "dist/group/process_group_factory.h"
#include "dist/group/process_group_gloo.h"
#include "dist/group/process_group_nccl.h"

namespace tandem::dist {
namespace {

int nccl_device_from_env(int device) {
  if (device >= 0) return device;
  const char* local = std::getenv("LOCAL_RANK");
  if (local == nullptr || *local == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(local, &end, 10);
  TANDEM_CHECK(end != local && *end == '\0' && v >= 0 && v < 1 << 20, "LOCAL_RANK='", local,
               "' is not a non-negative integer");
  return static_cast<int>(v);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend, std::shared_ptr<Store> store,
                                                 int rank, int size, Millis timeout, int device) {
  std::string name = backend;
  if (name == "auto") name = cuda_compiled() && cuda_device_count() > 0 ? "nccl" : "gloo";
  if (name == "gloo") return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, timeout);
  if (name == "nccl") {
    TANDEM_CHECK(cuda_compiled(), "backend 'nccl' needs a CUDA build, but Tandem was built without CUDA ",
                 "(reconfigure with -DTANDEM_CUDA=ON, or use backend 'gloo' for CPU training)");
    const int dev = nccl_device_from_env(device);
    const int count = cuda_device_count();
    TANDEM_CHECK(dev < count, "backend 'nccl': rank ", rank, " needs CUDA device ", dev,
                 " (its local rank) but ", count,
                 " device(s) are visible; run at most one process per GPU, or use backend 'gloo'");
    return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, timeout, dev);
  }
  TANDEM_FAIL("unknown process-group backend '", backend, "'; expected gloo, nccl or auto");
}

#ifndef TANDEM_WITH_CUDA

struct ProcessGroupNccl::Impl {};

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store>, int rank, int size, Millis timeout, int)
    : ProcessGroup(rank, size, timeout) {
  TANDEM_FAIL("ProcessGroupNccl: Tandem was built without CUDA, so NCCL is unavailable ",
              "(reconfigure with -DTANDEM_CUDA=ON, or use the gloo backend)");
}
ProcessGroupNccl::~ProcessGroupNccl() = default;
int ProcessGroupNccl::device() const { return -1; }
// Unreachable: no object can be constructed in this build.
std::shared_ptr<Work> ProcessGroupNccl::allreduce(Tensor&, ReduceOp) { TANDEM_FAIL("built without CUDA"); }
std::shared_ptr<Work> ProcessGroupNccl::broadcast(Tensor&, int) { TANDEM_FAIL("built without CUDA"); }
std::shared_ptr<Work> ProcessGroupNccl::allgather(std::vector<Tensor>&, const Tensor&) {
  TANDEM_FAIL("built without CUDA");
}
std::shared_ptr<Work> ProcessGroupNccl::barrier() { TANDEM_FAIL("built without CUDA"); }
std::shared_ptr<Work> ProcessGroupNccl::all_gather_into_tensor(Tensor&, const Tensor&) {
  TANDEM_FAIL("built without CUDA");
}
std::shared_ptr<Work> ProcessGroupNccl::reduce_scatter_tensor(Tensor&, const Tensor&, ReduceOp) {
  TANDEM_FAIL("built without CUDA");
}

#endif  // TANDEM_WITH_CUDA

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

void check_flat_collective(const std::string& who, bool gather, const Tensor& output, const Tensor& input,
                           int size, ReduceOp op) {
  const char* name = gather ? "all_gather_into_tensor" : "reduce_scatter_tensor";
  for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"output", &output}, {"input", &input}}) {
    TANDEM_CHECK(t->defined(), who, "::", name, ": ", what, " is an undefined tensor");
    TANDEM_CHECK(t->is_contiguous(), who, "::", name, ": ", what, " ", t->str(),
                 " is not contiguous; pass a contiguous tensor");
  }
  TANDEM_CHECK(output.dtype() == input.dtype() && output.device() == input.device(), who, "::", name,
               ": output is ", output.str(), " but input is ", input.str(), "; expected one dtype and device");
  const Tensor& shard = gather ? input : output;
  const Tensor& full = gather ? output : input;
  TANDEM_CHECK(full.numel() == shard.numel() * size, who, "::", name, ": ", gather ? "output" : "input", " has ",
               full.numel(), " elements, expected ", size, " (ranks) x ", shard.numel(), " (the ",
               gather ? "input" : "output", "'s) = ", shard.numel() * size);
  const bool floating = input.dtype() == DType::Float32 || input.dtype() == DType::Float64 ||
                        input.dtype() == DType::Float16 || input.dtype() == DType::BFloat16;
  TANDEM_CHECK(op != ReduceOp::Avg || floating, who, "::", name, ": ReduceOp::Avg needs a floating-point ",
               "tensor, got ", dtype_name(input.dtype()), " (use Sum and divide)");
}

}  // namespace tandem::dist
