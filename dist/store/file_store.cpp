// FileStore: append-only log under flock; see file_store.h for the format and
// guarantees. Records are [u8 op][u32 key length][u64 value length][key][value],
// little-endian; op 1 = SET, 2 = DELETE (value empty).
#include "dist/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace tandem::dist {
namespace {

constexpr uint8_t kOpSet = 1;
constexpr uint8_t kOpDelete = 2;
constexpr size_t kHeaderBytes = 1 + 4 + 8;
// Sanity bounds: a record beyond these means the file is not a store log.
constexpr uint64_t kMaxKeyBytes = 1u << 20;
constexpr uint64_t kMaxValueBytes = uint64_t{1} << 32;
const char* const kExitedKey = "__tandem_filestore_exited__";

std::string errno_str(int err) { return std::strerror(err); }

void put_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  return s;
}

// Holds flock(fd) for its lifetime (retrying EINTR).
class FlockGuard {
 public:
  FlockGuard(int fd, int op, const std::string& path) : fd_(fd) {
    int rc;
    do rc = ::flock(fd_, op);
    while (rc != 0 && errno == EINTR);
    TANDEM_CHECK(rc == 0, "FileStore file://", path, ": flock failed: ", errno_str(errno));
  }
  ~FlockGuard() { ::flock(fd_, LOCK_UN); }
  FlockGuard(const FlockGuard&) = delete;
  FlockGuard& operator=(const FlockGuard&) = delete;

 private:
  int fd_;
};

int64_t parse_counter(const Bytes& v, const std::string& key, const std::string& addr) {
  int64_t x = 0;
  const char* b = reinterpret_cast<const char*>(v.data());
  auto [ptr, ec] = std::from_chars(b, b + v.size(), x);
  TANDEM_CHECK(ec == std::errc() && ptr == b + v.size() && !v.empty(), "FileStore ", addr,
               ": add() on key '", key, "' whose value is not a decimal integer (", v.size(),
               " bytes); add() only works on keys created by add() or set to decimal text");
  return x;
}

}  // namespace

FileStore::FileStore(std::string path, int world_size, Millis timeout)
    : path_(std::move(path)), world_size_(world_size) {
  TANDEM_CHECK(!path_.empty(), "FileStore: empty path; expected a file on a filesystem all ranks share");
  timeout_ = timeout;
  do fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  while (fd_ < 0 && errno == EINTR);
  TANDEM_CHECK(fd_ >= 0, "FileStore: cannot open or create ", address(), ": ", errno_str(errno),
               " (expected a writable path on a filesystem every rank shares)");
}

FileStore::~FileStore() {
  if (fd_ < 0) return;
  if (world_size_ > 0) {
    try {
      std::lock_guard<std::mutex> lk(mu_);
      FlockGuard fl(fd_, LOCK_EX, path_);
      refresh_locked();
      if (add_locked(kExitedKey, 1) >= world_size_) ::unlink(path_.c_str());
    } catch (...) {
      // A destructor must not throw; the file is merely left behind.
    }
  }
  ::close(fd_);
}

void FileStore::refresh_locked() {
  struct stat st;
  TANDEM_CHECK(::fstat(fd_, &st) == 0, "FileStore ", address(), ": fstat failed: ", errno_str(errno));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < offset_) {  // truncated or replaced under us: replay from the start
    state_.clear();
    offset_ = 0;
  }
  if (size == offset_) return;
  Bytes buf(size - offset_);
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::pread(fd_, buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n >= 0, "FileStore ", address(), ": read failed: ", errno_str(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  size_t pos = 0;
  while (got - pos >= kHeaderBytes) {
    const uint8_t* h = buf.data() + pos;
    uint8_t op = h[0];
    uint64_t klen = get_le(h + 1, 4), vlen = get_le(h + 5, 8);
    TANDEM_CHECK((op == kOpSet || op == kOpDelete) && klen <= kMaxKeyBytes && vlen <= kMaxValueBytes,
                 "FileStore ", address(), ": corrupt record at byte ", offset_ + pos,
                 " (op ", int(op), ", key ", klen, " B, value ", vlen, " B); is this file a Tandem store?");
    if (got - pos - kHeaderBytes < klen + vlen) break;  // incomplete record: a writer is mid-append
    std::string key(reinterpret_cast<const char*>(h + kHeaderBytes), klen);
    if (op == kOpSet)
      state_[key] = Bytes(h + kHeaderBytes + klen, h + kHeaderBytes + klen + vlen);
    else
      state_.erase(key);
    pos += kHeaderBytes + klen + vlen;
  }
  offset_ += pos;
}

void FileStore::append_locked(uint8_t op, const std::string& key, const Bytes& value) {
  TANDEM_CHECK(key.size() <= kMaxKeyBytes, "FileStore ", address(), ": key of ", key.size(),
               " bytes exceeds the limit of ", kMaxKeyBytes);
  TANDEM_CHECK(value.size() <= kMaxValueBytes, "FileStore ", address(), ": value of ", value.size(),
               " bytes for key '", key, "' exceeds the limit of ", kMaxValueBytes);
  Bytes rec(kHeaderBytes + key.size() + value.size());
  rec[0] = op;
  put_le(rec.data() + 1, key.size(), 4);
  put_le(rec.data() + 5, value.size(), 8);
  std::memcpy(rec.data() + kHeaderBytes, key.data(), key.size());
  if (!value.empty()) std::memcpy(rec.data() + kHeaderBytes + key.size(), value.data(), value.size());
  struct stat st;
  TANDEM_CHECK(::fstat(fd_, &st) == 0, "FileStore ", address(), ": fstat failed: ", errno_str(errno));
  off_t at = st.st_size;
  size_t done = 0;
  while (done < rec.size()) {
    ssize_t n = ::pwrite(fd_, rec.data() + done, rec.size() - done, at + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, "FileStore ", address(), ": write failed: ", errno_str(errno));
    done += static_cast<size_t>(n);
  }
  refresh_locked();
}

int64_t FileStore::add_locked(const std::string& key, int64_t delta) {
  int64_t v = delta;
  if (auto it = state_.find(key); it != state_.end()) v += parse_counter(it->second, key, address());
  std::string s = std::to_string(v);
  append_locked(kOpSet, key, Bytes(s.begin(), s.end()));
  return v;
}

const std::string* FileStore::first_missing(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!state_.count(k)) return &k;
  return nullptr;
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lk(mu_);
  FlockGuard fl(fd_, LOCK_EX, path_);
  refresh_locked();
  append_locked(kOpSet, key, value);
}

Bytes FileStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lk(mu_);
  FlockGuard fl(fd_, LOCK_SH, path_);
  refresh_locked();
  auto it = state_.find(key);
  TANDEM_CHECK(it != state_.end(), "FileStore ", address(), ": key '", key,
               "' was deleted between wait() and get()");
  return it->second;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lk(mu_);
  FlockGuard fl(fd_, LOCK_EX, path_);
  refresh_locked();
  return add_locked(key, delta);
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lk(mu_);
  FlockGuard fl(fd_, LOCK_SH, path_);
  refresh_locked();
  return first_missing(keys) == nullptr;
}

void FileStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto nap = std::chrono::microseconds(1000);
  for (;;) {
    std::vector<std::string> missing;
    {
      std::lock_guard<std::mutex> lk(mu_);
      FlockGuard fl(fd_, LOCK_SH, path_);
      refresh_locked();
      for (const auto& k : keys)
        if (!state_.count(k)) missing.push_back(k);
    }
    if (missing.empty()) return;
    auto now = std::chrono::steady_clock::now();
    TANDEM_CHECK(now < deadline, "FileStore ", address(), ": timed out after ", timeout.count(),
                 " ms waiting for key(s) ", join_keys(missing),
                 "; did every rank start and use the same store file?");
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(10000));
  }
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  FlockGuard fl(fd_, LOCK_EX, path_);
  refresh_locked();
  if (!state_.count(key)) return false;
  append_locked(kOpDelete, key, {});
  return true;
}

}  // namespace tandem::dist
