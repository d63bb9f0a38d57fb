// PrefixStore: forwards every call with "prefix/" prepended to each key. get()
// honours this store's own timeout by setting it on the call path: the wrapped
// store's get() uses the wrapped timeout, so get() here is wait() with our
// timeout followed by the wrapped get() (which then returns at once).
#include "dist/store/prefix_store.h"

#include "core/error.h"

namespace tandem::dist {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  TANDEM_CHECK(store_ != nullptr, "PrefixStore '", prefix_, "': null underlying store");
  TANDEM_CHECK(!prefix_.empty(), "PrefixStore: empty prefix; expected a namespace such as \"pg0\"");
  timeout_ = store_->timeout();
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { store_->set(full(key), value); }

Bytes PrefixStore::get(const std::string& key) {
  store_->wait({full(key)}, timeout_);
  return store_->get(full(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return store_->add(full(key), delta); }

bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(full(keys)); }

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  store_->wait(full(keys), timeout);
}

bool PrefixStore::delete_key(const std::string& key) { return store_->delete_key(full(key)); }

std::string PrefixStore::address() const { return store_->address() + "/" + prefix_; }

}  // namespace tandem::dist
