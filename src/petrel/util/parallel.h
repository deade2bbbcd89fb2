// A small fixed thread pool with a blocking parallel_for, used by the reference and the SIMD kernels.
//
// Each call splits [0, n) into at most size() contiguous chunks; thread i takes chunk i first (the same ranges on
// the same threads call after call, as the kernels' caches like), then any chunk nobody has claimed yet. So a
// worker that the OS has not scheduled (another process on the cores, more threads than cores) delays nothing:
// the threads that run take its chunk. Between calls the threads spin for a while before sleeping, so that the
// few hundred short calls of a decode step do not each pay a wake-up; past the first microseconds the spin yields
// the core to any other runnable thread. One caller at a time (parallel_for is not re-entrant).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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
  // and returns when every call has finished. Ranges are contiguous blocks of at least `min_block`; which
  // thread runs which range is not fixed.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_block = 1);

  // The process-wide pool used when no pool is passed explicitly. Sized on first use.
  static ThreadPool& global();
  // Sets the size of the global pool; call before first use (e.g. from the CLI's --threads).
  static void set_global_threads(int n_threads);

 private:
  void worker_loop(int index);
  // Claims and runs chunks of job `generation`, trying chunk `first` first; returns when none is left to claim.
  void run_chunks(uint64_t generation, int first);

  // A chunk's claim word: 2 * generation of the job it belongs to, + 1 once a thread has claimed it. A thread
  // that is late (still on an older generation) cannot claim a chunk of the current job, and a job ends only
  // when all its chunks were claimed and run, so a successful claim means the job's fields below are live.
  struct alignas(64) Chunk {
    std::atomic<uint64_t> state{1};
  };

  std::vector<std::thread> workers_;
  std::unique_ptr<Chunk[]> chunks_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // The current job: written by parallel_for before it publishes a new generation, read after a claim.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_block_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};  // chunks of the current job not finished yet
  std::atomic<bool> stop_{false};
};

}  // namespace petrel
