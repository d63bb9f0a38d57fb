// etcd's v3 JSON gateway over libcurl (see etcd_client.h).
#include "etcd_client.h"

#include <curl/curl.h>
#include <dlfcn.h>

#include <type_traits>

#include <array>

namespace tandem::run {
namespace {

using Json = nlohmann::json;
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// The key just after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

int64_t number(const Json& j, const char* key) {  // the gateway writes int64 as strings, omits zeros
  if (!j.contains(key)) return 0;
  const Json& v = j.at(key);
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

EtcdValue value_of(const Json& kv) {
  return {base64_decode(kv.value("value", std::string())), number(kv, "mod_revision")};
}

// A gateway error that another member may not have: no leader, a request that timed out inside etcd.
bool transient(const std::string& message, int64_t code) {
  return code == 14 || code == 4 || message.find("timed out") != std::string::npos ||
         message.find("no leader") != std::string::npos || message.find("deadline") != std::string::npos ||
         message.find("leader changed") != std::string::npos;
}

// The message of a gateway error: {"error": "...", "message": "..."}, or {"error": {"message": ...}} on a
// streamed call.
std::string error_message(const Json& j, const std::string& fallback) {
  if (!j.is_object()) return fallback;
  if (j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  if (!j.contains("error")) return fallback;
  const Json& e = j["error"];
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
  return e.dump();
}

}  // namespace

std::string etcd_url(const std::string& endpoint) {
  std::string e = endpoint;
  for (const char* scheme : {"http://", "https://"})
    if (e.rfind(scheme, 0) == 0) e = e.substr(std::string(scheme).size());
  const size_t colon = e.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < e.size();
  if (ok) {
    try {
      size_t used = 0;
      const int port = std::stoi(e.substr(colon + 1), &used);
      ok = used == e.size() - colon - 1 && port >= 1 && port <= 65535;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok) throw std::invalid_argument("'" + endpoint + "' is not HOST:PORT of an etcd member (e.g. 10.0.0.1:2379)");
  return (endpoint.rfind("https://", 0) == 0 ? "https://" : "http://") + e;
}

std::string base64_encode(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::array<int, 256> index;
  index.fill(-1);
  for (int k = 0; k < 64; ++k) index[static_cast<unsigned char>(kAlphabet[k])] = k;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = index[static_cast<unsigned char>(c)];
    if (v < 0) throw std::invalid_argument("etcd answered with a value that is not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

namespace {

// libcurl, loaded when the first etcd client starts: tandem-run does not link it, since only the etcd
// backend needs it (and the GPU bundle carries tandem-run without libcurl and its TLS libraries).
struct CurlApi {
  CURLcode (*global_init)(long) = nullptr;
  void (*global_cleanup)() = nullptr;
  CURL* (*easy_init)() = nullptr;
  void (*easy_cleanup)(CURL*) = nullptr;
  void (*easy_reset)(CURL*) = nullptr;
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...) = nullptr;
  CURLcode (*easy_perform)(CURL*) = nullptr;
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...) = nullptr;
  const char* (*easy_strerror)(CURLcode) = nullptr;
};

// Throws std::runtime_error naming the library and the fix when it cannot be loaded.
const CurlApi& curl_api() {
  static const CurlApi api = [] {
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw std::runtime_error(std::string("the etcd backend needs libcurl (Debian's libcurl4): ") + dlerror());
    CurlApi a;
    auto load = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) throw std::runtime_error(std::string("libcurl.so.4 has no ") + name + ": install Debian's libcurl4");
    };
    load(a.global_init, "curl_global_init");
    load(a.global_cleanup, "curl_global_cleanup");
    load(a.easy_init, "curl_easy_init");
    load(a.easy_cleanup, "curl_easy_cleanup");
    load(a.easy_reset, "curl_easy_reset");
    load(a.easy_setopt, "curl_easy_setopt");
    load(a.easy_perform, "curl_easy_perform");
    load(a.easy_getinfo, "curl_easy_getinfo");
    load(a.easy_strerror, "curl_easy_strerror");
    return a;
  }();
  return api;
}

}  // namespace

EtcdClient::EtcdClient(std::vector<std::string> endpoints, double request_timeout_s)
    : timeout_ms_(static_cast<long>(request_timeout_s * 1000)) {
  for (const std::string& e : endpoints) urls_.push_back(etcd_url(e));
  if (urls_.empty()) throw std::invalid_argument("no etcd endpoint given");
  curl_api().global_init(CURL_GLOBAL_DEFAULT);  // reference-counted; the first call happens before any thread
  curl_ = curl_api().easy_init();
  if (!curl_) throw std::runtime_error("libcurl could not start a session");
}

EtcdClient::~EtcdClient() {
  curl_api().easy_cleanup(static_cast<CURL*>(curl_));
  curl_api().global_cleanup();
}

std::string EtcdClient::endpoints() const {
  std::string out;
  for (const std::string& u : urls_) out += (out.empty() ? "" : ",") + u;
  return out;
}

Json EtcdClient::post(const std::string& url, const std::string& body, std::string& failure, bool& answered) {
  const CurlApi& api = curl_api();
  CURL* c = static_cast<CURL*>(curl_);
  std::string reply;
  api.easy_reset(c);
  api.easy_setopt(c, CURLOPT_URL, url.c_str());
  api.easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  api.easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  api.easy_setopt(c, CURLOPT_WRITEFUNCTION, append_body);
  api.easy_setopt(c, CURLOPT_WRITEDATA, &reply);
  api.easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms_);
  api.easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms_, 2000L));
  api.easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  api.easy_setopt(c, CURLOPT_PROXY, "");  // members are reached directly, whatever http_proxy says
  const CURLcode rc = api.easy_perform(c);
  long status = 0;
  api.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK) {
    double connected = 0;
    api.easy_getinfo(c, CURLINFO_CONNECT_TIME, &connected);
    answered = connected > 0;  // connected, then no answer in time: a member waiting for a quorum
    failure = url + ": " + api.easy_strerror(rc);
    return nullptr;
  }
  answered = true;
  Json j = Json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (status == 200 && j.is_object()) return j;
  const std::string message = error_message(j, reply);
  const int64_t code = j.is_object() && j.contains("code") && j["code"].is_number() ? j["code"].get<int64_t>() : -1;
  if (message.find("lease not found") != std::string::npos)
    throw EtcdError(EtcdError::Kind::kLeaseLost, "etcd at " + url + ": " + message);
  if (!transient(message, code))
    throw EtcdError(EtcdError::Kind::kRefused, "etcd at " + url + " refused the request (HTTP " +
                                                   std::to_string(status) + "): " + message);
  failure = url + ": " + message;
  return nullptr;
}

Json EtcdClient::call(const std::string& path, const Json& body) {
  std::lock_guard<std::mutex> lk(mu_);
  const std::string text = body.dump();
  std::string failures;
  bool any_answered = false;
  for (size_t k = 0; k < urls_.size(); ++k) {
    const size_t i = (current_ + k) % urls_.size();
    std::string failure;
    bool answered = false;
    Json j = post(urls_[i] + path, text, failure, answered);
    if (!j.is_null()) {
      current_ = i;
      return j;
    }
    any_answered = any_answered || answered;
    failures += (failures.empty() ? "" : "; ") + failure;
  }
  current_ = (current_ + 1) % urls_.size();
  if (any_answered)
    throw EtcdError(EtcdError::Kind::kNoQuorum,
                    "the etcd cluster at " + endpoints() + " cannot commit (" + failures +
                        "): it has no quorum; bring a majority of its members back up and connected");
  throw EtcdError(EtcdError::Kind::kUnreachable, "no etcd member reachable at " + endpoints() + " (" + failures +
                                                     "): is etcd running there, and is --rdzv-endpoint right?");
}

std::optional<EtcdValue> EtcdClient::get(const std::string& key) {
  const Json r = call("/v3/kv/range", {{"key", base64_encode(key)}});
  if (!r.contains("kvs") || r["kvs"].empty()) return std::nullopt;
  return value_of(r["kvs"][0]);
}

std::vector<std::pair<std::string, EtcdValue>> EtcdClient::get_prefix(const std::string& prefix) {
  const Json r = call("/v3/kv/range", {{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_end(prefix))}});
  std::vector<std::pair<std::string, EtcdValue>> out;
  if (r.contains("kvs"))
    for (const Json& kv : r["kvs"]) out.emplace_back(base64_decode(kv.value("key", std::string())), value_of(kv));
  return out;
}

void EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  Json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  call("/v3/kv/put", body);
}

bool EtcdClient::put_if(const std::string& key, int64_t mod_revision, const std::string& value, int64_t lease) {
  Json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const Json compare = mod_revision == 0
                           ? Json{{"key", base64_encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}
                           : Json{{"key", base64_encode(key)}, {"target", "MOD"}, {"result", "EQUAL"},
                                  {"mod_revision", std::to_string(mod_revision)}};
  const Json r = call("/v3/kv/txn", {{"compare", Json::array({compare})}, {"success", Json::array({{{"request_put", put}}})}});
  return r.value("succeeded", false);
}

int64_t EtcdClient::grant_lease(int ttl_s) {
  const Json r = call("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}});
  const int64_t id = number(r, "ID");
  if (id == 0) throw EtcdError(EtcdError::Kind::kRefused, "etcd at " + endpoints() + " granted no lease: " + r.dump());
  return id;
}

void EtcdClient::keep_alive(int64_t lease) {
  const Json r = call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  if (r.contains("error")) {  // a streamed call's error comes inside an HTTP 200 answer
    const std::string message = error_message(r, r.dump());
    if (message.find("lease not found") != std::string::npos)
      throw EtcdError(EtcdError::Kind::kLeaseLost, "etcd at " + endpoints() + ": " + message);
    throw EtcdError(EtcdError::Kind::kNoQuorum, "the etcd cluster at " + endpoints() + " cannot renew lease " +
                                                    std::to_string(lease) + " (" + message +
                                                    "): it has no quorum; bring a majority of its members back up "
                                                    "and connected");
  }
  const Json& result = r.contains("result") ? r["result"] : r;
  if (number(result, "TTL") <= 0)
    throw EtcdError(EtcdError::Kind::kLeaseLost, "etcd at " + endpoints() + " no longer knows lease " +
                                                     std::to_string(lease) + " (it expired)");
}

void EtcdClient::revoke(int64_t lease) { call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}); }

}  // namespace tandem::run
