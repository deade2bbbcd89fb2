// kernels/cuda internal: the device side of timeline.h. Only for files built with CUDA.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/timeline.h"

namespace petrel::cuda {

__device__ __forceinline__ uint64_t timeline_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Appends one record (timeline.h) for this block; called by one thread.
__device__ __forceinline__ void timeline_append(const TimelineRing& ring, const void* tag, uint32_t kind, uint32_t steps,
                                                const uint64_t (&t)[kTimelineStamps]) {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const uint32_t i = atomicAdd(ring.count, 1u);
  if (i >= ring.capacity) return;
  const uint32_t block = blockIdx.y * gridDim.x + blockIdx.x;
  uint4* r = reinterpret_cast<uint4*>(ring.records + uint64_t{i} * kTimelineWords);
  r[0] = make_uint4(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(tag)), kind | (sm << 16), (block & 0xFFFFu) | (steps << 16),
                    static_cast<uint32_t>(t[0]));
  auto since = [&](int k) { return t[k] ? static_cast<uint32_t>(t[k] - t[0]) : 0xFFFFFFFFu; };  // 0: not reached
  r[1] = make_uint4(since(1), since(2), since(3), since(4));
  r[2] = make_uint4(since(5), since(6), since(7), since(8));
}

}  // namespace petrel::cuda
