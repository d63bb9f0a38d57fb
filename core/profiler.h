// Per-op wall-time profiler for the kernel entry points (kernels/*.cpp).
// Owns: a process-wide table of (section, op, forward/backward) -> calls, seconds,
// FLOPs, where a section names the part of a run ("training", "evaluation"; the
// Runner sets them, train/runner.cpp); a cheap RAII scope the dispatchers open around each op; the
// backward-phase flag the autograd engine sets while it runs a backward; a
// short GEMM run that measures this machine's f32 peak; a text report.
// Assumes: ops are timed on the thread that calls the entry point (the pool
// threads inside an op are covered by that op's scope); nested scopes each
// record their own time (the report does not subtract children). CUDA ops
// are asynchronous: their time is the host-side launch cost unless the
// caller synchronises (the CUDA backend's own timing is out of scope here).
// Guarantees: when disabled, a scope costs one relaxed atomic load and records
// nothing; recording is thread-safe; FLOPs are 2*M*N*K per GEMM-like op
// (conv, linear, matmul) computed from shapes, 0 for bytes-bound ops.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::profiler {

void set_enabled(bool on);
bool enabled();

struct OpStat {
  std::string section;  // the part of the run it was recorded in ("" when no Section was open)
  std::string op;      // kernel entry point name, e.g. "conv2d_forward"
  bool backward;       // recorded while the autograd engine ran a backward
  int64_t calls;
  double seconds;      // wall time summed over calls
  double flops;        // floating-point operations summed over calls (0: bytes-bound op)
};

// Every (section, op, phase) seen since the last reset, sorted by seconds, descending.
std::vector<OpStat> snapshot();
void reset();

// Names the part of the run that ops recorded from now on belong to, process-wide, until the
// Section ends (then the previous name is back): `profiler::Section s("evaluation");`.
class Section {
 public:
  explicit Section(std::string name);
  ~Section();
  Section(const Section&) = delete;
  Section& operator=(const Section&) = delete;

 private:
  std::string prev_;
};

// Table: op, fwd/bwd, calls, ms, share of total, GFLOP/s, % of peak_gflops
// (kernels::measure_gemm_peak_gflops measures a peak in the same run)
// (the last two only for ops with FLOPs, and % only when peak_gflops > 0).
// One table per section, in the order the sections were first recorded, each headed by its
// name and with its own total and shares (a run's evaluation never counts as training).
// Ops named lowp_* (bf16/f16 kernels: is_lowp_op) are compared with lowp_peak_gflops instead (no % where
// it is 0).
std::string report(double peak_gflops, double lowp_peak_gflops = 0.0);
bool is_lowp_op(const std::string& op);

// Marks the calling thread as running a backward (core/autograd.cpp sets it);
// ops recorded on it count as backward. Restores the previous value on exit.
class BackwardPhase {
 public:
  BackwardPhase();
  ~BackwardPhase();
  BackwardPhase(const BackwardPhase&) = delete;
  BackwardPhase& operator=(const BackwardPhase&) = delete;

 private:
  bool prev_;
};
bool in_backward_phase();

namespace detail {
extern std::atomic<bool> g_enabled;
void record(const char* op, double seconds, double flops);
}  // namespace detail

// RAII timer around one op: `Scope s("conv2d_forward", flops);`. The op name
// must be a string literal (or otherwise outlive the process's records).
class Scope {
 public:
  explicit Scope(const char* op, double flops = 0.0) {
    if (detail::g_enabled.load(std::memory_order_relaxed)) [[unlikely]] {
      op_ = op;
      flops_ = flops;
      start_ = std::chrono::steady_clock::now();
    }
  }
  ~Scope() {
    if (op_) [[unlikely]] {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      detail::record(op_, s, flops_);
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* op_ = nullptr;
  double flops_ = 0.0;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace tandem::profiler
