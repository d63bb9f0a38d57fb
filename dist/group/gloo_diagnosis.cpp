// Reading Gloo's failures (dist/group/gloo_diagnosis.h).
#include "dist/group/gloo_diagnosis.h"

#include <cctype>
#include <utility>

#include "core/error.h"

namespace tandem::dist::gloo_diagnosis {
namespace {

// True when `text` contains `address` not followed by another digit (so ":4123" does not match
// ":41235").
bool mentions_address(const std::string& text, const std::string& address) {
  if (address.empty()) return false;
  for (size_t pos = text.find(address); pos != std::string::npos; pos = text.find(address, pos + 1)) {
    const size_t end = pos + address.size();
    if (end >= text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

// The "[host]:port" addresses in a Gloo error text, as (whole, "[host]:") pairs. Gloo names the
// peer of a pair by the address it advertised, or by the connected socket's peer name (the
// peer's ephemeral port), depending on which side opened the connection.
std::vector<std::pair<std::string, std::string>> addresses_in(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t open = text.find('['); open != std::string::npos; open = text.find('[', open + 1)) {
    const size_t close = text.find(']', open);
    if (close == std::string::npos || close + 2 >= text.size() || text[close + 1] != ':' ||
        !std::isdigit(static_cast<unsigned char>(text[close + 2])))
      continue;
    size_t end = close + 2;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    out.emplace_back(text.substr(open, end - open), text.substr(open, close + 2 - open));
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

bool is_timeout(const std::string& text) {
  for (std::string_view m : kTimeoutMessages)
    if (text.find(m) != std::string::npos) return true;
  return false;
}

std::string name_peers(const std::string& error, int rank, const std::vector<std::string>& peer_address) {
  const int size = static_cast<int>(peer_address.size());
  std::vector<int> named;
  for (int r = 0; r < size; ++r)
    if (r != rank && mentions_address(error, peer_address[static_cast<size_t>(r)])) named.push_back(r);
  if (!named.empty())
    return " (" + peer_address[static_cast<size_t>(named[0])] + " is rank " + std::to_string(named[0]) +
           (named.size() > 1 ? "; also ranks " + rank_list({named.begin() + 1, named.end()}) : "") + ")";
  // An address that is no advertised one: the peer's end of a connection it opened. Its host still
  // narrows the peer down (to one rank when one peer lives on that host).
  for (const auto& [whole, host] : addresses_in(error)) {
    std::vector<int> on_host;
    for (int r = 0; r < size; ++r)
      if (r != rank && peer_address[static_cast<size_t>(r)].rfind(host, 0) == 0) on_host.push_back(r);
    if (on_host.size() == 1) return " (" + whole + " is the connection to rank " + std::to_string(on_host[0]) + ")";
    if (on_host.size() > 1) return " (" + whole + " is a connection to one of ranks " + rank_list(on_host) + ")";
  }
  return "";
}

std::string silent_peers(Store& store, const std::string& prefix, uint32_t tag, int rank, int size,
                         const std::string& error, Millis wait) {
  auto key = [&](int r) { return prefix + "failed/" + std::to_string(tag) + "/" + std::to_string(r); };
  std::vector<int> silent;
  try {
    store.set_string(key(rank), error.substr(0, 200));
    std::vector<std::string> others;
    for (int r = 0; r < size; ++r)
      if (r != rank) others.push_back(key(r));
    try {
      store.wait(others, wait);
    } catch (const Error&) {
      for (int r = 0; r < size; ++r)
        if (r != rank && !store.check({key(r)})) silent.push_back(r);
    }
  } catch (const Error& e) {
    std::string why = e.what();
    if (why.size() > 300) why = why.substr(0, 300) + "...";
    return "; the stuck peer is unknown: the store at " + store.address() +
           " did not answer either (a TCP store is served by rank 0): " + why;
  }
  if (silent.empty())
    return "; every other rank reached this collective and timed out too (a network problem between the ranks?)";
  return std::string("; peer rank") + (silent.size() > 1 ? "s " : " ") + rank_list(silent) +
         " never reached this collective or did not report failing in it (stopped, stuck in other work, or gone)";
}

}  // namespace tandem::dist::gloo_diagnosis
