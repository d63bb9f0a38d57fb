// Several "hosts" for the etcd rendezvous tests: network namespaces joined by a bridge (10.78.0.1/24,
// 10.78.0.2/24, ... in the hosts; the bridge sits in a namespace of its own; the addresses exist only
// inside them), and an etcd cluster with one member per host (Debian's etcd-server, client port 2379,
// peer port 2380, data under the test's directory). Needs root, iproute2 and etcd; ok() says whether
// the hosts could be made, TANDEM_NEED_ETCD skips a test without etcd (fails under
// TANDEM_REQUIRE_DATA=1, as CI runs, since CI installs it). Everything is removed on destruction.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cluster/two_hosts.h"

#define TANDEM_NEED_ETCD()                                                                                \
  do {                                                                                                    \
    if (!std::filesystem::exists("/usr/bin/etcd")) {                                                     \
      const char* why = "this test needs etcd (/usr/bin/etcd, Debian's etcd-server): run scripts/setup.sh --for test"; \
      if (::tandem::test::data_required()) FAIL() << "TANDEM_REQUIRE_DATA=1 but " << why;                 \
      GTEST_SKIP() << why;                                                                                \
    }                                                                                                     \
  } while (0)

namespace tandem::test {

class BridgedHosts {
 public:
  BridgedHosts(const std::filesystem::path& dir, int n) : dir_(dir) {
    const std::string t = "te" + std::to_string(::getpid() % 100000);
    sw_ = t + "s";
    std::string script = "set -e; ip netns add " + sw_ + "; ip -n " + sw_ + " link add br0 type bridge; ip -n " +
                         sw_ + " link set br0 up";
    for (int i = 0; i < n; ++i) {
      const std::string ns = t + static_cast<char>('a' + i), x = t + "x" + std::to_string(i),
                        y = t + "y" + std::to_string(i);
      names_.push_back(ns);
      script += "; ip netns add " + ns + "; ip link add " + x + " type veth peer name " + y + "; ip link set " + x +
                " netns " + ns + "; ip link set " + y + " netns " + sw_ + "; ip -n " + sw_ + " link set " + y +
                " master br0; ip -n " + sw_ + " link set " + y + " up; ip -n " + ns + " addr add " + addr(i) +
                "/24 dev " + x + "; ip -n " + ns + " link set lo up; ip -n " + ns + " link set " + x + " up";
      links_.push_back(x);
    }
    ok_ = sh(script, dir / "netns-setup.log", &error_) == 0;
  }
  ~BridgedHosts() {
    std::string script;
    for (const std::string& ns : names_) script += "ip netns pids " + ns + " | xargs -r kill -9; ";
    for (const std::string& ns : names_) script += "ip netns del " + ns + " 2>/dev/null; ";
    sh(script + "ip netns del " + sw_ + " 2>/dev/null; true", dir_ / "netns-del.log");
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int i) const { return names_[static_cast<size_t>(i)]; }
  static std::string addr(int i) {
    std::string a = "10.78.0.";
    a += std::to_string(i + 1);
    return a;
  }
  std::vector<std::string> in(int i, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", name(i)});
    return argv;
  }
  // Sets host i's link to the bridge down or up.
  bool set_link(int i, bool up) const {
    return sh("ip -n " + name(i) + " link set " + links_[static_cast<size_t>(i)] + (up ? " up" : " down"),
              dir_ / "link.log") == 0;
  }
  // SIGKILLs every process inside host i (a whole host lost at once).
  bool kill_all(int i) const {
    return sh("ip netns pids " + name(i) + " | xargs -r kill -9", dir_ / ("kill-" + name(i) + ".log")) == 0;
  }

 private:
  std::filesystem::path dir_;
  std::string sw_, error_;
  std::vector<std::string> names_, links_;
  bool ok_ = false;
};

// One etcd member per host of `hosts`, as one cluster; started by start().
class EtcdCluster {
 public:
  EtcdCluster(const BridgedHosts& hosts, const std::filesystem::path& dir) : hosts_(hosts), dir_(dir) {}

  // Starts every member and waits (bounded) until each serves clients; "" or what went wrong.
  std::string start() {
    std::string initial;
    for (int i = 0; i < hosts_.size(); ++i)
    {
      if (i > 0) initial += ',';
      initial += member(i);
      initial += "=http://" + BridgedHosts::addr(i) + ":2380";
    }
    for (int i = 0; i < hosts_.size(); ++i) {
      const std::string a = BridgedHosts::addr(i);
      members_.emplace_back(
          hosts_.in(i, {"/usr/bin/etcd", "--name", member(i), "--data-dir", (dir_ / member(i)).string(),
                        "--listen-client-urls", "http://" + a + ":2379", "--advertise-client-urls", "http://" + a + ":2379",
                        "--listen-peer-urls", "http://" + a + ":2380", "--initial-advertise-peer-urls",
                        "http://" + a + ":2380", "--initial-cluster", initial, "--initial-cluster-state", "new",
                        "--initial-cluster-token", "tandem-test"}),
          dir_ / (member(i) + ".log"));
    }
    for (size_t i = 0; i < members_.size(); ++i)
      if (!members_[i].wait_for_text("ready to serve client requests", seconds(60)))
        return "etcd member " + std::to_string(i) + " did not start:\n" + members_[i].output();
    return "";
  }
  // HOST:PORT of every member, comma-separated (--rdzv-endpoint).
  std::string endpoints() const {
    std::string out;
    for (int i = 0; i < hosts_.size(); ++i) {
      if (i > 0) out += ',';
      out += BridgedHosts::addr(i);
      out += ":2379";
    }
    return out;
  }
  Process& member_process(int i) { return members_[static_cast<size_t>(i)]; }

 private:
  static std::string member(int i) {
    std::string name = "m";  // appended, not "m" + ...: GCC 12 warns falsely (-Wrestrict) on that
    name += std::to_string(i);
    return name;
  }
  const BridgedHosts& hosts_;
  std::filesystem::path dir_;
  std::vector<Process> members_;
};

}  // namespace tandem::test
