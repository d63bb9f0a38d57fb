// ProcessGroupNccl (contract in dist/process_group_nccl.h). Compiled only in CUDA builds.
// Owns: the NCCL communicator of one device, created non-blocking so that its initialisation can
// be abandoned (ncclCommAbort) after the group's timeout; the group's communication stream; the
// list of unfinished collectives, whose tensors it keeps alive until their events complete.
// Streams and ordering: a collective records `ready` on the device's compute stream
// (kernels/cuda/context.h) and makes the communication stream wait on it, launches the NCCL call
// on the communication stream and records `done` there. A Work's wait() polls `done` and the
// communicator's asynchronous error on the host (never cudaDeviceSynchronize); once `done` has
// completed it makes the compute stream wait on it, so later compute is ordered after the
// collective even if that wait is elided by the driver.
// Threads: the communicator is used under one mutex (launches, error queries, abort), so Works
// may be waited from any thread. Every NCCL call goes through TANDEM_NCCL_CHECK (file:line, the
// call, ncclGetErrorString and NCCL's last-error text); every CUDA call through TANDEM_CUDA_CHECK.
#include "dist/process_group_nccl.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/context.h"

// ncclInProgress is not an error: a non-blocking communicator is still working on the call.
#define TANDEM_NCCL_CHECK(expr)                                                               \
  do {                                                                                        \
    const ncclResult_t tandem_nccl_res_ = (expr);                                             \
    if (tandem_nccl_res_ != ncclSuccess && tandem_nccl_res_ != ncclInProgress) [[unlikely]] { \
      const char* tandem_nccl_last_ = ncclGetLastError(nullptr);                              \
      TANDEM_FAIL(#expr, " failed: ", ncclGetErrorString(tandem_nccl_res_),                   \
                  (tandem_nccl_last_ && *tandem_nccl_last_) ? " (" : "",                      \
                  tandem_nccl_last_ ? tandem_nccl_last_ : "",                                 \
                  (tandem_nccl_last_ && *tandem_nccl_last_) ? ")" : "");                      \
    }                                                                                         \
  } while (0)

namespace tandem::dist {
namespace {

using Clock = std::chrono::steady_clock;
namespace kc = tandem::kernels::cuda;

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  TANDEM_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int64: return ncclInt64;
    case DType::Int32: return ncclInt32;
    case DType::UInt8: return ncclUint8;
  }
  TANDEM_FAIL("ProcessGroupNccl: unsupported dtype ", dtype_name(dtype));
}

std::string nccl_text(ncclResult_t r) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

// Store key of the NCCL unique id of the k-th group that `rank` makes in this process (every
// rank makes its groups in one order; counted per rank so ranks that are threads of one
// process, as in the multi-GPU test, agree too).
std::string next_unique_id_key(int rank) {
  static std::mutex mu;
  static std::map<int, int> made;
  std::lock_guard<std::mutex> lock(mu);
  return "nccl_unique_id/" + std::to_string(made[rank]++);
}

// The communicator and its stream, shared by the group and its Works (a Work may outlive the
// group: it then only reads its own, already completed, event).
struct NcclComm {
  std::mutex mu;
  ncclComm_t comm = nullptr;  // null once destroyed or aborted
  cudaStream_t stream = nullptr;
  int device = 0;
  std::string who;           // "ProcessGroupNccl rank 0 of 2 on cuda:0"
  std::string abort_reason;  // set when aborted

  // Requires mu. Aborts the communicator (its kernels stop, so queued stream work drains).
  void abort_locked(const std::string& reason) {
    if (comm != nullptr) {
      ncclCommAbort(comm);  // result ignored: nothing more can be done with this communicator
      comm = nullptr;
    }
    if (abort_reason.empty()) abort_reason = reason;
  }

  // Requires mu. Polls the asynchronous state until it is not ncclInProgress; aborts and throws
  // on an error or at `deadline`, naming `what`.
  void settle_locked(const std::string& what, Clock::time_point deadline, Millis timeout) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      TANDEM_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string text = nccl_text(state);
        abort_locked(what + " failed: " + text);
        TANDEM_FAIL(who, ": ", what, " failed: ", text, "; the communicator was aborted");
      }
      if (Clock::now() >= deadline) {
        abort_locked(what + " did not finish within " + std::to_string(timeout.count()) + " ms");
        TANDEM_FAIL(who, ": ", what, " did not finish within ", timeout.count(),
                    " ms (a rank is missing or stuck); the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, cudaEvent_t done, std::string description,
           std::vector<Tensor> keep)
      : comm_(std::move(comm)), done_(done), description_(std::move(description)), keep_(std::move(keep)) {}

  ~NcclWork() override {
    // Any current device will do; never throws. The event is released once reached.
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || !error_.empty()) return true;
    kc::DeviceGuard guard(comm_->device);
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      std::lock_guard<std::mutex> comm_lock(comm_->mu);
      return !comm_->abort_reason.empty();  // aborted: it will never succeed
    }
    (void)cudaGetLastError();
    return true;  // reached, or a CUDA error that wait() reports
  }

  void wait(Millis timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) TANDEM_FAIL(error_);
    if (finished_) return;
    kc::DeviceGuard guard(comm_->device);
    const auto deadline = Clock::now() + timeout;
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        fail(std::string("CUDA error while waiting: ") + cudaGetErrorName(q) + ": " + cudaGetErrorString(q));
      }
      {
        std::lock_guard<std::mutex> comm_lock(comm_->mu);
        if (!comm_->abort_reason.empty()) fail("the communicator was aborted (" + comm_->abort_reason + ")");
        if (comm_->comm != nullptr) {
          ncclResult_t state = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(comm_->comm, &state);
          if (r != ncclSuccess) state = r;
          if (state != ncclSuccess && state != ncclInProgress) {
            const std::string text = nccl_text(state);
            comm_->abort_locked(description_ + " failed: " + text);
            fail("NCCL reported " + text + "; the communicator was aborted");
          }
        }
        if (Clock::now() >= deadline) {
          const std::string reason =
              description_ + " did not complete within " + std::to_string(timeout.count()) + " ms";
          comm_->abort_locked(reason);
          fail("did not complete within " + std::to_string(timeout.count()) +
               " ms (a rank is missing, stuck or issued collectives in another order); the communicator was "
               "aborted and the group cannot be used any more");
        }
      }
      if (spins < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // Reached: order the compute stream after it, then let the tensors go.
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(kc::compute_stream(comm_->device), done_, 0));
    finished_ = true;
    keep_.clear();
  }

  std::string description() const override { return description_; }

  // True once the event was reached (the group's list of unfinished collectives drops it).
  bool reached() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return true;
    kc::DeviceGuard guard(comm_->device);
    const cudaError_t q = cudaEventQuery(done_);
    (void)cudaGetLastError();
    return q == cudaSuccess;
  }

 private:
  // Requires mu_. Records and throws the error, naming the op.
  [[noreturn]] void fail(const std::string& why) {
    error_ = comm_->who + ": " + description_ + " " + why;
    TANDEM_FAIL(error_);
  }

  std::shared_ptr<NcclComm> comm_;
  cudaEvent_t done_ = nullptr;
  const std::string description_;
  std::vector<Tensor> keep_;  // tensors the communication stream uses, alive until reached
  std::mutex mu_;
  bool finished_ = false;
  std::string error_;
};

void check_cuda_contiguous(const char* op, const char* what, const Tensor& t, int device) {
  TANDEM_CHECK(t.defined(), "ProcessGroupNccl::", op, ": ", what, " is an undefined tensor");
  TANDEM_CHECK(t.device().is_cuda() && t.device().index == device, "ProcessGroupNccl::", op, ": ", what,
               " is ", t.str(), "; this group works on tensors of cuda:", device,
               " (use the gloo backend for CPU tensors)");
  TANDEM_CHECK(t.is_contiguous(), "ProcessGroupNccl::", op, ": ", what, " ", t.str(),
               " is not contiguous; pass a contiguous tensor");
}

}  // namespace

struct ProcessGroupNccl::Impl {
  std::shared_ptr<NcclComm> state = std::make_shared<NcclComm>();
  Millis timeout{0};
  std::mutex mu;  // guards inflight
  std::vector<std::shared_ptr<NcclWork>> inflight;
  Tensor barrier_buffer;

  // Queues one collective (see the file comment); `call` issues the NCCL call(s) on `stream`.
  std::shared_ptr<Work> launch(const std::string& description, std::vector<Tensor> keep,
                               const std::function<void(ncclComm_t, cudaStream_t)>& call) {
    NcclComm& s = *state;
    kc::DeviceGuard guard(s.device);
    {
      std::lock_guard<std::mutex> lock(mu);
      std::erase_if(inflight, [](const std::shared_ptr<NcclWork>& w) { return w->reached(); });
    }
    cudaEvent_t ready = nullptr, done = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    const cudaError_t made = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (made != cudaSuccess) cudaEventDestroy(ready);
    TANDEM_CUDA_CHECK(made);
    std::shared_ptr<NcclWork> work;
    try {
      std::lock_guard<std::mutex> lock(s.mu);
      TANDEM_CHECK(s.comm != nullptr, s.who, ": ", description,
                   " issued after the communicator was aborted (", s.abort_reason, ")");
      TANDEM_CUDA_CHECK(cudaEventRecord(ready, kc::compute_stream(s.device)));
      TANDEM_CUDA_CHECK(cudaStreamWaitEvent(s.stream, ready, 0));
      call(s.comm, s.stream);
      // A non-blocking communicator may still be enqueuing: settle before the next call.
      s.settle_locked(description, Clock::now() + timeout, timeout);
      TANDEM_CUDA_CHECK(cudaEventRecord(done, s.stream));
    } catch (...) {
      cudaEventDestroy(ready);
      cudaEventDestroy(done);
      throw;
    }
    cudaEventDestroy(ready);  // released once reached; the stream wait already holds it
    work = std::make_shared<NcclWork>(state, done, description, std::move(keep));
    std::lock_guard<std::mutex> lock(mu);
    inflight.push_back(work);
    return work;
  }
};

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, Millis timeout,
                                   int device)
    : ProcessGroup(rank, size, timeout), impl_(std::make_unique<Impl>()) {
  TANDEM_CHECK(store != nullptr, "ProcessGroupNccl: the store is null");
  TANDEM_CHECK(size >= 1, "ProcessGroupNccl: world size must be >= 1, got ", size);
  TANDEM_CHECK(rank >= 0 && rank < size, "ProcessGroupNccl: rank ", rank, " outside [0, ", size, ")");
  TANDEM_CHECK(timeout.count() > 0, "ProcessGroupNccl: timeout must be positive, got ", timeout.count(),
               " ms");
  kc::check_device_index(device);
  impl_->timeout = timeout;
  NcclComm& s = *impl_->state;
  s.device = device;
  s.who = "ProcessGroupNccl rank " + std::to_string(rank) + " of " + std::to_string(size) +
          " on cuda:" + std::to_string(device);
  kc::DeviceGuard guard(device);

  // The unique id: made by rank 0, read by the others through the store.
  const std::string key = next_unique_id_key(rank);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, Bytes(bytes, bytes + sizeof(id)));
  } else {
    store->wait({key}, timeout);
    const Bytes value = store->get(key);
    TANDEM_CHECK(value.size() == sizeof(id), s.who, ": store key '", key, "' at ", store->address(),
                 " holds ", value.size(), " bytes, expected an NCCL unique id of ", sizeof(id), " bytes");
    std::memcpy(&id, value.data(), sizeof(id));
  }

  (void)kc::compute_stream(device);  // make sure it exists before any collective
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing rank ends in an abort after `timeout`, not a hang
  {
    std::lock_guard<std::mutex> lock(s.mu);
    try {
      TANDEM_NCCL_CHECK(ncclCommInitRankConfig(&s.comm, size, id, rank, &config));
      s.settle_locked(
          "ncclCommInitRank (" + std::to_string(size) + " ranks, id from store key '" + key + "')",
          Clock::now() + timeout, timeout);
    } catch (...) {
      if (s.comm != nullptr) s.abort_locked("initialisation failed");
      cudaStreamDestroy(s.stream);
      s.stream = nullptr;
      throw;
    }
  }
  impl_->barrier_buffer = Tensor::zeros({1}, kFloat32, Device::cuda(device));
}

ProcessGroupNccl::~ProcessGroupNccl() {
  if (!impl_) return;
  NcclComm& s = *impl_->state;
  try {
    // Unfinished collectives first (each bounded by the timeout; after one aborts, the rest end).
    std::vector<std::shared_ptr<NcclWork>> pending;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      pending.swap(impl_->inflight);
    }
    for (auto& w : pending) {
      try {
        w->wait(impl_->timeout);
      } catch (...) {
      }
    }
    kc::DeviceGuard guard(s.device);
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.comm != nullptr) {
      // Finalize flushes the communicator's work; a clean finish allows ncclCommDestroy, anything
      // else (an error, or still busy at the deadline) ends in ncclCommAbort.
      const ncclResult_t fin = ncclCommFinalize(s.comm);
      bool clean = fin == ncclSuccess || fin == ncclInProgress;
      const auto deadline = Clock::now() + impl_->timeout;
      for (;;) {
        if (!clean) break;
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(s.comm, &state) != ncclSuccess)
          clean = false;
        else if (state == ncclSuccess)
          break;
        else if (state != ncclInProgress || Clock::now() >= deadline)
          clean = false;
        else
          std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (clean)
        ncclCommDestroy(s.comm);
      else
        ncclCommAbort(s.comm);
      s.comm = nullptr;
      if (s.abort_reason.empty()) s.abort_reason = "the group was destroyed";
    }
    if (s.stream != nullptr) cudaStreamDestroy(s.stream);
    s.stream = nullptr;
  } catch (...) {
    // A destructor never throws; the process keeps whatever could not be released.
  }
}

int ProcessGroupNccl::device() const { return impl_->state->device; }

std::shared_ptr<Work> ProcessGroupNccl::allreduce(Tensor& tensor, ReduceOp op) {
  const int dev = impl_->state->device;
  check_cuda_contiguous("allreduce", "tensor", tensor, dev);
  const ncclDataType_t dt = nccl_dtype(tensor.dtype());
  const std::string desc = std::string("allreduce(") + dtype_name(tensor.dtype()) +
                           shape_str(tensor.shape()) + ", " + reduce_op_name(op) +
                           ") on cuda:" + std::to_string(dev);
  void* ptr = tensor.raw_data();
  const size_t count = static_cast<size_t>(tensor.numel());
  const ncclRedOp_t red = nccl_op(op);
  return impl_->launch(desc, {tensor}, [=](ncclComm_t comm, cudaStream_t stream) {
    if (count == 0) return;
    TANDEM_NCCL_CHECK(ncclAllReduce(ptr, ptr, count, dt, red, comm, stream));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::broadcast(Tensor& tensor, int root) {
  const int dev = impl_->state->device;
  check_cuda_contiguous("broadcast", "tensor", tensor, dev);
  TANDEM_CHECK(root >= 0 && root < size_, "ProcessGroupNccl::broadcast: root ", root, " outside [0, ", size_,
               ")");
  const std::string desc = std::string("broadcast(") + dtype_name(tensor.dtype()) +
                           shape_str(tensor.shape()) + ", root " + std::to_string(root) +
                           ") on cuda:" + std::to_string(dev);
  void* ptr = tensor.raw_data();
  const size_t nbytes = tensor.nbytes();
  return impl_->launch(desc, {tensor}, [=](ncclComm_t comm, cudaStream_t stream) {
    if (nbytes == 0) return;
    TANDEM_NCCL_CHECK(ncclBroadcast(ptr, ptr, nbytes, ncclUint8, root, comm, stream));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::allgather(std::vector<Tensor>& outputs, const Tensor& input) {
  const int dev = impl_->state->device;
  check_cuda_contiguous("allgather", "input", input, dev);
  TANDEM_CHECK(static_cast<int>(outputs.size()) == size_, "ProcessGroupNccl::allgather: ", outputs.size(),
               " output tensors given, expected one per rank (", size_, ")");
  for (size_t r = 0; r < outputs.size(); ++r) {
    const std::string what = "outputs[" + std::to_string(r) + "]";
    check_cuda_contiguous("allgather", what.c_str(), outputs[r], dev);
    TANDEM_CHECK(outputs[r].dtype() == input.dtype() && outputs[r].shape() == input.shape(),
                 "ProcessGroupNccl::allgather: ", what, " is ", outputs[r].str(), ", expected the input's ",
                 dtype_name(input.dtype()), shape_str(input.shape()));
  }
  const std::string desc = std::string("allgather(") + dtype_name(input.dtype()) + shape_str(input.shape()) +
                           " x " + std::to_string(size_) + ") on cuda:" + std::to_string(dev);
  const size_t nbytes = input.nbytes();
  const int world = size_;
  // NCCL gathers into one buffer; the slices are then copied out on the communication stream.
  Tensor flat = Tensor::empty({static_cast<int64_t>(nbytes) * world}, kUInt8, Device::cuda(dev));
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  keep.push_back(flat);
  const void* in = input.raw_data();
  auto* gathered = static_cast<uint8_t*>(flat.raw_data());
  std::vector<void*> outs;
  for (auto& o : outputs) outs.push_back(o.raw_data());
  return impl_->launch(desc, std::move(keep), [=](ncclComm_t comm, cudaStream_t stream) {
    if (nbytes == 0) return;
    TANDEM_NCCL_CHECK(ncclAllGather(in, gathered, nbytes, ncclUint8, comm, stream));
    for (int r = 0; r < world; ++r)
      TANDEM_CUDA_CHECK(
          cudaMemcpyAsync(outs[r], gathered + r * nbytes, nbytes, cudaMemcpyDeviceToDevice, stream));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::barrier() {
  const int dev = impl_->state->device;
  void* ptr = impl_->barrier_buffer.raw_data();
  return impl_->launch("barrier() on cuda:" + std::to_string(dev), {impl_->barrier_buffer},
                       [=](ncclComm_t comm, cudaStream_t stream) {
                         TANDEM_NCCL_CHECK(ncclAllReduce(ptr, ptr, 1, ncclFloat32, ncclSum, comm, stream));
                       });
}

}  // namespace tandem::dist
