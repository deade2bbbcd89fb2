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
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, block;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      block = job_block_;
    }
    int64_t begin = static_cast<int64_t>(index) * block;
    int64_t end = std::min(n, begin + block);
    if (begin < end) (*job)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_cv_.notify_one();
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_block_ = block;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  fn(0, std::min(n, block));
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
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
