// Two network namespaces joined by a veth pair, as two "hosts" for multi-node tests without a second
// machine (10.77.0.1/24 in the first, 10.77.0.2/24 in the second; the addresses exist only inside the
// namespaces). Needs root and iproute2; ok() says whether they could be made. Removed on destruction.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "fault/fault_util.h"

namespace tandem::test {

// The tensors of a safetensors file, as bytes by name.
inline std::map<std::string, std::string> weights(const std::filesystem::path& file) {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : tandem::load_safetensors(file.string()))
    out[name] = std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
  return out;
}

// Asserts that `got` holds the same tensors as `want`, bit for bit.
inline void expect_same_weights(const std::filesystem::path& want_file, const std::filesystem::path& got_file) {
  const auto want = weights(want_file), got = weights(got_file);
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs from the uninterrupted run's";
  }
}

// Waits (bounded) for two agents and expects both to have exited 0.
inline void expect_both_succeed(Process& x, Process& y, std::chrono::seconds x_limit, std::chrono::seconds y_limit) {
  const auto rx = x.wait_for(x_limit), ry = y.wait_for(y_limit);
  ASSERT_TRUE(rx && ry) << x.output() << "\n---\n" << y.output();
  EXPECT_EQ(*rx, 0) << x.output();
  EXPECT_EQ(*ry, 0) << y.output();
}

// Runs a command through /bin/sh; returns its exit code, its output in *out.
inline int sh(const std::string& cmd, const std::filesystem::path& log, std::string* out = nullptr) {
  const int rc = run_shell(cmd, log);
  if (out) *out = read_file(log);
  return rc;
}

// Two namespaces "<tag>a"/"<tag>b" joined by veth "<tag>x"/"<tag>y"; removed on destruction.
class TwoHosts {
 public:
  explicit TwoHosts(const std::filesystem::path& dir) : dir_(dir) {
    const std::string t = "td" + std::to_string(::getpid() % 100000);
    a_ = t + "a";
    b_ = t + "b";
    const std::string x = t + "x", y = t + "y";
    const std::string script =
        "set -e; ip netns add " + a_ + "; ip netns add " + b_ + "; ip link add " + x +
        " type veth peer name " + y + "; ip link set " + x + " netns " + a_ + "; ip link set " + y +
        " netns " + b_ + "; ip -n " + a_ + " addr add " + kAddrA + "/24 dev " + x + "; ip -n " + b_ +
        " addr add " + kAddrB + "/24 dev " + y + "; ip -n " + a_ + " link set lo up; ip -n " + b_ +
        " link set lo up; ip -n " + a_ + " link set " + x + " up; ip -n " + b_ + " link set " + y + " up";
    ok_ = sh(script, dir / "netns-setup.log", &error_) == 0;
    link_a_ = x;
  }
  ~TwoHosts() {
    // Deleting a namespace deletes the veth end inside it, and with it the pair.
    sh("ip netns del " + a_ + " 2>/dev/null; ip netns del " + b_ + " 2>/dev/null; true",
       dir_ / "netns-del.log");
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::vector<std::string> in(const std::string& ns, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", ns});
    return argv;
  }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  bool cut_link() const {
    return sh("ip -n " + a_ + " link set " + link_a_ + " down", dir_ / "cut.log") == 0;
  }
  bool restore_link() const {
    return sh("ip -n " + a_ + " link set " + link_a_ + " up", dir_ / "restore.log") == 0;
  }
  // SIGKILLs every process inside namespace `ns` (a whole "host" lost at once).
  bool kill_all(const std::string& ns) const {
    return sh("ip netns pids " + ns + " | xargs -r kill -9", dir_ / ("kill-" + ns + ".log")) == 0;
  }
  bool exists() const {
    std::string out;
    sh("ip netns list", dir_ / "list.log", &out);
    return out.find(a_) != std::string::npos || out.find(b_) != std::string::npos;
  }

  static constexpr const char* kAddrA = "10.77.0.1";
  static constexpr const char* kAddrB = "10.77.0.2";

 private:
  std::filesystem::path dir_;
  std::string a_, b_, link_a_, error_;
  bool ok_ = false;
};

}  // namespace tandem::test
