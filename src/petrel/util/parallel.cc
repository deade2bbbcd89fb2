#include "petrel/util/parallel.h"

#include <algorithm>
#include <memory>

namespace petrel {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {

// How long a thread spins for the next job (workers) or for the workers to finish (the caller) before it
// blocks on a condition variable: about a millisecond. A decode step issues a few hundred parallel_for calls
// of 0.1-2 ms each; a condition-variable wake-up costs 10-100 us on a VM, spinning costs nothing when the
// next call comes within microseconds.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t generation = generation_.load(std::memory_order_acquire);
    for (int spins = 0; generation == seen && !stop_.load(std::memory_order_acquire); ++spins) {
      if (spins < kSpinIterations) {
        cpu_relax();
      } else {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [&] {
          return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
        });
        spins = 0;
      }
      generation = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation;
    // The job fields were written before the generation was published (release), read after it (acquire).
    const int64_t begin = static_cast<int64_t>(index) * job_block_;
    const int64_t end = std::min(job_n_, begin + job_block_);
    if (begin < end) (*job_)(begin, end);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // pairs with the caller's predicate check under the mutex
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_block) {
  if (n <= 0) return;
  const int64_t threads = size();
  int64_t block = std::max<int64_t>(std::max<int64_t>(min_block, 1), (n + threads - 1) / threads);
  if (threads == 1 || block >= n) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_block_ = block;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // a worker about to sleep checks the generation under the mutex
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  fn(0, std::min(n, block));
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0 && spins < kSpinIterations; ++spins) cpu_relax();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
}

static int g_requested_threads = 0;
static std::unique_ptr<ThreadPool> g_pool;
static std::mutex g_pool_mutex;

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(g_requested_threads);
  return *g_pool;
}

void ThreadPool::set_global_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_requested_threads = n_threads;
  g_pool.reset();
}

}  // namespace petrel
