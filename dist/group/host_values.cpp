// The host-value collectives of dist/group/host_values.h.
#include "dist/group/host_values.h"

#include "core/error.h"

namespace tandem::dist {
namespace {

void wait_for(ProcessGroup& group, const std::shared_ptr<Work>& work, const std::string& what) {
  try {
    work->wait(group.timeout());
  } catch (const Error& e) {
    TANDEM_FAIL(what, " over the ", group.backend(), " group (rank ", group.rank(), " of ", group.size(),
                ") failed: ", e.what());
  }
}

}  // namespace

Tensor values_on(const ProcessGroup& group, const std::vector<double>& values) {
  Tensor host = Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())});
  const Device device = group.comm_device();
  return device.is_cpu() ? host : host.to(device);
}

std::vector<double> allreduce_values(ProcessGroup& group, const std::vector<double>& values, ReduceOp op,
                                     const std::string& what) {
  Tensor t = values_on(group, values);
  wait_for(group, group.allreduce(t, op), what);
  return t.to_vector<double>();
}

std::vector<double> broadcast_values(ProcessGroup& group, const std::vector<double>& values, int root,
                                     const std::string& what) {
  Tensor t = values_on(group, values);
  wait_for(group, group.broadcast(t, root), what);
  return t.to_vector<double>();
}

std::vector<std::vector<double>> allgather_values(ProcessGroup& group, const std::vector<double>& values,
                                                  const std::string& what) {
  const Tensor mine = values_on(group, values);
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(Tensor::empty(mine.shape(), kFloat64, mine.device()));
  wait_for(group, group.allgather(all, mine), what);
  std::vector<std::vector<double>> out;
  for (const Tensor& t : all) out.push_back(t.to_vector<double>());
  return out;
}

}  // namespace tandem::dist
