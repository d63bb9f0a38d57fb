// FileStore: a rendezvous store kept in one file on a filesystem every rank can
// see (a node-local /tmp for one machine, a shared filesystem for several; the
// filesystem must honour flock(2) across the processes that share it).
//
// Format: an append-only log of records (SET key value | DELETE key); the
// current state is the log replayed. Every read-modify-write (add) and every
// append holds an exclusive flock on the file for its whole duration; reads hold
// a shared flock. Each instance caches the replayed state and the log offset it
// has read up to, so a poll reads only the new tail. A record cut short by a
// crashed writer is ignored until it is complete (it never is: the next writer
// appends after it, and readers stop at the cut record, so a crashed writer
// leaves the store unusable; rendezvous is restarted with a fresh file).
//
// Integers written by add() are stored as decimal text (as PyTorch's stores do),
// so get() of a counter returns e.g. "3".
//
// Cleanup: when world_size > 0, every instance counts itself out in its
// destructor and the last of world_size instances removes the file. With
// world_size <= 0 the file is left for the caller to remove.
//
// Thread-safe: one mutex per instance serialises its callers; flock serialises
// processes. wait()/get() poll with a short sleep (1 ms growing to 10 ms) up to
// the timeout, then throw tandem::Error naming the missing key(s) and the file.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>

#include "dist/store/store.h"

namespace tandem::dist {

class FileStore : public Store {
 public:
  // Opens (creating if needed) the store file at `path`.
  explicit FileStore(std::string path, int world_size = -1, Millis timeout = kDefaultStoreTimeout);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool delete_key(const std::string& key) override;
  std::string address() const override { return "file://" + path_; }

  const std::string& path() const { return path_; }

 private:
  // Both require mu_ held and the flock held (shared at least).
  void refresh_locked();
  void append_locked(uint8_t op, const std::string& key, const Bytes& value);
  int64_t add_locked(const std::string& key, int64_t delta);
  // Returns the first missing key, or nullptr when all exist (requires mu_ and refreshed state).
  const std::string* first_missing(const std::vector<std::string>& keys) const;

  std::string path_;
  int world_size_;
  int fd_ = -1;
  std::mutex mu_;
  std::unordered_map<std::string, Bytes> state_;
  uint64_t offset_ = 0;  // bytes of the log already replayed into state_
};

}  // namespace tandem::dist
