// The shared token of a multi-node job's stores (the c10d rendezvous store and the workers' store):
// TANDEM_STORE_TOKEN when set, else --rdzv-id (which every node of a torchrun job passes alike). A
// store with a token refuses, in its handshake, every client that does not present it, before the
// client can read or write a key (dist/store/tcp_store.h). A job with neither has no token: its
// stores take any client that speaks their protocol, and tandem-run warns once.
#pragma once

#include <string>

#include "options.h"

namespace tandem::run {

// The token, or "" when the job has none.
std::string job_token(const RunOptions& o);

// For a multi-node job: says the warning when it has no token; returns the KEY=VALUE entry that gives
// the workers the token (TANDEM_STORE_TOKEN), or "" when they need none (none, or already in their
// environment).
std::string store_token_env(const RunOptions& o);

}  // namespace tandem::run
