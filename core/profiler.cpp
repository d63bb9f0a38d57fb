// Profiler table, backward-phase flag, GEMM peak and report (core/profiler.h).
// The table is a small map under a mutex: it is touched only when profiling
// is on, once per op call, which is cheap next to any kernel.
#include "core/profiler.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::profiler {
namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

thread_local bool t_backward = false;

struct Acc {
  int64_t calls = 0;
  double seconds = 0, flops = 0;
};

std::mutex& table_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::pair<std::string, bool>, Acc>& table() {
  static std::map<std::pair<std::string, bool>, Acc> t;
  return t;
}

}  // namespace

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }
bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

BackwardPhase::BackwardPhase() : prev_(t_backward) { t_backward = true; }
BackwardPhase::~BackwardPhase() { t_backward = prev_; }
bool in_backward_phase() { return t_backward; }

void detail::record(const char* op, double seconds, double flops) {
  std::lock_guard<std::mutex> lock(table_mu());
  Acc& a = table()[{std::string(op), t_backward}];
  ++a.calls;
  a.seconds += seconds;
  a.flops += flops;
}

std::vector<OpStat> snapshot() {
  std::vector<OpStat> out;
  {
    std::lock_guard<std::mutex> lock(table_mu());
    for (const auto& [key, a] : table()) out.push_back({key.first, key.second, a.calls, a.seconds, a.flops});
  }
  std::stable_sort(out.begin(), out.end(), [](const OpStat& x, const OpStat& y) { return x.seconds > y.seconds; });
  return out;
}

void reset() {
  std::lock_guard<std::mutex> lock(table_mu());
  table().clear();
}

std::string report(double peak_gflops) {
  const std::vector<OpStat> stats = snapshot();
  double total = 0;
  for (const OpStat& s : stats) total += s.seconds;
  // The op column is as wide as the longest name (at least 26, at most 120).
  int width = 26;
  for (const OpStat& s : stats) width = std::max(width, std::min(120, static_cast<int>(s.op.size())));
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-*s %-4s %9s %11s %7s %9s %7s\n", width, "op", "pass", "calls", "ms",
                "share", "GFLOP/s", "%peak");
  out += line;
  for (const OpStat& s : stats) {
    const double share = total > 0 ? 100.0 * s.seconds / total : 0.0;
    char gf[32] = "-", pk[32] = "-";
    if (s.flops > 0 && s.seconds > 0) {
      const double g = s.flops / s.seconds / 1e9;
      std::snprintf(gf, sizeof gf, "%.1f", g);
      if (peak_gflops > 0) std::snprintf(pk, sizeof pk, "%.1f", 100.0 * g / peak_gflops);
    }
    std::snprintf(line, sizeof line, "%-*s %-4s %9lld %11.2f %6.1f%% %9s %7s\n", width, s.op.c_str(),
                  s.backward ? "bwd" : "fwd", static_cast<long long>(s.calls), s.seconds * 1e3, share, gf, pk);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-*s %-4s %9s %11.2f %6.1f%%", width, "total", "", "", total * 1e3,
                total > 0 ? 100.0 : 0.0);
  out += line;
  if (peak_gflops > 0) {
    std::snprintf(line, sizeof line, "   (GEMM peak %.1f GFLOP/s)", peak_gflops);
    out += line;
  }
  out += "\n";
  return out;
}

}  // namespace tandem::profiler
