// Test helper: a raw TCP client for speaking (or mangling) the store's wire protocol, and for
// checking which addresses a server listens on. Connects to loopback unless told otherwise;
// every read is bounded (10 s).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem::test {

// Connects a raw TCP socket to ip:port; returns the fd, or -1 with errno set.
inline int raw_connect(const std::string& ip, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

struct RawSocket {
  int fd = -1;
  explicit RawSocket(int port, const std::string& ip = "127.0.0.1") : fd(raw_connect(ip, port)) {
    if (fd < 0) throw Error("raw connect to " + ip + ":" + std::to_string(port) + " failed");
  }
  ~RawSocket() {
    if (fd >= 0) ::close(fd);
  }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // Sends every byte (a test failure otherwise).
  void send_bytes(const std::vector<uint8_t>& b) {
    ASSERT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), static_cast<ssize_t>(b.size()));
  }
  // Sends what the peer takes; for garbage a server may drop half-way.
  void send_some(const std::vector<uint8_t>& b) { (void)::send(fd, b.data(), b.size(), MSG_NOSIGNAL); }
  // Reads what arrives until the server closes the connection (true) or 10 s pass (false).
  bool read_until_closed(std::vector<uint8_t>* got = nullptr) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    uint8_t buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      if (got) got->insert(got->end(), buf, buf + n);
    }
    return false;
  }
};

}  // namespace tandem::test
