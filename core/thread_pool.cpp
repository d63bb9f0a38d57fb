#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return std::min(n, 65536);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_local bool inside_parallel_region = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long an idle thread spins before it sleeps: a worker waiting for the next parallel region, the
// caller waiting for the workers to finish one. A training step runs hundreds of short regions (a
// GPT step's ops are tens of microseconds), and waking a sleeping thread through the kernel costs
// ~10 us (measured: a 2-chunk parallel_for of no work, 2 threads); a spinning one sees the next
// region within a fraction of a microsecond. Bounded (unlike OpenMP's default of milliseconds, whose
// spinning workers starve other processes on a shared machine); OMP_WAIT_POLICY=passive turns it off.
std::chrono::microseconds spin_budget() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const bool passive = policy && (std::string(policy) == "passive" || std::string(policy) == "PASSIVE");
  return std::chrono::microseconds(passive ? 0 : 50);
}

// Spins until done() or the budget is spent; true if done() became true. The first microseconds
// pause in place; after that each round yields the core, so that on a machine shared with other
// processes the spinning thread hands its core to whoever is runnable instead of holding it.
template <typename Done>
bool spin_until(Done done, std::chrono::microseconds budget) {
  if (budget.count() == 0) return done();
  const auto start = std::chrono::steady_clock::now();
  const auto yield_from = start + std::chrono::microseconds(4), until = start + budget;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return done();
    if (now >= yield_from) std::this_thread::yield();
  }
}

class ThreadPool {
 public:
  explicit ThreadPool(int n) : size_(n), spin_(spin_budget()) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
      region_.fetch_add(kNextRegion, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return size_; }

  // Runs task(i) for i in [0, n) with n <= size(), task 0 on the caller.
  void run(int n, const std::function<void(int)>& task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      pending_.store(n - 1, std::memory_order_relaxed);
      error_ = nullptr;
      // The next region and its task count in one word (a worker reads both at once), published
      // after the fields above (release).
      const uint64_t next = (region_.load(std::memory_order_relaxed) / kNextRegion + 1) * kNextRegion;
      region_.store(next | static_cast<uint64_t>(n), std::memory_order_release);
    }
    cv_.notify_all();  // no system call when every worker is spinning
    execute(0);
    if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; }, spin_)) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void execute(int i) {
    inside_parallel_region = true;
    try {
      (*task_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    inside_parallel_region = false;
  }

  void worker_loop(int index) {
    uint64_t seen = 0;  // the region word last handled
    const auto next = [&] { return region_.load(std::memory_order_acquire) != seen; };
    for (;;) {
      if (!spin_until(next, spin_)) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, next);
      }
      seen = region_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      if (static_cast<uint64_t>(index) >= seen % kNextRegion) continue;  // not one of this region's tasks
      execute(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);  // the caller is spinning, or waiting under mu_
        done_cv_.notify_one();
      }
    }
  }

  int size_;
  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  // Written by run() under mu_ before region_ moves on (release); read by the workers after they see
  // it move (acquire). region_ = region number x kNextRegion + the region's task count.
  static constexpr uint64_t kNextRegion = uint64_t{1} << 20;
  const std::function<void(int)>* task_ = nullptr;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> region_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

std::mutex pool_mu;
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}

ThreadPool& pool() {
  std::lock_guard<std::mutex> lock(pool_mu);
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  TANDEM_CHECK(n >= 1 && n <= 65536, "thread count must be in [1, 65536], got ", n);
  std::lock_guard<std::mutex> lock(pool_mu);
  auto& p = pool_slot();
  if (p && p->size() == n) return;
  p.reset();
  p = std::make_unique<ThreadPool>(n);
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  ThreadPool& p = pool();
  const int64_t chunks = std::min<int64_t>(p.size(), (n + grain - 1) / grain);
  if (chunks <= 1 || inside_parallel_region) {
    fn(begin, end);
    return;
  }
  // One parallel region at a time: a second thread (a data-loader worker, say)
  // that finds the pool busy runs its loop serially instead of waiting.
  static std::mutex region_mu;
  std::unique_lock<std::mutex> region(region_mu, std::try_to_lock);
  if (!region.owns_lock()) {
    fn(begin, end);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  p.run(static_cast<int>(chunks), [&](int i) {
    const int64_t b = begin + i * step, e = std::min(end, b + step);
    if (b < e) fn(b, e);
  });
}

}  // namespace tandem
