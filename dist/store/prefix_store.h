// PrefixStore: a view of another store whose keys are namespaced as
// "prefix/key", so that independent users of one rendezvous store (process
// groups, the reducer, a second job phase) never see each other's keys.
// Shares ownership of the wrapped store. Its timeout starts as the wrapped
// store's and bounds get(); wait() passes its timeout through. Thread-safe when
// the wrapped store is.
#pragma once

#include <memory>
#include <string>

#include "dist/store/store.h"

namespace tandem::dist {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool delete_key(const std::string& key) override;
  // The wrapped store's address with the prefix: "tcp://127.0.0.1:29500/prefix".
  std::string address() const override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace tandem::dist
