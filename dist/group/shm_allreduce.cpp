// ShmAllreduce (see shm_allreduce.h for the contract).
#include "dist/group/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace tandem::dist {
namespace {

using Clock = std::chrono::steady_clock;

// One rank's line of the control block.
struct alignas(64) RankControl {
  std::atomic<uint32_t> arrived;   // barriers this rank has reached
  std::atomic<uint32_t> sleepers;  // ranks in futex_wait on `arrived`
  std::atomic<int32_t> pid;
  // The call this rank is in: its kind, which buffer (-1: none) and where (a broadcast: the
  // root), and the element count and size.
  std::atomic<int32_t> kind;
  std::atomic<int32_t> buffer;
  std::atomic<int64_t> offset;
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> elem_size;
};
static_assert(sizeof(RankControl) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

constexpr size_t kPage = 4096;
constexpr size_t kSmallBytes = 64 * 1024;  // chunks up to this are reduced whole by every rank
constexpr size_t kInPlaceBlockBytes = 64 * 1024;  // summed, then copied to every buffer, while in L2
// RankControl::kind: the collective a rank is in.
constexpr int32_t kAllreduce = 0, kBroadcast = 1, kAllgather = 2, kReduceScatter = 3;

const char* kind_name(int32_t kind) {
  return kind == kBroadcast        ? "a broadcast"
         : kind == kAllgather     ? "an all-gather"
         : kind == kReduceScatter ? "a reduce-scatter"
                                  : "an all-reduce";
}
constexpr int kSpins = 2000;               // pause loops before sleeping on the futex
constexpr Millis kSlice{50};               // futex sleep between liveness checks

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

int futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, Millis slice) {
  timespec ts{static_cast<time_t>(slice.count() / 1000), static_cast<long>(slice.count() % 1000) * 1000000L};
  return static_cast<int>(syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts,
                                  nullptr, 0));
}

void futex_wake_all(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// True once `pid` is gone or a zombie (killed, not yet reaped by its launcher).
bool process_gone(int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string ns_id(const char* kind) {
  char buf[256] = {0};
  const std::string path = std::string("/proc/self/ns/") + kind;
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
}

// What two ranks must share to use one segment: the boot (same machine) and the namespaces
// that decide which /dev/shm, which pids and which network they see. Ranks in separate network
// namespaces are treated as separate hosts (their network, not memory, is what a job tests).
std::string host_identity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + "|" + read_first_line("/proc/sys/kernel/random/boot_id") + "|" + ns_id("mnt") +
         "|" + ns_id("ipc") + "|" + ns_id("net") + "|" + ns_id("pid");
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string unique_segment_name() {
  std::random_device rd;
  return "/tandem-" + std::to_string(getpid()) + "-" + std::to_string(rd()) + std::to_string(rd());
}

// Maps segment `name` of `bytes` (creating and reserving it when `create`); "" or the error.
std::string map_segment(const std::string& name, size_t bytes, bool create, bool writable, void** out) {
  *out = nullptr;
  const int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return errno_text(("shm_open(" + name + ")").c_str());
  std::string error;
  if (create) {
    // posix_fallocate reserves the pages now: a full /dev/shm fails here, not as SIGBUS later.
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) error = "reserving " + std::to_string(bytes) + " bytes in /dev/shm: " + std::strerror(rc);
  } else {
    struct stat st{};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes)
      error = "segment " + name + " has " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes);
  }
  if (error.empty()) {
    void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) error = errno_text("mmap");
    else *out = p;
  }
  close(fd);
  if (create && !error.empty()) shm_unlink(name.c_str());
  return error;
}

// Publishes this rank's outcome of a set-up step ("" = ok) under `prefix` + rank, waits (bounded
// by `timeout`) for every rank's, runs `after_wait` either way (unlinking a name no rank needs any
// more), and returns the first rank whose step failed with its reason, or -1 when all succeeded.
// Every rank reads the same answers, so every rank takes the same decision.
std::pair<int, std::string> first_failure(Store& store, const std::string& prefix, int rank, int size,
                                          const std::string& mine, Millis timeout,
                                          const std::function<void()>& after_wait) {
  store.set_string(prefix + std::to_string(rank), mine.empty() ? "ok" : mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (...) {
    after_wait();
    throw;
  }
  after_wait();
  for (int r = 0; r < size; ++r) {
    const std::string state = store.get_string(keys[static_cast<size_t>(r)]);
    if (state != "ok") return {r, state};
  }
  return {-1, ""};
}

}  // namespace

// The buffers made by allocate(): per buffer, its mapped size and where each rank's copy is
// mapped here ([rank_] is this rank's own). Shared with the buffers' release functions, which
// may run on any thread and after the ShmAllreduce is gone.
struct ShmAllreduce::Registry {
  struct Entry {
    int id;
    size_t bytes;
    std::vector<unsigned char*> base;
  };
  std::mutex mu;
  std::vector<Entry> entries;

  static void unmap(const std::vector<unsigned char*>& base, size_t bytes) {
    for (unsigned char* b : base)
      if (b) munmap(b, bytes);
  }
};

std::unique_ptr<ShmAllreduce> ShmAllreduce::create(Store& store, const std::string& prefix, int rank, int size,
                                                   Millis timeout, std::string& why_not) {
  why_not.clear();
  if (size < 2) {
    why_not = "one rank";
    return nullptr;
  }
  const char* env = std::getenv("TANDEM_SHM");
  const bool enabled = !(env && std::string(env) == "0");
  const std::string key = prefix + "shm/";
  store.set_string(key + "host/" + std::to_string(rank), enabled ? host_identity() : std::string("disabled"));
  std::vector<std::string> hosts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) hosts[static_cast<size_t>(r)] = store.get_string(key + "host/" + std::to_string(r));
  for (int r = 0; r < size; ++r) {
    if (hosts[static_cast<size_t>(r)] == "disabled") {
      why_not = "TANDEM_SHM=0 on rank " + std::to_string(r);
      return nullptr;
    }
    if (hosts[static_cast<size_t>(r)] != hosts[0]) {
      why_not = "rank " + std::to_string(r) + " is not on rank 0's host (or not in its namespaces)";
      return nullptr;
    }
  }

  std::unique_ptr<ShmAllreduce> self(new ShmAllreduce());
  self->rank_ = rank;
  self->size_ = size;
  self->prefix_ = key;
  self->registry_ = std::make_shared<Registry>();
  // Two sets of `size` slots: 4 MiB slots for a few ranks, smaller ones for many (at most
  // 64 MiB in all), never below 256 KiB.
  size_t slot = std::clamp<size_t>((size_t{64} << 20) / (2 * static_cast<size_t>(size)), size_t{256} << 10,
                                   size_t{4} << 20);
  if (const char* kb = std::getenv("TANDEM_SHM_SLOT_KB")) {
    const long v = std::strtol(kb, nullptr, 10);
    TANDEM_CHECK(v >= 64 && v <= (1L << 20), "TANDEM_SHM_SLOT_KB must be in [64, 1048576], got '", kb, "'");
    slot = static_cast<size_t>(v) << 10;
  }
  self->slot_bytes_ = round_up(slot, kPage);
  const size_t control = round_up(sizeof(RankControl) * static_cast<size_t>(size), kPage);
  self->segment_bytes_ = control + 2 * static_cast<size_t>(size) * self->slot_bytes_;

  // Rank 0 makes and names the segment; the name lives only until every rank has attached.
  std::string name, error;
  if (rank == 0) {
    name = unique_segment_name();
    error = map_segment(name, self->segment_bytes_, true, true, &self->base_);
    store.set_string(key + "name", error.empty() ? name : "!" + error);
  } else {
    name = store.get_string(key + "name");
    if (!name.empty() && name[0] == '!') {
      why_not = "rank 0 could not make the segment: " + name.substr(1);
      return nullptr;
    }
    error = map_segment(name, self->segment_bytes_, false, true, &self->base_);
  }
  if (rank == 0 && !error.empty()) {
    why_not = "rank 0 could not make the segment: " + error;
    return nullptr;
  }
  auto* ctl = static_cast<RankControl*>(self->base_);
  if (self->base_) ctl[rank].pid.store(static_cast<int32_t>(getpid()));
  const auto [failed, reason] = first_failure(store, key + "attached/", rank, size, error, timeout, [&] {
    if (rank == 0) shm_unlink(name.c_str());
  });
  if (failed >= 0) {
    why_not = "rank " + std::to_string(failed) + " could not attach the segment: " + reason;
    return nullptr;  // the destructor unmaps
  }
  return self;
}

ShmAllreduce::~ShmAllreduce() {
  if (base_) munmap(base_, segment_bytes_);
}

unsigned char* ShmAllreduce::slot(int set, int rank) const {
  const size_t control = round_up(sizeof(RankControl) * static_cast<size_t>(size_), kPage);
  return static_cast<unsigned char*>(base_) + control +
         (static_cast<size_t>(set) * static_cast<size_t>(size_) + static_cast<size_t>(rank)) * slot_bytes_;
}

void ShmAllreduce::barrier(Clock::time_point deadline, Millis timeout) {
  auto* ctl = static_cast<RankControl*>(base_);
  const uint32_t target = ++seq_;
  ctl[rank_].arrived.store(target, std::memory_order_seq_cst);
  if (ctl[rank_].sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&ctl[rank_].arrived);
  // Counters only grow (modulo 2^32): a peer has arrived when its count is not behind target.
  auto arrived = [&](int q) {
    return static_cast<int32_t>(ctl[q].arrived.load(std::memory_order_acquire) - target) >= 0;
  };
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    for (int i = 0; i < kSpins && !arrived(q); ++i) cpu_relax();
    while (!arrived(q)) {
      const auto now = Clock::now();
      const int32_t pid = ctl[q].pid.load();
      if (now >= deadline) {
        TANDEM_FAIL("Timed out waiting ", timeout.count(), "ms for rank ", q, " (pid ", pid,
                    ") in the shared-memory all-reduce (it is slower, stopped or stuck)");
      }
      if (process_gone(pid)) {
        TANDEM_FAIL("rank ", q, " (pid ", pid, ") exited during the shared-memory all-reduce");
      }
      const auto left = std::chrono::duration_cast<Millis>(deadline - now) + Millis(1);
      ctl[q].sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = ctl[q].arrived.load(std::memory_order_seq_cst);
      if (static_cast<int32_t>(seen - target) < 0) futex_wait(&ctl[q].arrived, seen, std::min(left, kSlice));
      ctl[q].sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
}

ShmAllreduce::Buffer ShmAllreduce::allocate(Store& store, size_t bytes, Millis timeout) {
  const std::string key = prefix_ + "buffer/" + std::to_string(buffers_made_++) + "/";
  const size_t mapped = round_up(std::max<size_t>(bytes, 1), kPage);
  std::vector<unsigned char*> base(static_cast<size_t>(size_), nullptr);
  auto at = [&](int r) -> void** { return reinterpret_cast<void**>(&base[static_cast<size_t>(r)]); };
  // Each rank makes its own segment (named only until every peer has mapped it) and maps the others'.
  const std::string name = unique_segment_name();
  std::string error = map_segment(name, mapped, true, true, at(rank_));
  store.set_string(key + "name/" + std::to_string(rank_), error.empty() ? name : "!" + error);
  for (int q = 0; q < size_ && error.empty(); ++q) {
    if (q == rank_) continue;
    const std::string theirs = store.get_string(key + "name/" + std::to_string(q));
    if (!theirs.empty() && theirs[0] == '!') error = "rank " + std::to_string(q) + ": " + theirs.substr(1);
    else error = map_segment(theirs, mapped, false, true, at(q));  // peers' sums of their parts land here
  }
  int failed = -1;
  try {
    failed = first_failure(store, key + "mapped/", rank_, size_, error, timeout, [&] {
               if (base[static_cast<size_t>(rank_)]) shm_unlink(name.c_str());
             }).first;
  } catch (...) {
    Registry::unmap(base, mapped);
    throw;
  }
  if (failed >= 0) {
    Registry::unmap(base, mapped);
    return {};
  }
  const int id = buffers_made_;
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->entries.push_back({id, mapped, base});
  }
  Buffer out;
  out.data = base[static_cast<size_t>(rank_)];
  out.release = [registry = registry_, id] {
    std::lock_guard<std::mutex> lock(registry->mu);
    auto& e = registry->entries;
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it->id != id) continue;
      Registry::unmap(it->base, it->bytes);
      e.erase(it);
      return;
    }
  };
  return out;
}

std::vector<unsigned char*> ShmAllreduce::locate(const void* data, size_t nbytes, int32_t& buffer,
                                                 int64_t& offset) const {
  const auto* bytes = static_cast<const unsigned char*>(data);
  buffer = -1;
  offset = -1;
  std::vector<unsigned char*> copies;
  std::lock_guard<std::mutex> lock(registry_->mu);
  for (const auto& e : registry_->entries) {
    const unsigned char* mine = e.base[static_cast<size_t>(rank_)];
    if (bytes < mine || bytes + nbytes > mine + e.bytes) continue;
    buffer = e.id;
    offset = bytes - mine;
    for (unsigned char* b : e.base) copies.push_back(b + offset);
    break;
  }
  return copies;
}

void ShmAllreduce::allreduce(void* data, size_t count, size_t elem_size, const ReduceFn& fn, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  auto* bytes = static_cast<unsigned char*>(data);
  const size_t nbytes = count * elem_size;
  // Is the tensor inside one of the shared buffers? Then the peers' data lies at the same offset
  // of their copies, if they pass the same range.
  int32_t buffer = -1;
  int64_t offset = -1;
  const std::vector<unsigned char*> copies = locate(bytes, nbytes, buffer, offset);
  const bool same_place = agree(kAllreduce, buffer, offset, count, elem_size, deadline, timeout);
  if (same_place && buffer >= 0 && nbytes > kSmallBytes) {
    reduce_in_place(copies, count, elem_size, fn, deadline, timeout);
    ++in_place_calls_;
  } else {
    reduce_through_slots(bytes, count, elem_size, fn, deadline, timeout);
    ++slot_calls_;
  }
}

bool ShmAllreduce::agree(int32_t kind, int32_t buffer, int64_t offset, size_t count, size_t elem_size,
                         Clock::time_point deadline, Millis timeout) {
  auto* ctl = static_cast<RankControl*>(base_);
  ctl[rank_].kind.store(kind);
  ctl[rank_].buffer.store(buffer);
  ctl[rank_].offset.store(offset);
  ctl[rank_].count.store(count);
  ctl[rank_].elem_size.store(elem_size);
  barrier(deadline, timeout);
  // Nobody publishes again before the next barrier, which needs this rank: the values read here
  // are this call's on every rank.
  bool same = true;
  for (int q = 0; q < size_; ++q) {
    const int32_t k = ctl[q].kind.load(), b = ctl[q].buffer.load();
    const int64_t o = ctl[q].offset.load();
    if (k != kind)
      TANDEM_FAIL("the ranks disagree on the collective: rank ", q, " is in ", kind_name(k), ", rank ", rank_,
                  " in ", kind_name(kind));
    if (kind == kBroadcast && o != offset)
      TANDEM_FAIL("the ranks disagree on the broadcast's root: rank ", q, " names ", o, ", rank ", rank_,
                  " names ", offset);
    const uint64_t c = ctl[q].count.load(), e = ctl[q].elem_size.load();
    if (c != count || e != elem_size)
      TANDEM_FAIL("the ranks passed different tensors: rank ", q, " has ", c, " elements of ", e,
                  " bytes, rank ", rank_, " has ", count, " of ", elem_size);
    same = same && b == buffer && o == offset;
  }
  return same;
}

void ShmAllreduce::broadcast(void* data, size_t nbytes, int root, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  agree(kBroadcast, -1, root, nbytes, 1, deadline, timeout);  // the root published as the offset
  auto* bytes = static_cast<unsigned char*>(data);
  for (size_t off = 0; off < nbytes; off += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, nbytes - off);
    const int set = set_;
    set_ ^= 1;
    // Root's slot of this set is read by the others until they reach the next chunk's (or the
    // next call's) first barrier; root writes it again only two chunks later, past that barrier.
    if (rank_ == root) std::memcpy(slot(set, root), bytes + off, n);
    barrier(deadline, timeout);
    if (rank_ != root) std::memcpy(bytes + off, slot(set, root), n);
  }
}

void ShmAllreduce::allgather(const void* input, const std::vector<void*>& outputs, size_t nbytes,
                             Millis timeout) {
  TANDEM_CHECK(static_cast<int>(outputs.size()) == size_, "allgather: ", outputs.size(), " outputs for ", size_,
               " ranks");
  const auto deadline = Clock::now() + timeout;
  agree(kAllgather, -1, 0, nbytes, 1, deadline, timeout);
  const auto* in = static_cast<const unsigned char*>(input);
  for (size_t off = 0; off < nbytes; off += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, nbytes - off);
    const int set = set_;
    set_ ^= 1;
    // As broadcast: a set is written again only past the next chunk's (or call's) first barrier,
    // which every rank reaches after it has read this one.
    std::memcpy(slot(set, rank_), in + off, n);
    barrier(deadline, timeout);
    for (int q = 0; q < size_; ++q) {
      auto* out = static_cast<unsigned char*>(outputs[static_cast<size_t>(q)]) + off;
      const unsigned char* from = q == rank_ ? in + off : slot(set, q);
      if (out != from) std::memcpy(out, from, n);  // an output may be the input itself
    }
  }
}

void ShmAllreduce::reduce_scatter(const void* input, void* output, size_t count, size_t elem_size,
                                  const ReduceFn& fn, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto* in = static_cast<const unsigned char*>(input);
  auto* out = static_cast<unsigned char*>(output);
  const size_t ranks = static_cast<size_t>(size_), part_bytes = count * elem_size;
  // In place when every rank's input lies at the same offset of a shared buffer and the output
  // overlaps the input nowhere but (exactly) this rank's own part, which no peer reads.
  int32_t buffer = -1;
  int64_t offset = -1;
  std::vector<unsigned char*> copies = locate(in, ranks * part_bytes, buffer, offset);
  const bool apart = out + part_bytes <= in || out >= in + ranks * part_bytes;
  if (!apart && out != in + static_cast<size_t>(rank_) * part_bytes) buffer = -1, copies.clear();
  const bool same_place = agree(kReduceScatter, buffer, offset, count, elem_size, deadline, timeout);
  if (same_place && buffer >= 0 && ranks * part_bytes > kSmallBytes) {
    reduce_scatter_in_place(copies, out, count, elem_size, fn, deadline, timeout);
    ++rs_in_place_calls_;
    return;
  }
  ++rs_slot_calls_;
  const size_t chunk = std::max<size_t>(1, slot_bytes_ / (ranks * elem_size));  // elements per rank per chunk
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off), nbytes = n * elem_size;
    const int set = set_;
    set_ ^= 1;
    // Slot layout: part q (for rank q) at q * nbytes. As allgather: a set is written again only
    // past the next chunk's (or call's) first barrier, which every rank reaches after reading it.
    unsigned char* mine = slot(set, rank_);
    for (size_t q = 0; q < ranks; ++q) std::memcpy(mine + q * nbytes, in + (q * count + off) * elem_size, nbytes);
    barrier(deadline, timeout);
    const size_t at = static_cast<size_t>(rank_) * nbytes;
    unsigned char* dst = out + off * elem_size;
    fn(dst, slot(set, 0) + at, slot(set, 1) + at, n);
    for (int q = 2; q < size_; ++q) fn(dst, dst, slot(set, q) + at, n);
  }
}

void ShmAllreduce::reduce_scatter_in_place(const std::vector<unsigned char*>& copies, unsigned char* out,
                                           size_t count, size_t elem_size, const ReduceFn& fn,
                                           Clock::time_point deadline, Millis timeout) {
  // Every rank's input is ready (agree's barrier). This rank alone reads part rank_ of the copies;
  // it folds them in rank order (the slot path's order, so the same bits) block by block into its
  // output. An output that is this rank's own part of its input is operand rank_ of the fold: from
  // rank 2 on it would be overwritten before it is read, so there the sum goes through a scratch block.
  const size_t part = static_cast<size_t>(rank_) * count * elem_size;
  const bool aliased = out == copies[static_cast<size_t>(rank_)] + part && rank_ >= 2;
  const size_t block = std::max<size_t>(1, kInPlaceBlockBytes / elem_size);
  std::vector<unsigned char> scratch(aliased ? block * elem_size : 0);
  for (size_t b = 0; b < count; b += block) {
    const size_t at = part + b * elem_size, n = std::min(block, count - b);
    unsigned char* dst = aliased ? scratch.data() : out + b * elem_size;
    fn(dst, copies[0] + at, copies[1] + at, n);
    for (int q = 2; q < size_; ++q) fn(dst, dst, copies[static_cast<size_t>(q)] + at, n);
    if (aliased) std::memcpy(out + b * elem_size, dst, n * elem_size);
  }
  barrier(deadline, timeout);  // no peer reads this rank's input any more
}

namespace {

// How `n` elements split into one part per rank: rank r owns [lo(r), hi(r)). Parts are whole cache
// lines (of 4-byte elements) where n allows; the last ones may be short or empty.
struct Parts {
  size_t n, part;
  Parts(size_t count, size_t elem_size, int ranks)
      : n(count),
        part(round_up((count + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks),
                      std::max<size_t>(1, 64 / elem_size))) {}
  size_t lo(int r) const { return std::min(n, static_cast<size_t>(r) * part); }
  size_t hi(int r) const { return std::min(n, static_cast<size_t>(r + 1) * part); }
};

}  // namespace

void ShmAllreduce::reduce_in_place(const std::vector<unsigned char*>& copies, size_t count, size_t elem_size,
                                   const ReduceFn& fn, Clock::time_point deadline, Millis timeout) {
  const Parts parts(count, elem_size, size_);
  const size_t lo = parts.lo(rank_), hi = parts.hi(rank_);
  // Every rank owns one part of every buffer: it alone reads or writes that range anywhere until
  // the barrier. It sums its part block by block in rank order (as the slot path does), into
  // rank 0's copy, whose values are used first, then writes the sum into every other copy while
  // the block is still in cache. One rank computes each part, so every rank ends with the same
  // bits; the barrier says every part is everywhere.
  const size_t block = std::max<size_t>(1, kInPlaceBlockBytes / elem_size);
  for (size_t b = lo; b < hi; b += block) {
    const size_t at = b * elem_size, n = std::min(block, hi - b);
    unsigned char* sum = copies[0] + at;
    for (int q = 1; q < size_; ++q) fn(sum, sum, copies[static_cast<size_t>(q)] + at, n);
    for (int q = 1; q < size_; ++q) std::memcpy(copies[static_cast<size_t>(q)] + at, sum, n * elem_size);
  }
  barrier(deadline, timeout);
}

void ShmAllreduce::reduce_through_slots(unsigned char* bytes, size_t count, size_t elem_size, const ReduceFn& fn,
                                        Clock::time_point deadline, Millis timeout) {
  const size_t chunk_elems = slot_bytes_ / elem_size;
  for (size_t off = 0; off < count; off += chunk_elems) {
    const size_t n = std::min(chunk_elems, count - off);
    const size_t nbytes = n * elem_size;
    unsigned char* mine = bytes + off * elem_size;
    const int set = set_;
    set_ ^= 1;
    std::memcpy(slot(set, rank_), mine, nbytes);
    barrier(deadline, timeout);
    if (nbytes <= kSmallBytes) {
      // Every rank reduces the whole chunk, in rank order: the same bits everywhere.
      fn(mine, slot(set, 0), slot(set, 1), n);
      for (int q = 2; q < size_; ++q) fn(mine, mine, slot(set, q), n);
      continue;
    }
    const Parts parts(n, elem_size, size_);
    const size_t lo = parts.lo(rank_), hi = parts.hi(rank_);
    if (hi > lo) {
      // Only this rank reads or writes this range of any slot until the next barrier. The sum
      // goes into this rank's tensor (its own slot is still an operand), then to its slot.
      const size_t at = lo * elem_size, len = hi - lo;
      fn(mine + at, slot(set, 0) + at, slot(set, 1) + at, len);
      for (int q = 2; q < size_; ++q) fn(mine + at, mine + at, slot(set, q) + at, len);
      std::memcpy(slot(set, rank_) + at, mine + at, len * elem_size);
    }
    barrier(deadline, timeout);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || parts.hi(q) <= parts.lo(q)) continue;
      const size_t at = parts.lo(q) * elem_size;
      std::memcpy(mine + at, slot(set, q) + at, (parts.hi(q) - parts.lo(q)) * elem_size);
    }
  }
}

}  // namespace tandem::dist
