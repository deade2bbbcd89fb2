// kernels/cuda: the k largest values of one vector (a token's logits) with their indices (top_k.h).
//
// One block of 1024 threads, three passes over shared memory, the logits read twice from L2 (the LM head
// wrote them just before: 513 KB for Llama 3's vocabulary):
//   1. the maxima of 64-value blocks (2,004 for 128,256 values) into shared memory, and a NaN check;
//   2. a bitonic sort of the maxima, descending: the k-th largest maximum is a threshold that at least k values
//      reach (the k blocks whose maxima are the largest each hold one), so the k largest values are among those
//      at or above it; this is the host sampler's cut (runtime/sampler.cc), moved to the GPU;
//   3. the values at or above the threshold (typically k to 2k of them; at most kMaxCandidates, else the
//      answer is "count 0": the caller falls back to the host) are collected with a shared atomic counter and
//      sorted by a 64-bit key, (order-preserving bits of the value) << 32 | ~index, descending: value
//      descending, index ascending on ties, exactly the host sampler's full-sort order. The first k are written.
// A NaN anywhere also answers "count 0" (the host sampler has its own rules for NaNs). -0.0 is read as +0.0 so
// that it ties with +0.0 as the host's float comparison does.
// Cost: a few microseconds of one SM (two 513 KB reads from L2, two sorts of at most 4,096 keys), against a
// 513 KB device-to-host copy, a copy into a std::vector and a host scan at every generated token.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/top_k.h"

namespace petrel::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kBlock = 64;                                         // values per maximum
constexpr int kMaxMaxima = kMaxDeviceTopKValues / kBlock;          // 4096
constexpr int kMaxCandidates = 4096;
static_assert(kMaxMaxima <= kMaxCandidates, "the maxima and the candidates share one shared-memory array");

// Float bits whose unsigned order is the float order (no NaNs here); -0.0 maps as +0.0.
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t u = __float_as_uint(v + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Sorts keys[0 .. n) descending, n a power of two; every thread of the block calls it.
__device__ void bitonic_sort_descending(uint64_t* keys, int n) {
  for (int size = 2; size <= n; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        // The i-th pair of this stage: positions a < b = a + stride.
        const int a = 2 * i - (i & (stride - 1)), b = a + stride;
        const bool descending = (a & size) == 0;  // alternate directions below the last merge
        const uint64_t ka = keys[a], kb = keys[b];
        if ((ka < kb) == descending) {
          keys[a] = kb;
          keys[b] = ka;
        }
      }
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kThreads) top_k_kernel(const float* values, int n, int k, int maxima_pow2, TopKResult* out) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  __shared__ uint64_t keys[kMaxCandidates];
  __shared__ int found_nan, candidates;
  if (threadIdx.x == 0) {
    found_nan = 0;
    candidates = 0;
  }
  __syncthreads();
  // 1. Block maxima, one warp per block of 64 (two coalesced loads a lane, then shuffles), as ordered bits in
  // the low half of a key (the high half zero: they sort the same); keys past the blocks are 0, below every
  // real value.
  const int blocks = (n + kBlock - 1) / kBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bool nan = false;
  for (int b = warp; b < maxima_pow2; b += kThreads / 32) {
    if (b >= blocks) {
      if (lane == 0) keys[b] = 0;
      continue;
    }
    const int i0 = b * kBlock + lane, i1 = i0 + 32;
    float m = -INFINITY;
    if (i0 < n) {
      const float v = __ldcg(values + i0);
      nan |= isnan(v);
      m = v;
    }
    if (i1 < n) {
      const float v = __ldcg(values + i1);
      nan |= isnan(v);
      m = v > m ? v : m;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, m, offset);
      m = other > m ? other : m;
    }
    if (lane == 0) keys[b] = ordered_bits(m);
  }
  if (nan) found_nan = 1;
  __syncthreads();
  if (found_nan) {
    if (threadIdx.x == 0) out->count = 0;
    return;
  }
  // 2. The threshold: the k-th largest maximum.
  bitonic_sort_descending(keys, maxima_pow2);
  const uint32_t threshold = static_cast<uint32_t>(keys[k - 1]);
  __syncthreads();  // every thread has read it before the array is reused
  // 3. The values at or above it, then their keys sorted.
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t bits = ordered_bits(__ldcg(values + i));
    if (bits >= threshold) {
      const int slot = atomicAdd(&candidates, 1);
      if (slot < kMaxCandidates) keys[slot] = (uint64_t{bits} << 32) | (~static_cast<uint32_t>(i));
    }
  }
  __syncthreads();
  const int count = candidates;
  if (count > kMaxCandidates) {
    if (threadIdx.x == 0) out->count = 0;
    return;
  }
  const int padded = max(1, 1 << (32 - __clz(max(count - 1, 1))));  // next power of two >= count
  for (int i = count + threadIdx.x; i < padded; i += blockDim.x) keys[i] = 0;
  __syncthreads();
  bitonic_sort_descending(keys, padded);
  if (threadIdx.x < k) {
    const uint64_t key = keys[threadIdx.x];
    const uint32_t bits = static_cast<uint32_t>(key >> 32);
    const uint32_t u = (bits & 0x80000000u) ? (bits & 0x7FFFFFFFu) : ~bits;
    out->values[threadIdx.x] = __uint_as_float(u);
    out->ids[threadIdx.x] = static_cast<int32_t>(~static_cast<uint32_t>(key));
  }
  if (threadIdx.x == 0) out->count = k;
}

}  // namespace

Status top_k_logits(const float* values, int64_t n, int k, TopKResult* out, Stream stream) {
  if (k < 1 || k > kMaxDeviceTopK || n < k || n > kMaxDeviceTopKValues) {
    return invalid_argument("cuda::top_k_logits: k " + std::to_string(k) + " of " + std::to_string(n) +
                            " values (k 1 to " + std::to_string(kMaxDeviceTopK) + ", at most " +
                            std::to_string(kMaxDeviceTopKValues) + " values)");
  }
  if (!values || !out) return invalid_argument("cuda::top_k_logits: null device pointer");
  // At least k keys, so that the k-th exists (padding: fewer than k blocks make every value a candidate).
  const int maxima_pow2 = static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max<int64_t>(k, (n + kBlock - 1) / kBlock))));
  return cuda_status(launch_kernel(top_k_kernel, dim3(1), dim3(kThreads), 0, stream, false, values, static_cast<int>(n),
                                   k, maxima_pow2, out),
                     "top_k_logits launch");
}

}  // namespace petrel::cuda
