// etcd_gateway: what one call of tandem-run's etcd client costs (apps/tandem-run/etcd_client.h: etcd's
// v3 JSON gateway over libcurl), as a ratio to a bare HTTP round trip to the same member (GET /version)
// in the same run. Starts its own one-member etcd on loopback (Debian's /usr/bin/etcd, data in a temp
// dir), times --calls calls of each kind, prints one line per kind and stops etcd.
//   build/bench/etcd_gateway [--calls 500]
#include <curl/curl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "etcd_client.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double per_call_ms(int calls, const std::function<void(int)>& call) {
  call(0);  // warm: the connection is open
  const auto start = Clock::now();
  for (int i = 0; i < calls; ++i) call(i);
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / calls;
}

size_t discard(char*, size_t size, size_t n, void*) { return size * n; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"etcd_gateway: the cost of tandem-run's etcd calls against a bare HTTP round trip"};
  int calls = 500;
  app.add_option("--calls", calls, "calls of each kind")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const std::string dir = (std::filesystem::temp_directory_path() / ("tandem-etcd-bench-" + std::to_string(::getpid()))).string();
  const std::string client = "127.0.0.1:23979", peer = "127.0.0.1:23980";
  std::vector<std::string> args = {"/usr/bin/etcd", "--name", "b", "--data-dir", dir, "--listen-client-urls",
                                   "http://" + client, "--advertise-client-urls", "http://" + client,
                                   "--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls",
                                   "http://" + peer, "--initial-cluster", "b=http://" + peer, "--log-level", "error"};
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t etcd = -1;
  if (posix_spawn(&etcd, cargv[0], nullptr, nullptr, cargv.data(), environ) != 0) {
    std::fprintf(stderr, "etcd_gateway: cannot start /usr/bin/etcd (apt install etcd-server)\n");
    return 1;
  }
  tandem::run::EtcdClient etcd_client({client}, 5.0);
  for (int i = 0;; ++i) {  // up within 10 s
    try {
      etcd_client.get("probe");
      break;
    } catch (const std::exception& e) {
      if (i == 100) {
        std::fprintf(stderr, "etcd_gateway: etcd did not come up: %s\n", e.what());
        ::kill(etcd, SIGKILL);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  CURL* c = curl_easy_init();
  const std::string version = "http://" + client + "/version";
  curl_easy_setopt(c, CURLOPT_URL, version.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  const double bare = per_call_ms(calls, [&](int) { curl_easy_perform(c); });
  curl_easy_cleanup(c);
  const int64_t lease = etcd_client.grant_lease(10);
  int64_t rev = 0;
  const struct {
    const char* name;
    std::function<void(int)> call;
  } kinds[] = {
      {"range (get)", [&](int) { etcd_client.get("k"); }},
      {"put", [&](int i) { etcd_client.put("k", std::to_string(i)); }},
      {"txn (CAS) + range", [&](int i) {  // a successful swap, then its new revision, as a join does
         if (etcd_client.put_if("cas", rev, std::to_string(i))) rev = etcd_client.get("cas")->mod_revision;
       }},
      {"lease keepalive", [&](int) { etcd_client.keep_alive(lease); }},
  };
  std::printf("%d calls each, one-member etcd on loopback; bare HTTP GET /version: %.3f ms\n", calls, bare);
  for (const auto& k : kinds) {
    const double ms = per_call_ms(calls, k.call);
    std::printf("%-20s %.3f ms/call  %.2fx the bare round trip\n", k.name, ms, ms / bare);
  }
  ::kill(etcd, SIGTERM);
  ::waitpid(etcd, nullptr, 0);
  std::filesystem::remove_all(dir);
  return 0;
}
