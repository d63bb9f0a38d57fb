#include "core/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_local bool inside_parallel_region = false;

class ThreadPool {
 public:
  explicit ThreadPool(int n) : size_(n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
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
      tasks_ = n;
      pending_ = n - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    execute(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
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
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= tasks_) continue;
      }
      execute(index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int tasks_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
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
  TANDEM_CHECK(n >= 1, "thread count must be at least 1, got ", n);
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
