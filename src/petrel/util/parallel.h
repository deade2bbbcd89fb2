// A small fixed thread pool with a blocking parallel_for, used by the reference and the SIMD kernels. Between
// calls the workers spin for about a millisecond before sleeping, so that the few hundred short calls of a
// decode step do not each pay a wake-up. One caller at a time (parallel_for is not re-entrant).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace petrel {

class ThreadPool {
 public:
  // n_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint sub-ranges covering [0, n), on all threads including the caller,
  // and returns when every call has finished. Ranges are contiguous blocks of at least `min_block`.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_block = 1);

  // The process-wide pool used when no pool is passed explicitly. Sized on first use.
  static ThreadPool& global();
  // Sets the size of the global pool; call before first use (e.g. from the CLI's --threads).
  static void set_global_threads(int n_threads);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // The current job: written by parallel_for before it publishes a new generation, read by the workers after.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_block_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers still running the current job
  std::atomic<bool> stop_{false};
};

}  // namespace petrel
