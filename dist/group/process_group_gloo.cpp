// ProcessGroupGloo (see process_group_gloo.h for the contract). Owns: the Gloo TCP device and
// context, and the queue of issued collectives (dist/group/gloo_work.h: the one worker thread that runs
// them); the reading of Gloo's errors is dist/group/gloo_diagnosis.h's.
// Threads: collectives are validated on the caller's thread and run on the worker thread;
// Work::wait runs on any thread. Gloo's TCP pairs write to sockets from the worker thread and
// from Gloo's event-loop thread: both are started with SIGPIPE blocked, so a peer that vanished
// yields an error (EPIPE) instead of killing the process; no process-wide signal state changes.
// Every Gloo call runs under try/catch: Gloo's exceptions become the failing Work's error.
#include "dist/group/process_group_gloo.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/storage.h"
#include "dist/group/gloo_diagnosis.h"
#include "dist/group/gloo_reduce.h"
#include "dist/group/gloo_store_adapter.h"
#include "dist/group/gloo_work.h"
#include "dist/group/shm_allreduce.h"

namespace tandem::dist {

using namespace gloo_detail;

namespace {

// ---- network interface choice ----

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Gloo's attr: an interface name from the environment, else an address to bind.
gloo::transport::tcp::attr choose_transport_attr(std::string& chosen) {
  gloo::transport::tcp::attr attr;
  for (const char* var : {"TANDEM_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    const std::string iface = env_or_empty(var);
    if (!iface.empty()) {
      attr.iface = iface;
      chosen = "interface " + iface + " (from " + var + ")";
      return attr;
    }
  }
  const std::string master = env_or_empty("MASTER_ADDR");
  if (!master.empty()) {
    attr.hostname = local_address_toward(master);
    chosen = attr.hostname + " (route to MASTER_ADDR=" + master + ")";
    return attr;
  }
  // No hint: the hostname if it resolves (Gloo binds its first address), else loopback.
  char host[256] = {0};
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (gethostname(host, sizeof(host) - 1) == 0 && getaddrinfo(host, nullptr, &hints, &res) == 0) {
    freeaddrinfo(res);
    attr.hostname = host;
    chosen = std::string(host) + " (hostname; MASTER_ADDR and TANDEM_SOCKET_IFNAME unset)";
  } else {
    attr.hostname = "127.0.0.1";
    chosen = "127.0.0.1 (hostname does not resolve; MASTER_ADDR and TANDEM_SOCKET_IFNAME unset)";
  }
  return attr;
}

// Blocks SIGPIPE on the calling thread for its lifetime; threads started meanwhile inherit the
// blocked mask. On exit, a SIGPIPE raised meanwhile on this thread is discarded, then the
// previous mask is restored.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~SigpipeBlock() {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1 && !sigismember(&old_, SIGPIPE)) {
      const timespec zero{0, 0};
      while (sigtimedwait(&set_, nullptr, &zero) > 0) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t set_, old_;
};

// Key namespace of the k-th Gloo group that `rank` makes through the store at `address` in this
// process: every rank makes its groups on one store in the same order, so the k-th groups of all
// ranks meet under one prefix. Counted per store, so that subgroups made through their own
// PrefixStores (FSDP's HYBRID_SHARD: a node's ranks, the replicas) agree even where a process is a
// different rank in each; and per rank, so that ranks living as threads of one process (tests) agree.
std::string next_group_prefix(const std::string& address, int rank) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, int> made;
  std::lock_guard<std::mutex> lock(mu);
  return "gloo/" + std::to_string(made[{address, rank}]++) + "/";
}

template <typename T>
void run_allreduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t n,
                   const gloo::AllreduceOptions::Func& fn, uint32_t tag, Millis timeout) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(static_cast<T*>(data), n);
  opts.setReduceFunction(fn);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

void check_contiguous(const char* op, const char* what, const Tensor& t) {
  TANDEM_CHECK(t.defined(), "ProcessGroupGloo::", op, ": ", what, " is an undefined tensor");
  TANDEM_CHECK(t.is_contiguous(), "ProcessGroupGloo::", op, ": ", what, " ", t.str(),
               " is not contiguous; pass a contiguous tensor (e.g. .contiguous(), then copy back)");
}

}  // namespace

std::string local_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  TANDEM_CHECK(rc == 0, "cannot resolve MASTER_ADDR '", host, "': ", gai_strerror(rc),
               " (set MASTER_ADDR to a reachable host, or TANDEM_SOCKET_IFNAME to an interface)");
  std::string result, last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr && result.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    // Connecting a UDP socket only picks the route and source address; nothing is sent.
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      char text[INET6_ADDRSTRLEN] = {0};
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        const void* addr =
            local.ss_family == AF_INET
                ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
        if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) result = text;
      }
    } else {
      last_error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  TANDEM_CHECK(!result.empty(), "no route from this host to MASTER_ADDR '", host, "' (", last_error,
               "); set TANDEM_SOCKET_IFNAME to the interface to use");
  return result;
}

struct ProcessGroupGloo::Impl {
  std::string who;      // "ProcessGroupGloo rank 0 of 2"
  std::string address;  // what the transport was bound to, for messages
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<Store> store;  // for the diagnosis of a timed-out collective
  std::string prefix;            // this group's store keys, "gloo/<k>/"
  int rank = 0, size = 1;
  Millis timeout{0};
  Millis diagnosis{0};                     // how long a failed rank waits to hear from the others
  std::vector<std::string> peer_address;  // [r]: how Gloo names rank r in its errors ("" for self)
  std::unique_ptr<ShmAllreduce> shm;      // all-reduce through shared memory when all ranks share a host
  std::string shm_why_not;                // why not, otherwise
  std::atomic<int64_t> tcp_allreduces{0};

  std::unique_ptr<GlooQueue> queue;  // made (and its thread started) last in the constructor

  // The message of a collective's first failure (the queue's worker thread): Gloo's text with the
  // peers it names mapped to ranks, and, for a timeout, the ranks that never reported reaching the
  // same collective (dist/group/gloo_diagnosis.h).
  std::string explain(const std::string& error, uint32_t tag) {
    std::string out = error + gloo_diagnosis::name_peers(error, rank, peer_address);
    if (!gloo_diagnosis::is_timeout(error) || size < 2 || !store) return out;
    return out + gloo_diagnosis::silent_peers(*store, prefix, tag, rank, size, error, diagnosis);
  }

  std::shared_ptr<Work> enqueue(std::string description, std::function<void(uint32_t)> body) {
    return queue->enqueue(std::move(description), std::move(body));
  }

  // After the full mesh exists: every rank publishes how its pairs are addressed, and learns
  // how each peer's pair with it is addressed (Gloo's errors name a peer that way).
  void exchange_pair_addresses() {
    std::string mine;
    for (int r = 0; r < size; ++r) {
      if (r != rank) mine += context->getPair(r)->address().str();
      mine += '\n';
    }
    store->set_string(prefix + "pair_addresses/" + std::to_string(rank), mine);
    peer_address.assign(static_cast<size_t>(size), "");
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::string theirs = store->get_string(prefix + "pair_addresses/" + std::to_string(r));
      size_t start = 0;
      for (int i = 0; i < size; ++i) {
        const size_t nl = theirs.find('\n', start);
        if (nl == std::string::npos) break;
        if (i == rank) peer_address[static_cast<size_t>(r)] = theirs.substr(start, nl - start);
        start = nl + 1;
      }
    }
  }
};

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, Millis timeout)
    : ProcessGroup(rank, size, timeout), impl_(std::make_unique<Impl>()) {
  TANDEM_CHECK(store != nullptr, "ProcessGroupGloo: the store is null");
  TANDEM_CHECK(size >= 1, "ProcessGroupGloo: world size must be >= 1, got ", size);
  TANDEM_CHECK(rank >= 0 && rank < size, "ProcessGroupGloo: rank ", rank, " outside [0, ", size, ")");
  TANDEM_CHECK(timeout.count() > 0, "ProcessGroupGloo: timeout must be positive, got ", timeout.count(),
               " ms");
  Impl& im = *impl_;
  im.who = "ProcessGroupGloo rank " + std::to_string(rank) + " of " + std::to_string(size);
  im.timeout = timeout;
  im.diagnosis = std::clamp<Millis>(timeout / 4, Millis(500), Millis(3000));
  im.rank = rank;
  im.size = size;
  im.store = store;

  SigpipeBlock no_sigpipe;  // Gloo's loop thread and our worker inherit the blocked SIGPIPE
  gloo::transport::tcp::attr attr = choose_transport_attr(im.address);
  try {
    im.device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TANDEM_FAIL(im.who, ": cannot create the Gloo TCP device on ", im.address, ": ", e.what());
  }
  const std::string prefix = next_group_prefix(store->address(), rank);
  im.prefix = prefix;
  GlooStoreAdapter adapter(store, prefix);
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    context->connectFullMesh(adapter, im.device);
    im.context = std::move(context);
    im.exchange_pair_addresses();
  } catch (const std::exception& e) {
    TANDEM_FAIL(im.who, ": Gloo rendezvous through ", store->address(), " (keys ", prefix,
                "*) failed within ", timeout.count(), " ms: ", e.what());
  }
  try {
    im.shm = ShmAllreduce::create(*store, prefix, rank, size, timeout, im.shm_why_not);
  } catch (const std::exception& e) {
    TANDEM_FAIL(im.who, ": setting up the shared-memory all-reduce through ", store->address(), " (keys ",
                prefix, "shm/*) failed: ", e.what());
  }
  // Past the group's timeout, a started collective may still take the diagnosis and one store
  // round trip (the store's own timeout plus its reply allowance) before it reports.
  const Millis grace = im.diagnosis + store->timeout() + Millis(3000);
  im.queue = std::make_unique<GlooQueue>(im.who, timeout, grace,
                                         [&im](const std::string& error, uint32_t tag) { return im.explain(error, tag); });
  im.queue->start();
}

ProcessGroupGloo::~ProcessGroupGloo() {
  if (!impl_) return;
  // Queued collectives still run (each ends within Gloo's timeout; after a failure the rest end
  // at once), so peers that issued them are not left waiting.
  impl_->queue.reset();
  impl_->context.reset();
  impl_->device.reset();
}

std::string ProcessGroupGloo::local_address() const {
  return impl_->device ? impl_->device->str() : impl_->address;
}

ProcessGroupGloo::AllreducePaths ProcessGroupGloo::allreduce_paths() const {
  AllreducePaths p;
  p.tcp = impl_->tcp_allreduces.load();
  if (impl_->shm) {
    p.in_place = impl_->shm->in_place_calls();
    p.through_slots = impl_->shm->slot_calls();
    p.reduce_scatter_in_place = impl_->shm->reduce_scatter_in_place_calls();
    p.reduce_scatter_through_slots = impl_->shm->reduce_scatter_slot_calls();
  }
  return p;
}

std::string ProcessGroupGloo::allreduce_transport() const {
  if (impl_->shm) return "shared memory (" + std::to_string(impl_->shm->slot_bytes() >> 10) + " KiB slots)";
  return "tcp (" + impl_->shm_why_not + ")";
}

Tensor ProcessGroupGloo::comm_buffer(int64_t numel, DType dtype, Device device) {
  TANDEM_CHECK(numel >= 0, impl_->who, ": comm_buffer of ", numel, " elements");
  if (!impl_->shm || !device.is_cpu() || numel == 0) return ProcessGroup::comm_buffer(numel, dtype, device);
  const size_t bytes = static_cast<size_t>(numel) * element_size(dtype);
  ShmAllreduce::Buffer b;
  try {
    b = impl_->shm->allocate(*impl_->store, bytes, impl_->timeout);
  } catch (const std::exception& e) {
    TANDEM_FAIL(impl_->who, ": comm_buffer(", numel, " x ", dtype_name(dtype), ") through ",
                impl_->store->address(), " failed: ", e.what());
  }
  if (!b.data) return ProcessGroup::comm_buffer(numel, dtype, device);  // every rank falls back alike
  return Tensor::from_storage(std::make_shared<Storage>(b.data, bytes, device, std::move(b.release)), {numel},
                              dtype);
}

std::shared_ptr<Work> ProcessGroupGloo::allreduce(Tensor& tensor, ReduceOp op) {
  check_contiguous("allreduce", "tensor", tensor);
  if (op == ReduceOp::Avg) check_flat_collective(impl_->who, /*gather=*/false, tensor, tensor, 1, op);
  const std::string desc = std::string("allreduce(") + dtype_name(tensor.dtype()) +
                           shape_str(tensor.shape()) + ", " + reduce_op_name(op) + ")" + where(tensor);
  auto fn = reduce_function(tensor.dtype(), op);
  auto context = impl_->context;
  const Millis timeout = impl_->timeout;
  Tensor t = tensor;  // keeps the storage alive until the collective ran
  ShmAllreduce* shm = impl_->shm.get();  // lives as long as the worker thread
  std::atomic<int64_t>* tcp_count = &impl_->tcp_allreduces;
  const int world = size_;
  return impl_->enqueue(desc, [t, op, world, fn, context, timeout, shm, tcp_count](uint32_t tag) mutable {
    const size_t n = static_cast<size_t>(t.numel());
    if (n == 0) return;
    Tensor h = stage(t);
    if (shm) {
      shm->allreduce(h.raw_data(), n, element_size(h.dtype()), fn, timeout);
    } else {
      // Element type only sets the element size Gloo splits the buffer by; fn does the math.
      switch (element_size(h.dtype())) {
        case 1: run_allreduce<uint8_t>(context, h.raw_data(), n, fn, tag, timeout); break;
        case 2: run_allreduce<uint16_t>(context, h.raw_data(), n, fn, tag, timeout); break;
        case 4: run_allreduce<uint32_t>(context, h.raw_data(), n, fn, tag, timeout); break;
        case 8: run_allreduce<uint64_t>(context, h.raw_data(), n, fn, tag, timeout); break;
        default: TANDEM_FAIL("allreduce: unsupported element size ", element_size(h.dtype()));
      }
      ++*tcp_count;
    }
    if (op == ReduceOp::Avg) divide_in_place(h.raw_data(), n, h.dtype(), world);
    unstage(t, h);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(Tensor& tensor, int root) {
  check_contiguous("broadcast", "tensor", tensor);
  TANDEM_CHECK(root >= 0 && root < size_, "ProcessGroupGloo::broadcast: root ", root, " outside [0, ", size_,
               ")");
  const std::string desc = std::string("broadcast(") + dtype_name(tensor.dtype()) +
                           shape_str(tensor.shape()) + ", root " + std::to_string(root) + ")" + where(tensor);
  auto context = impl_->context;
  const Millis timeout = impl_->timeout;
  Tensor t = tensor;
  ShmAllreduce* shm = impl_->shm.get();  // lives as long as the worker thread
  return impl_->enqueue(desc, [t, root, context, timeout, shm](uint32_t tag) mutable {
    if (t.nbytes() == 0) return;
    Tensor h = stage(t);
    if (shm) {
      shm->broadcast(h.raw_data(), h.nbytes(), root, timeout);
    } else {
      gloo::BroadcastOptions opts(context);
      opts.setOutput(static_cast<uint8_t*>(h.raw_data()), h.nbytes());
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::broadcast(opts);
    }
    unstage(t, h);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::allgather(std::vector<Tensor>& outputs, const Tensor& input) {
  check_contiguous("allgather", "input", input);
  TANDEM_CHECK(static_cast<int>(outputs.size()) == size_, "ProcessGroupGloo::allgather: ", outputs.size(),
               " output tensors given, expected one per rank (", size_, ")");
  for (size_t r = 0; r < outputs.size(); ++r) {
    const std::string what = "outputs[" + std::to_string(r) + "]";
    check_contiguous("allgather", what.c_str(), outputs[r]);
    TANDEM_CHECK(outputs[r].dtype() == input.dtype() && outputs[r].shape() == input.shape(),
                 "ProcessGroupGloo::allgather: ", what, " is ", outputs[r].str(), ", expected the input's ",
                 dtype_name(input.dtype()), shape_str(input.shape()));
  }
  const std::string desc = std::string("allgather(") + dtype_name(input.dtype()) + shape_str(input.shape()) +
                           " x " + std::to_string(size_) + ")" + where(input);
  auto context = impl_->context;
  const Millis timeout = impl_->timeout;
  const int world = size_;
  Tensor in = input;
  std::vector<Tensor> outs = outputs;
  ShmAllreduce* shm = impl_->shm.get();  // lives as long as the worker thread
  return impl_->enqueue(desc, [in, outs, world, context, timeout, shm](uint32_t tag) mutable {
    const size_t nbytes = in.nbytes();
    if (nbytes == 0) return;
    const Tensor h_in = stage(in);
    std::vector<Tensor> h_outs;
    for (auto& o : outs) h_outs.push_back(o.device().is_cpu() ? o : Tensor::empty(o.shape(), o.dtype()));
    if (shm) {
      std::vector<void*> out_ptrs;
      for (auto& o : h_outs) out_ptrs.push_back(o.raw_data());
      shm->allgather(h_in.raw_data(), out_ptrs, nbytes, timeout);
    } else {
      std::vector<uint8_t> flat(nbytes * world);
      gloo::AllgatherOptions opts(context);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(h_in.raw_data())), nbytes);
      opts.setOutput(flat.data(), flat.size());
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::allgather(opts);
      for (int r = 0; r < world; ++r) std::memcpy(h_outs[r].raw_data(), flat.data() + r * nbytes, nbytes);
    }
    for (int r = 0; r < world; ++r) unstage(outs[r], h_outs[r]);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::all_gather_into_tensor(Tensor& output, const Tensor& input) {
  check_flat_collective(impl_->who, /*gather=*/true, output, input, size_);
  const std::string desc = std::string("all_gather_into_tensor(") + dtype_name(input.dtype()) +
                           shape_str(input.shape()) + " x " + std::to_string(size_) + ")" + where(input);
  auto context = impl_->context;
  const Millis timeout = impl_->timeout;
  const int world = size_;
  Tensor in = input, out = output;
  ShmAllreduce* shm = impl_->shm.get();  // lives as long as the worker thread
  return impl_->enqueue(desc, [in, out, world, context, timeout, shm](uint32_t tag) mutable {
    const size_t nbytes = in.nbytes();
    if (nbytes == 0) return;
    const Tensor h_in = stage(in);
    Tensor h_out = out.device().is_cpu() ? out : Tensor::empty(out.shape(), out.dtype());
    auto* flat = static_cast<uint8_t*>(h_out.raw_data());
    if (shm) {
      std::vector<void*> out_ptrs;
      for (int r = 0; r < world; ++r) out_ptrs.push_back(flat + static_cast<size_t>(r) * nbytes);
      shm->allgather(h_in.raw_data(), out_ptrs, nbytes, timeout);
    } else {
      gloo::AllgatherOptions opts(context);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(h_in.raw_data())), nbytes);
      opts.setOutput(flat, nbytes * static_cast<size_t>(world));
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::allgather(opts);
    }
    unstage(out, h_out);
  });
}

// Over TCP: one all-to-all sends chunk j of the input to rank j (each rank sends and receives
// (size-1)/size of the input, as a ring reduce-scatter does), then the received chunks are reduced
// here in rank order. Through shared memory: ShmAllreduce::reduce_scatter.
std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op) {
  check_flat_collective(impl_->who, /*gather=*/false, output, input, size_, op);
  const std::string desc = std::string("reduce_scatter_tensor(") + dtype_name(input.dtype()) +
                           shape_str(input.shape()) + ", " + reduce_op_name(op) + ")" + where(input);
  auto fn = reduce_function(input.dtype(), op);
  auto context = impl_->context;
  const Millis timeout = impl_->timeout;
  const int world = size_;
  Tensor in = input, out = output;
  ShmAllreduce* shm = impl_->shm.get();  // lives as long as the worker thread
  return impl_->enqueue(desc, [in, out, op, world, fn, context, timeout, shm](uint32_t tag) mutable {
    const size_t n = static_cast<size_t>(out.numel()), elem = element_size(out.dtype());
    if (n == 0) return;
    const Tensor h_in = stage(in);
    Tensor h_out = out.device().is_cpu() ? out : Tensor::empty(out.shape(), out.dtype());
    const auto* src = static_cast<const uint8_t*>(h_in.raw_data());
    if (shm) {
      shm->reduce_scatter(src, h_out.raw_data(), n, elem, fn, timeout);
    } else if (world == 1) {
      std::memcpy(h_out.raw_data(), src, n * elem);
    } else {
      std::vector<uint8_t> received(n * elem * static_cast<size_t>(world));
      gloo::AlltoallOptions opts(context);
      opts.setInput(const_cast<uint8_t*>(src), received.size());
      opts.setOutput(received.data(), received.size());
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::alltoall(opts);
      reduce_in_rank_order(h_out.raw_data(), received.data(), n * elem, n, world, fn, elem);
    }
    if (op == ReduceOp::Avg) divide_in_place(h_out.raw_data(), n, h_out.dtype(), world);
    unstage(out, h_out);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::barrier() {
  auto context = impl_->context;
  const Millis timeout = impl_->timeout;
  return impl_->enqueue("barrier()", [context, timeout](uint32_t tag) {
    gloo::BarrierOptions opts(context);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
}

}  // namespace tandem::dist
