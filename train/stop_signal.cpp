// StopSignal (see stop_signal.h).
#include "train/stop_signal.h"

#include <signal.h>

#include <atomic>

#include "core/error.h"

namespace tandem::train {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");

// The first signal asks for a clean stop; a second one (a user pressing Ctrl-C
// again) gets the default action: the process ends at once.
extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

}  // namespace

void StopSignal::install() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT})
    TANDEM_CHECK(::sigaction(sig, &sa, nullptr) == 0, "cannot install a handler for signal ", sig);
}

int StopSignal::requested() { return g_signal.load(); }

void StopSignal::request(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
}

void StopSignal::reset() { g_signal.store(0); }

}  // namespace tandem::train
