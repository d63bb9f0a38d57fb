// Internal to dist/ (never included by a public header: it pulls in Gloo's headers).
// Presents a tandem::dist::Store to Gloo's rendezvous as a gloo::rendezvous::Store, with every
// key put under `prefix` so that several Gloo groups (and other users of the store) never see
// each other's keys. Values are copied between Gloo's vector<char> and the store's bytes.
// Timeouts: wait(keys, timeout) waits at most `timeout`; wait(keys) and get() wait at most the
// store's own timeout(). Failures throw tandem::Error from the store, naming the key(s); Gloo
// lets them propagate out of connectFullMesh unchanged.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/store/store.h"

namespace tandem::dist {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<dist::Store> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, Bytes(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(prefix_ + key);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { store_->wait(prefixed(keys)); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(prefixed(keys), timeout);
  }

  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }

  std::shared_ptr<dist::Store> store_;
  std::string prefix_;
};

}  // namespace tandem::dist
