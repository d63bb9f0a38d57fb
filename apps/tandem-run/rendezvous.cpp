// What the rendezvous backends share (see rendezvous.h): failures, the watch thread, the choice of
// backend.
#include "rendezvous.h"

#include <signal.h>
#include <unistd.h>

#include <sstream>

#include "console.h"
#include "etcd_rendezvous.h"
#include "store_rendezvous.h"

namespace tandem::run {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str() + " s";
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

void throw_if_signalled() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, sig);
  timespec zero{0, 0};
  siginfo_t info;
  const int sig = ::sigtimedwait(&set, &info, &zero);
  if (sig > 0) throw RendezvousInterrupted(sig);
}

std::string Failure::line() const {
  std::string who = "node " + std::to_string(node) + (host.empty() ? "" : " (host " + host + ")");
  if (rank >= 0) who += " rank " + std::to_string(rank);
  return who + " " + what;
}

nlohmann::json Failure::json() const {
  return {{"node", node}, {"rank", rank}, {"exit_code", exit_code}, {"signal", signal},
          {"what", what}, {"host", host}, {"final", final}};
}

Failure Failure::from(const nlohmann::json& j) {
  Failure f;
  f.node = j.value("node", -1);
  f.rank = j.value("rank", -1);
  f.exit_code = j.value("exit_code", 1);
  f.signal = j.value("signal", 0);
  f.what = j.value("what", std::string());
  f.host = j.value("host", std::string());
  f.final = j.value("final", false);
  return f;
}

Rendezvous::~Rendezvous() { stop_watch(); }

void Rendezvous::start_watch(int round, int nnodes) {
  stop_watch();
  {
    std::lock_guard<std::mutex> lk(reason_mu_);
    reason_ = lost_reason_;
    if (lost_) return;  // the agent ends
  }
  watching_ = true;
  watcher_ = std::thread([this, round, nnodes] { watch_loop(round, nnodes); });
}

void Rendezvous::stop_watch() {
  watching_ = false;
  if (watcher_.joinable()) watcher_.join();
  std::lock_guard<std::mutex> lk(reason_mu_);
  reason_.clear();  // read by the supervisor only while the workers run
}

std::string Rendezvous::stop_reason() {
  std::lock_guard<std::mutex> lk(reason_mu_);
  return reason_;
}

bool Rendezvous::store_lost() {
  std::lock_guard<std::mutex> lk(reason_mu_);
  return lost_;
}

std::string Rendezvous::lost_reason() {
  std::lock_guard<std::mutex> lk(reason_mu_);
  return lost_reason_;
}

void Rendezvous::set_lost(const std::string& why) {
  bool say_now = false;
  {
    std::lock_guard<std::mutex> lk(reason_mu_);
    if (lost_) return;
    lost_ = true;
    lost_reason_ = why;
    say_now = !reason_.empty();
    if (!say_now) reason_ = why;
  }
  if (say_now) say(why);
}

std::string Rendezvous::scale_up_reason(int64_t waiting, int round, int nnodes) const {
  return std::to_string(waiting) + " agent(s) wait in rendezvous round " + std::to_string(round + 1) +
         " while round " + std::to_string(round) + " runs " + std::to_string(nnodes) + " of at most " +
         std::to_string(o_.nnodes) + " node(s): restarting the group with them";
}

void Rendezvous::watch_loop(int round, int nnodes) {
  std::optional<Clock::time_point> failing_since;
  while (watching_ && !store_lost()) {
    try {
      if (std::string why = watch_once(round, nnodes); !why.empty()) {
        std::lock_guard<std::mutex> lk(reason_mu_);
        if (!lost_) reason_ = why;
        return;
      }
      failing_since.reset();
    } catch (const std::exception& e) {
      if (!failing_since) failing_since = Clock::now();
      if (seconds_since(*failing_since) >= o_.store_timeout) {
        set_lost(lost_text(e.what()));
        return;
      }
    }
    for (int i = 0; i < 2 && watching_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::unique_ptr<Rendezvous> make_rendezvous(const RunOptions& o) {
  if (o.rdzv_backend == "etcd") return std::make_unique<EtcdRendezvous>(o);
  return std::make_unique<StoreRendezvous>(o);
}

}  // namespace tandem::run
