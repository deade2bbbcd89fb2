#include "petrel/util/parallel.h"

#include <algorithm>
#include <chrono>

namespace petrel {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  chunks_ = std::make_unique<Chunk[]>(static_cast<size_t>(n_threads));
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

// Waiting for the next job (workers) or for the last chunks (the caller): first kPauseSpins rounds of the CPU's
// pause instruction (tens of microseconds: the next call of a decode step usually comes within them), then
// sched_yield rounds until about a millisecond has passed, then the caller blocks on a condition variable. A
// decode step issues a few hundred parallel_for calls of 0.1-2 ms each; a condition-variable wake-up costs
// 10-100 us on a VM. The yields matter when the cores are shared (two processes, or more threads than cores):
// a thread that only paused would keep its core for its whole time slice while the thread it waits for, or
// another process, could not run.
constexpr int kPauseSpins = 2000;
constexpr auto kSpinTime = std::chrono::microseconds(1000);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or the spin time is over; returns done().
template <typename Done>
bool spin_until(const Done& done) {
  for (int i = 0; i < kPauseSpins; ++i) {
    if (done()) return true;
    cpu_relax();
  }
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

void ThreadPool::run_chunks(uint64_t generation, int first) {
  const int n = size();
  for (int k = 0; k < n; ++k) {
    const int c = (first + k) % n;
    uint64_t expected = 2 * generation;
    if (!chunks_[c].state.compare_exchange_strong(expected, expected + 1, std::memory_order_acq_rel,
                                                  std::memory_order_relaxed)) {
      continue;  // claimed by another thread, not part of this job, or the job is over
    }
    const int64_t begin = static_cast<int64_t>(c) * job_block_;
    (*job_)(begin, std::min(job_n_, begin + job_block_));
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // pairs with the caller's predicate check under the mutex
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto ready = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks(seen, index);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_block) {
  if (n <= 0) return;
  const int64_t threads = size();
  const int64_t block = std::max<int64_t>(std::max<int64_t>(min_block, 1), (n + threads - 1) / threads);
  if (threads == 1 || block >= n) {
    fn(0, n);
    return;
  }
  const int n_chunks = static_cast<int>((n + block - 1) / block);
  const uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
  job_ = &fn;
  job_n_ = n;
  job_block_ = block;
  remaining_.store(n_chunks, std::memory_order_relaxed);
  for (int c = 0; c < n_chunks; ++c) chunks_[c].state.store(2 * generation, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // a worker about to sleep checks the generation under the mutex
    generation_.store(generation, std::memory_order_release);
  }
  work_cv_.notify_all();
  run_chunks(generation, 0);
  const auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, done);
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
