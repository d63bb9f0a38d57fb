// Bind tests (see port.h). Every socket is closed before returning.
#include "port.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace tandem::run {
namespace {

// 0 when bindable, else the errno of bind (or of socket()).
int try_bind(const sockaddr* sa, socklen_t len, int family) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int err = 0;
  if (::bind(fd, sa, len) != 0) err = errno;
  ::close(fd);
  return err;
}

std::string in_use(const std::string& addr, int port) {
  // Under MMRazor's tools/dist_train.sh the port is its PORT variable, not a flag the user typed.
  const char* script = std::getenv("TANDEM_LAUNCH_SCRIPT");
  const std::string fix = script && *script
                              ? std::string("choose another with PORT=") + std::to_string(port + 1) + " sh " + script +
                                    " ..."
                              : "choose another with --master-port, or use --standalone";
  return "MASTER_PORT " + std::to_string(port) + " on " + addr +
         " is already in use (another job or a leftover worker?); " + fix;
}

}  // namespace

PortCheck check_port_free(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res); rc != 0)
    return {false, "cannot resolve --master-addr '" + addr + "': " + ::gai_strerror(rc)};
  bool any_local = false;
  PortCheck result;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int err = try_bind(ai->ai_addr, ai->ai_addrlen, ai->ai_family);
    if (err == 0) {
      any_local = true;
    } else if (err == EADDRINUSE) {
      result = {false, in_use(addr, port)};
      break;
    } else if (err == EACCES) {
      result = {false, "MASTER_PORT " + service + " on " + addr + " cannot be bound: " + std::strerror(err) +
                           " (ports below 1024 need privileges)"};
      break;
    }
  }
  ::freeaddrinfo(res);
  if (!result.ok || any_local) return result;

  // MASTER_ADDR is not an address of this machine: test the wildcard address instead.
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(static_cast<uint16_t>(port));
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  const int err = try_bind(reinterpret_cast<const sockaddr*>(&any), sizeof(any), AF_INET);
  if (err == EADDRINUSE) return {false, in_use(addr, port)};
  return {true, "--master-addr " + addr +
                    " is not an address of this machine, but --node-rank 0 should run "
                    "on that host"};
}

namespace {

int pick_port(uint32_t addr, const char* where) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  sa.sin_addr.s_addr = htonl(addr);
  socklen_t len = sizeof(sa);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port on ") + where + ": " + std::strerror(err));
  }
  ::close(fd);
  return ntohs(sa.sin_port);
}

}  // namespace

int pick_free_port() { return pick_port(INADDR_LOOPBACK, "127.0.0.1"); }
int pick_free_port_any() { return pick_port(INADDR_ANY, "0.0.0.0"); }

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr)
    throw std::runtime_error("cannot resolve " + host + " to find this node's address towards it; give --local-addr");
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&  // no packet is sent
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  const int err = errno;
  ::freeaddrinfo(res);
  if (fd >= 0) ::close(fd);
  if (!ok) throw std::runtime_error("no route to " + host + " (" + std::strerror(err) + "); give --local-addr");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace tandem::run
