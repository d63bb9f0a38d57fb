// A small client of etcd's v3 API for tandem-run's etcd rendezvous, through the JSON gateway that
// every etcd 3.4 member serves on its client port (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values base64 in JSON bodies),
// over libcurl. The gateway rather than gRPC: Debian's etcd-server speaks both, but a gRPC client
// needs etcd's .proto files and their generated stubs, which no Debian package ships; the gateway
// needs only libcurl and nlohmann-json.
//
// Endpoints are the members ("host:port", several for a cluster). A call goes to the member that
// answered last and, when that one cannot answer (connection refused or cut, no leader, request timed
// out), to each other member in turn, each try bounded by the request timeout. When none answers it
// throws EtcdError naming every endpoint and the likely cause: no member reachable (is etcd running
// there? is --rdzv-endpoint right?), or members reachable that cannot commit (the cluster has lost
// its quorum). A lease that etcd no longer knows is EtcdError kind kLeaseLost. Calls on one client are
// serialised by a mutex; threads that must not wait on each other use their own clients.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::run {

struct EtcdError : std::runtime_error {
  enum class Kind { kUnreachable, kNoQuorum, kLeaseLost, kRefused };
  EtcdError(Kind k, const std::string& what) : std::runtime_error(what), kind(k) {}
  Kind kind;
};

struct EtcdValue {
  std::string value;
  int64_t mod_revision = 0;
};

// "host:port" -> "http://host:port"; throws std::invalid_argument naming the text when it is not that.
std::string etcd_url(const std::string& endpoint);
std::string base64_encode(const std::string& bytes);
std::string base64_decode(const std::string& text);  // throws std::invalid_argument on bad input

class EtcdClient {
 public:
  EtcdClient(std::vector<std::string> endpoints, double request_timeout_s);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  std::optional<EtcdValue> get(const std::string& key);
  // Every key that starts with `prefix`, in key order.
  std::vector<std::pair<std::string, EtcdValue>> get_prefix(const std::string& prefix);
  void put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Compare-and-swap: writes key=value only while the key's mod revision is `mod_revision` (0: only
  // while the key does not exist), in one transaction. Returns whether it wrote.
  bool put_if(const std::string& key, int64_t mod_revision, const std::string& value, int64_t lease = 0);
  int64_t grant_lease(int ttl_s);
  void keep_alive(int64_t lease);  // EtcdError kLeaseLost once etcd no longer knows the lease
  void revoke(int64_t lease);
  std::string endpoints() const;  // "http://a:2379,http://b:2379"

 private:
  nlohmann::json call(const std::string& path, const nlohmann::json& body);
  nlohmann::json post(const std::string& url, const std::string& body, std::string& failure, bool& answered);

  std::vector<std::string> urls_;
  size_t current_ = 0;
  long timeout_ms_;
  void* curl_ = nullptr;
  std::mutex mu_;
};

}  // namespace tandem::run
