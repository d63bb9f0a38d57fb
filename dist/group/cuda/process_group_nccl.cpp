// ProcessGroupNccl (contract in dist/group/process_group_nccl.h). Compiled only in CUDA builds.
// Owns: the NCCL communicator of one device, created non-blocking so that its initialisation can
// be abandoned (ncclCommAbort) after the group's timeout; the group's communication stream; the
// in-flight list (each unfinished collective's `done` event, issue time and the tensors it uses,
// kept alive until the event is reached); the watchdog thread; the group's error record.
// Streams and ordering: a collective records `ready` on the device's compute stream
// (core/cuda/context.h) and makes the communication stream wait on it, launches the NCCL call
// on the communication stream, lets the non-blocking communicator settle (the NCCL kernel is
// enqueued only once ncclCommGetAsyncError stops reporting ncclInProgress), queues whatever reads
// the collective's result on that stream (allgather's copies out of its flat buffer) and records
// `done` there after it. No host wait anywhere unless asked for:
// Work::wait() makes the compute stream wait on `done` (cudaStreamWaitEvent) and returns, so
// later compute is ordered after the collective while the host keeps queueing work;
// Work::synchronize() (and barrier()'s wait()) then also polls `done` on the host. Never
// cudaDeviceSynchronize.
// Errors: whoever aborts the communicator (the watchdog, synchronize() at its timeout, a launch
// whose NCCL call fails to settle) records one message in the group's error record (the first
// wins) and prints it once to stderr; from then on every collective call, wait() and
// synchronize() throws tandem::Error with that message. The abort makes the stuck NCCL kernels
// return, so the streams drain and the tensors of the in-flight list can be released.
// Threads:
//  - caller threads (any number, any of them may wait on any Work): issue collectives (launch(),
//    under `mu`; it also drops reached in-flight entries); wait() (one cudaStreamWaitEvent; never
//    blocks on the collective); synchronize() (polls the event; takes `mu` to query the
//    asynchronous error and, at its timeout, to abort); is_completed() (one event query).
//  - the watchdog, one thread per group, started by the constructor once the communicator is up
//    and stopped and joined by the destructor before the communicator is finalized. Every 100 ms
//    (a condition variable ends the sleep at once on shutdown) it drops the in-flight entries
//    whose events were reached (releasing their tensors), then under `mu` checks
//    ncclCommGetAsyncError and the age of the oldest unreached collective, and aborts the
//    communicator when NCCL reports an error or that collective is older than the group's timeout.
//  - the destructor's thread: lets the in-flight collectives end (the watchdog aborts the stuck
//    ones; a backstop aborts past the timeout), stops the watchdog, finalizes (or aborts) the
//    communicator, waits a bounded time for the streams to drain, and keeps (leaks) the tensors
//    of anything still unreached rather than free memory a stream may still use. Never throws.
// Locks: `mu` guards the communicator: every NCCL call on it (launch and its settling, the async
// error query, abort, finalize) runs under it. `inflight_mu` guards the in-flight list; it may be
// taken while `mu` is held (launch appends under both, so the list is in stream order), never the
// other way round. The error record is written once under `mu` and then published by an atomic
// flag, so reading it needs no lock. Tensors are released outside both locks.
// Every NCCL call goes through TANDEM_NCCL_CHECK (file:line, the call, ncclGetErrorString and
// NCCL's last-error text) or has its result checked by hand; every CUDA call that can fail the
// caller goes through TANDEM_CUDA_CHECK.
#include "dist/group/process_group_nccl.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/cuda/context.h"
#include "dist/group/cuda/nccl_state.h"

namespace tandem::dist {

using namespace nccl_detail;

namespace {

namespace kc = tandem::cuda;

// On a one-rank communicator NCCL before 2.29.7 runs Avg through a kernel that leaves the last
// `count % blocks` elements unwritten (NVIDIA/nccl issue 1950; seen here on an H100 with the NCCL of
// PyTorch 2.11's wheels). The mean of one rank is the sum, so one rank asks for Sum.
ncclRedOp_t nccl_op(ReduceOp op, int world_size) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return world_size == 1 ? ncclSum : ncclAvg;
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

// Store key of the NCCL unique id of the k-th group that `rank` makes through the store at
// `address` in this process (every rank makes its groups on one store in one order; counted per
// store and rank, as the Gloo group's prefix is, so subgroups on their own PrefixStores and ranks
// that are threads of one process, as in the multi-GPU test, agree too).
std::string next_unique_id_key(const std::string& address, int rank) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, int> made;
  std::lock_guard<std::mutex> lock(mu);
  return "nccl_unique_id/" + std::to_string(made[{address, rank}]++);
}

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
  std::shared_ptr<NcclState> state = std::make_shared<NcclState>();
  std::thread watchdog;
  Tensor barrier_buffer;

  ~Impl() { stop_watchdog(); }

  // Wakes the watchdog and joins it; never throws. Should the join fail the thread is detached:
  // it holds its own reference to the state.
  void stop_watchdog() noexcept {
    if (!watchdog.joinable()) return;
    try {
      {
        std::lock_guard<std::mutex> lock(state->watchdog_mu);
        state->stop = true;
      }
      state->watchdog_cv.notify_all();
      watchdog.join();
    } catch (...) {
      try {
        if (watchdog.joinable()) watchdog.detach();
      } catch (...) {
      }
    }
  }

  // Queues one collective (see the file comment); `call` issues the NCCL call(s) on `stream`;
  // `then`, when given, queues on `stream` what reads the result, once the call has settled (before
  // that a non-blocking communicator may not have enqueued its kernel yet, and work queued now
  // would run ahead of it).
  std::shared_ptr<Work> launch(const std::string& description, std::vector<Tensor> keep, bool host_wait,
                               const std::function<void(ncclComm_t, cudaStream_t)>& call,
                               const std::function<void(cudaStream_t)>& then = {}) {
    NcclState& s = *state;
    s.throw_if_failed();
    kc::DeviceGuard guard(s.device);
    (void)s.release_reached();  // a query error is the watchdog's to report
    Event ready;
    auto done = std::make_shared<Event>();
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.throw_if_failed();
      TANDEM_CHECK(s.comm != nullptr, s.who, ": ", description, " issued after the group was destroyed");
      TANDEM_CUDA_CHECK(cudaEventRecord(ready.get(), kc::compute_stream(s.device)));
      TANDEM_CUDA_CHECK(cudaStreamWaitEvent(s.stream, ready.get(), 0));
      call(s.comm, s.stream);
      // A non-blocking communicator may still be enqueuing: settle before the next call.
      s.settle_locked(description, s.timeout, /*init=*/false);
      if (then) then(s.stream);
      TANDEM_CUDA_CHECK(cudaEventRecord(done->get(), s.stream));
      std::lock_guard<std::mutex> list_lock(s.inflight_mu);
      s.inflight.push_back(Inflight{done, description, Clock::now(), std::move(keep)});
    }
    // `ready` goes now: the communication stream's wait already holds it.
    return make_nccl_work(state, std::move(done), description, host_wait);
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
  NcclState& s = *impl_->state;
  s.device = device;
  s.timeout = timeout;
  s.who = "ProcessGroupNccl rank " + std::to_string(rank) + " of " + std::to_string(size) +
          " on cuda:" + std::to_string(device);
  kc::DeviceGuard guard(device);

  // The unique id: made by rank 0, read by the others through the store.
  const std::string key = next_unique_id_key(store->address(), rank);
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
  // Made before the communicator, so that nothing after its creation but the watchdog can fail.
  impl_->barrier_buffer = Tensor::zeros({1}, kFloat32, Device::cuda(device));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing rank ends in an abort after `timeout`, not a hang
  std::lock_guard<std::mutex> lock(s.mu);
  try {
    TANDEM_NCCL_CHECK(ncclCommInitRankConfig(&s.comm, size, id, rank, &config));
    s.settle_locked("ncclCommInitRank (" + std::to_string(size) + " ranks, id from store key '" + key + "')",
                    timeout, /*init=*/true);
    impl_->watchdog = std::thread(&NcclState::watchdog_main, impl_->state);
    s.up = true;
  } catch (...) {
    if (s.comm != nullptr) s.abort_locked(s.who + ": initialisation failed");
    if (cudaStreamDestroy(s.stream) != cudaSuccess) (void)cudaGetLastError();
    s.stream = nullptr;
    throw;
  }
}

ProcessGroupNccl::~ProcessGroupNccl() {
  if (!impl_) return;
  NcclState& s = *impl_->state;
  try {
    std::optional<kc::DeviceGuard> guard;
    try {
      guard.emplace(s.device);
    } catch (...) {
    }
    // 1. Let the unfinished collectives end. The watchdog aborts one older than the timeout, so this
    //    ends within about the timeout; the backstop covers a watchdog that could not act.
    const auto backstop = Clock::now() + s.timeout + 2 * kWatchdogPeriod;
    while (!s.has_failed()) {
      (void)s.release_reached();
      if (s.inflight_empty()) break;
      if (Clock::now() >= backstop) {
        std::lock_guard<std::mutex> lock(s.mu);
        std::string what = "a collective";
        {
          std::lock_guard<std::mutex> list_lock(s.inflight_mu);
          if (!s.inflight.empty()) what = s.inflight.front().description;
        }
        s.abort_locked(s.timeout_message(what, s.timeout));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // 2. The watchdog goes before the communicator.
    impl_->stop_watchdog();
    // 3. The communicator: finalize flushes its work; a clean finish allows ncclCommDestroy,
    //    anything else (an error, or still busy at the deadline) ends in ncclCommAbort.
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.comm != nullptr) {
        const ncclResult_t fin = ncclCommFinalize(s.comm);
        bool clean = fin == ncclSuccess || fin == ncclInProgress;
        const auto deadline = Clock::now() + s.timeout;
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
          (void)ncclCommDestroy(s.comm);
        else
          (void)ncclCommAbort(s.comm);
        s.comm = nullptr;
      }
    }
    // 4. After an abort the aborted kernels return and the stream drains; give it a bounded time,
    //    then keep the tensors of whatever is still unreached for good rather than free memory a
    //    stream may still use.
    const auto drained_by = Clock::now() + std::min<Millis>(s.timeout, kDrainAfterAbort);
    for (;;) {
      (void)s.release_reached();
      if (s.inflight_empty() || Clock::now() >= drained_by) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    {
      std::lock_guard<std::mutex> lock(s.inflight_mu);
      if (!s.inflight.empty()) (void)new std::deque<Inflight>(std::move(s.inflight));  // kept on purpose
      s.inflight.clear();
    }
    if (s.stream != nullptr && cudaStreamDestroy(s.stream) != cudaSuccess) (void)cudaGetLastError();
    s.stream = nullptr;
  } catch (...) {
    // A destructor never throws; the process keeps whatever could not be released.
  }
  impl_->stop_watchdog();  // in case step 2 was never reached
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
  const ncclRedOp_t red = nccl_op(op, size_);
  return impl_->launch(desc, {tensor}, /*host_wait=*/false, [=](ncclComm_t comm, cudaStream_t stream) {
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
  return impl_->launch(desc, {tensor}, /*host_wait=*/false, [=](ncclComm_t comm, cudaStream_t stream) {
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
  // NCCL gathers into one buffer; the slices are copied out on the communication stream once the
  // gather has settled, and the Work's `done` is recorded after the copies.
  Tensor flat = Tensor::empty({static_cast<int64_t>(nbytes) * world}, kUInt8, Device::cuda(dev));
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  keep.push_back(flat);
  const void* in = input.raw_data();
  auto* gathered = static_cast<uint8_t*>(flat.raw_data());
  std::vector<void*> outs;
  for (auto& o : outputs) outs.push_back(o.raw_data());
  return impl_->launch(
      desc, std::move(keep), /*host_wait=*/false,
      [=](ncclComm_t comm, cudaStream_t stream) {
        if (nbytes == 0) return;
        TANDEM_NCCL_CHECK(ncclAllGather(in, gathered, nbytes, ncclUint8, comm, stream));
      },
      [=](cudaStream_t stream) {
        if (nbytes == 0) return;
        for (int r = 0; r < world; ++r)
          TANDEM_CUDA_CHECK(
              cudaMemcpyAsync(outs[r], gathered + r * nbytes, nbytes, cudaMemcpyDeviceToDevice, stream));
      });
}

std::shared_ptr<Work> ProcessGroupNccl::all_gather_into_tensor(Tensor& output, const Tensor& input) {
  const int dev = impl_->state->device;
  check_cuda_contiguous("all_gather_into_tensor", "input", input, dev);
  check_cuda_contiguous("all_gather_into_tensor", "output", output, dev);
  check_flat_collective("ProcessGroupNccl", /*gather=*/true, output, input, size_);
  const std::string desc = std::string("all_gather_into_tensor(") + dtype_name(input.dtype()) +
                           shape_str(input.shape()) + " x " + std::to_string(size_) + ") on cuda:" +
                           std::to_string(dev);
  const void* in = input.raw_data();
  void* out = output.raw_data();
  const size_t nbytes = input.nbytes();
  return impl_->launch(desc, {output, input}, /*host_wait=*/false, [=](ncclComm_t comm, cudaStream_t stream) {
    if (nbytes == 0) return;
    TANDEM_NCCL_CHECK(ncclAllGather(in, out, nbytes, ncclUint8, comm, stream));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op) {
  const int dev = impl_->state->device;
  check_cuda_contiguous("reduce_scatter_tensor", "input", input, dev);
  check_cuda_contiguous("reduce_scatter_tensor", "output", output, dev);
  check_flat_collective("ProcessGroupNccl", /*gather=*/false, output, input, size_, op);
  const ncclDataType_t dt = nccl_dtype(input.dtype());
  const std::string desc = std::string("reduce_scatter_tensor(") + dtype_name(input.dtype()) +
                           shape_str(input.shape()) + ", " + reduce_op_name(op) + ") on cuda:" +
                           std::to_string(dev);
  const void* in = input.raw_data();
  void* out = output.raw_data();
  const size_t count = static_cast<size_t>(output.numel());
  const ncclRedOp_t red = nccl_op(op, size_);
  return impl_->launch(desc, {output, input}, /*host_wait=*/false, [=](ncclComm_t comm, cudaStream_t stream) {
    if (count == 0) return;
    TANDEM_NCCL_CHECK(ncclReduceScatter(in, out, count, dt, red, comm, stream));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::barrier() {
  const int dev = impl_->state->device;
  void* ptr = impl_->barrier_buffer.raw_data();
  // host_wait: a barrier is a host synchronisation point, so its wait() is synchronize().
  return impl_->launch("barrier() on cuda:" + std::to_string(dev), {impl_->barrier_buffer},
                       /*host_wait=*/true, [=](ncclComm_t comm, cudaStream_t stream) {
                         TANDEM_NCCL_CHECK(ncclAllReduce(ptr, ptr, 1, ncclFloat32, ncclSum, comm, stream));
                       });
}

}  // namespace tandem::dist
