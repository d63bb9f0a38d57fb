// Reading Gloo's failures (for dist/group/process_group_gloo.cpp). Gloo reports every failure as a
// gloo::Exception or gloo::IoException with free text: no error codes, and no exception type of its
// own for a timeout. What its text does guarantee, for the Gloo in use (Debian's libgloo
// 0.0~git20220518), is a fixed set of messages, listed once here (kTimeoutMessages) with a test for
// each, and a peer named by its pair address ("[127.0.0.1]:41235").
// Guarantees: nothing here throws for any text; the store round trips of silent_peers() are
// bounded by `wait` and by the store's own timeout.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dist/store/store.h"

namespace tandem::dist::gloo_diagnosis {

// The timeout messages libgloo can throw (its transport, pairs, buffers and rendezvous, and the
// system's text for ETIMEDOUT, which it appends to socket errors); a timeout is any text containing
// one of them. The shared-memory all-reduce (dist/group/shm_allreduce.cpp) words its own timeouts with the
// first, so they are diagnosed the same way.
inline constexpr std::array<std::string_view, 9> kTimeoutMessages = {
    "Timed out waiting ",                      // a send or recv of a collective, past its timeout
    "Application timeout caused pair closure",  // a pair closed by the timeout of an op on it
    "Connect timeout ",                        // connecting a pair, during the rendezvous
    "Read timeout ",                           // a pair's socket read
    "Write timeout ",                          // a pair's socket write
    "Send timeout ",                           // a pair's send
    "Timeout waiting for memory region from ",  // a peer's buffer never registered
    "Wait timeout for key(s): ",               // the rendezvous store
    "Connection timed out",                    // strerror(ETIMEDOUT) in a pair's "Read error" or "Write error"
};
bool is_timeout(const std::string& text);

// The peers `error` names, mapped to ranks, as a suffix for the message: " ([127.0.0.1]:41235 is
// rank 1)", or, for an address that is no advertised one (the peer's end of a connection it
// opened), the ranks on that host; "" when it names none. peer_address[r] is how Gloo names rank r
// ("" for this rank).
std::string name_peers(const std::string& error, int rank, const std::vector<std::string>& peer_address);

// After a timeout of collective `tag`: records "<prefix>failed/<tag>/<rank>" in the store and waits
// up to `wait` for the other ranks' records. Returns a suffix naming the ranks that never reported
// (the stopped, stuck or gone ones), saying that every rank timed out, or that the store did not
// answer.
std::string silent_peers(Store& store, const std::string& prefix, uint32_t tag, int rank, int size,
                         const std::string& error, Millis wait);

}  // namespace tandem::dist::gloo_diagnosis
