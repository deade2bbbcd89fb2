// The machine's memory read bandwidth, measured the way a decode step reads its weights: every pool thread
// streams through its own part of a buffer far larger than the last-level cache, four interleaved streams per
// thread with software prefetch (the best of the access patterns we tried on the 2-core VM; a single plain
// stream reads ~30% less). Used by `petrel bench` and bench/ to put tokens/s next to the bandwidth floor.
#pragma once

#include <cstddef>

namespace petrel {

// Median GB/s (1e9 bytes) of `reps` passes over `bytes` bytes, with the global thread pool.
double measure_read_bandwidth_gbs(size_t bytes = size_t(1) << 30, int reps = 5);

}  // namespace petrel
