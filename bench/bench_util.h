// What the CPU benchmarks share: the median time of repeated calls.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace petrel::bench {

// The median of `reps` timed calls of f, in microseconds.
inline double median_us(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e6);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace petrel::bench
