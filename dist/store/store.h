// Key-value stores for rendezvous: every rank of a job meets in one store to
// exchange addresses, the NCCL unique id, and small agreements (bucket order,
// model fingerprints). All blocking calls wait at most timeout() and then throw
// tandem::Error naming the key(s) and the store's address; nothing waits
// forever. Values are bytes; keys are strings. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::dist {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

inline constexpr Millis kDefaultStoreTimeout = std::chrono::seconds(300);

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits (up to timeout()) for the key to exist, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds delta to the integer stored at key (created as 0) and returns the result.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists; never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists, or throws after `timeout` naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // Removes the key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Where this store lives, for error messages ("tcp://127.0.0.1:29500", "file:///tmp/x").
  virtual std::string address() const = 0;

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis timeout) { timeout_ = timeout; }

  // Conveniences over set/get.
  void set_string(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  Millis timeout_ = kDefaultStoreTimeout;
};

}  // namespace tandem::dist
