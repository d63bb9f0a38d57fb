// Port checks for tandem-run on node 0: is MASTER_PORT free on MASTER_ADDR (a
// bind test with SO_REUSEADDR, as the store server binds), and a free loopback
// port for --standalone. Both are snapshots: another process can still take the
// port between the check and the workers' bind.
#pragma once

#include <string>

namespace tandem::run {

struct PortCheck {
  bool ok = true;       // false: the port cannot be used; `message` says why
  std::string message;  // the error, or a warning when ok (address not local)
};

PortCheck check_port_free(const std::string& addr, int port);

// A port on 127.0.0.1 that was free a moment ago; throws std::runtime_error on failure.
int pick_free_port();
// The same on every interface (0.0.0.0): for the workers' store of a multi-node round.
int pick_free_port_any();
// This machine's IPv4 address on the route to host:port (the source address a connection there would
// get): what other nodes reach this one at. Throws std::runtime_error naming the host when none.
std::string local_address_towards(const std::string& host, int port);

}  // namespace tandem::run
