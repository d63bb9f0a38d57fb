// Profiler table, backward-phase flag, GEMM peak and report (core/profiler.h).
// The table is a small map under a mutex: it is touched only when profiling
// is on, once per op call, which is cheap next to any kernel.
#include "core/profiler.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
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
struct Key {
  std::string section, op;
  bool backward;
  bool operator<(const Key& o) const {
    return std::tie(section, op, backward) < std::tie(o.section, o.op, o.backward);
  }
};
std::map<Key, Acc>& table() {
  static std::map<Key, Acc> t;
  return t;
}
// Guarded by table_mu(): the current section, and every section in the order first recorded.
std::string& current_section() {
  static std::string s;
  return s;
}
std::vector<std::string>& section_order() {
  static std::vector<std::string> v;
  return v;
}

}  // namespace

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }
bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

BackwardPhase::BackwardPhase() : prev_(t_backward) { t_backward = true; }
BackwardPhase::~BackwardPhase() { t_backward = prev_; }
bool in_backward_phase() { return t_backward; }

Section::Section(std::string name) {
  std::lock_guard<std::mutex> lock(table_mu());
  prev_ = std::exchange(current_section(), std::move(name));
}
Section::~Section() {
  std::lock_guard<std::mutex> lock(table_mu());
  current_section() = std::move(prev_);
}

void detail::record(const char* op, double seconds, double flops) {
  std::lock_guard<std::mutex> lock(table_mu());
  const std::string& section = current_section();
  auto& order = section_order();
  if (std::find(order.begin(), order.end(), section) == order.end()) order.push_back(section);
  Acc& a = table()[{section, std::string(op), t_backward}];
  ++a.calls;
  a.seconds += seconds;
  a.flops += flops;
}

std::vector<OpStat> snapshot() {
  std::vector<OpStat> out;
  {
    std::lock_guard<std::mutex> lock(table_mu());
    for (const auto& [key, a] : table()) out.push_back({key.section, key.op, key.backward, a.calls, a.seconds, a.flops});
  }
  std::stable_sort(out.begin(), out.end(), [](const OpStat& x, const OpStat& y) { return x.seconds > y.seconds; });
  return out;
}

void reset() {
  std::lock_guard<std::mutex> lock(table_mu());
  table().clear();
  section_order().clear();
}

namespace {

// One section's table (report's format).
std::string section_table(const std::vector<OpStat>& stats, double peak_gflops, double lowp_peak_gflops) {
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
      const double peak = is_lowp_op(s.op) ? lowp_peak_gflops : peak_gflops;
      if (peak > 0) std::snprintf(pk, sizeof pk, "%.1f", 100.0 * g / peak);
    }
    std::snprintf(line, sizeof line, "%-*s %-4s %9lld %11.2f %6.1f%% %9s %7s\n", width, s.op.c_str(),
                  s.backward ? "bwd" : "fwd", static_cast<long long>(s.calls), s.seconds * 1e3, share, gf, pk);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-*s %-4s %9s %11.2f %6.1f%%", width, "total", "", "", total * 1e3,
                total > 0 ? 100.0 : 0.0);
  out += line;
  if (peak_gflops > 0 && lowp_peak_gflops > 0) {
    std::snprintf(line, sizeof line, "   (GEMM peak %.1f GFLOP/s, lowp_* ops: bf16 GEMM peak %.1f)", peak_gflops,
                  lowp_peak_gflops);
    out += line;
  } else if (peak_gflops > 0) {
    std::snprintf(line, sizeof line, "   (GEMM peak %.1f GFLOP/s)", peak_gflops);
    out += line;
  }
  out += "\n";
  return out;
}

}  // namespace

bool is_lowp_op(const std::string& op) { return op.rfind("lowp_", 0) == 0; }

std::string report(double peak_gflops, double lowp_peak_gflops) {
  const std::vector<OpStat> stats = snapshot();
  std::vector<std::string> order;
  {
    std::lock_guard<std::mutex> lock(table_mu());
    order = section_order();
  }
  if (order.size() <= 1) return section_table(stats, peak_gflops, lowp_peak_gflops);
  std::string out;
  for (const std::string& section : order) {
    std::vector<OpStat> part;
    for (const OpStat& s : stats)
      if (s.section == section) part.push_back(s);
    out += (out.empty() ? "" : "\n") + (section.empty() ? std::string("(outside any section)") : section) + ":\n";
    out += section_table(part, peak_gflops, lowp_peak_gflops);
  }
  return out;
}

}  // namespace tandem::profiler
