#include "petrel/util/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "petrel/util/parallel.h"

namespace petrel {

double measure_read_bandwidth_gbs(size_t bytes, int reps) {
  constexpr size_t kStreams = 4, kChunk = 64 * 1024;  // each task: kStreams x kChunk bytes
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buffer(n);
  std::memset(buffer.data(), 1, n * sizeof(uint64_t));  // touch every page before timing
  const int64_t words_per_task = kStreams * kChunk / sizeof(uint64_t);
  const int64_t tasks = static_cast<int64_t>(n) / words_per_task;
  std::vector<double> rates;
  std::vector<uint64_t> sink(64, 0);
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const auto start = std::chrono::steady_clock::now();
    ThreadPool::global().parallel_for(tasks, [&](int64_t begin, int64_t end) {
      uint64_t acc[kStreams][8] = {};
      const size_t stream_words = kChunk / sizeof(uint64_t);
      for (int64_t t = begin; t < end; ++t) {
        const uint64_t* base = buffer.data() + t * words_per_task;
        for (size_t i = 0; i < stream_words; i += 8) {
          for (size_t s = 0; s < kStreams; ++s) {
            const uint64_t* p = base + s * stream_words + i;
            __builtin_prefetch(p + 128);  // 1 KiB ahead
            for (int j = 0; j < 8; ++j) acc[s][j] += p[j];
          }
        }
      }
      uint64_t total = 0;
      for (auto& a : acc) for (uint64_t v : a) total += v;
      sink[(begin * 13) % 64] += total;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(tasks * words_per_task * sizeof(uint64_t)) / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace petrel
