// kernels/cuda: the k largest values of one vector (a token's logits) with their indices (top_k.h).
//
// Two launches (the logits are in L2: the LM head wrote them just before, 513 KB for Llama 3's vocabulary):
//   1. maxima_kernel, many blocks: the maximum of every 256-value run (501 for 128,256 values; 64-value runs
//      below 16,384 values; a NaN makes the run's entry a marker above every number), written to the caller's
//      workspace. Spread over the SMs, the
//      one full read of the logits takes ~1 us; from a single SM (the first version: one block did everything,
//      reading the logits twice) it is bound by one SM's L2 bandwidth, and the whole choice took ~68 us a token.
//   2. select_kernel, one block of 1024 threads: a bitonic sort of the maxima (value, run) descending; the k-th
//      largest maximum is a threshold that at least k values reach (the k runs whose maxima are the largest
//      each hold one), so the k largest values are among those at or above it, and they lie in the runs whose
//      maximum reaches it (a prefix of the sorted maxima: typically about k runs). Only those runs are read
//      again; their values at or above the threshold (typically k to 2k; at most kMaxCandidates, else the
//      answer is "count 0": the caller falls back to the host) are collected with a shared atomic counter and
//      sorted by a 64-bit key, (order-preserving bits of the value) << 32 | ~index, descending: value
//      descending, index ascending on ties, exactly the host sampler's full-sort order. The first k are written.
// This is the host sampler's cut (runtime/sampler.cc), moved to the GPU. A NaN anywhere answers "count 0" (the
// host sampler has its own rules for NaNs). -0.0 is read as +0.0 so that it ties with +0.0 as the host's float
// comparison does. With `overlap` (programmatic dependent launch) each launch may start while the one before it
// finishes and waits for it before reading anything (programmatic_launch.cuh).
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
// Values per maximum: 256, or 64 below 64 runs of 256 (at least k runs, so that the threshold rarely falls to
// "every value": below 4,096 values all may be candidates).
constexpr int kRun = 256;
constexpr int kShortRun = 64;
constexpr int kMaxRuns = static_cast<int>(kMaxDeviceTopKValues / kRun);  // 1024
constexpr int kMaximaWarps = 8;                                  // runs per block of maxima_kernel
constexpr int kMaxCandidates = 4096;
constexpr uint32_t kNanMarker = 0xFFFFFFFFu;  // above ordered_bits of every number, +inf included
static_assert(kMaxRuns * sizeof(uint32_t) == kTopKWorkspaceBytes, "top_k.h's workspace holds one maximum a run");

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

// Run r's maximum as ordered bits (kNanMarker if the run holds a NaN): warp w of block b takes run 8 b + w.
__global__ void __launch_bounds__(kMaximaWarps * 32) maxima_kernel(const float* values, int n, int run_length,
                                                                   uint32_t* maxima) {
  allow_dependent_launch();
  wait_for_previous_kernel();
  const int run = blockIdx.x * kMaximaWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (run * run_length >= n) return;
  float v[kRun / 32];
#pragma unroll
  for (int j = 0; j < kRun / 32; ++j) {  // all loads in flight together
    const int i = run * run_length + j * 32 + lane;
    v[j] = j * 32 < run_length && i < n ? __ldcg(values + i) : -INFINITY;
  }
  float m = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kRun / 32; ++j) {
    nan |= isnan(v[j]);
    m = v[j] > m ? v[j] : m;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, m, offset);
    m = other > m ? other : m;
  }
  nan = __any_sync(0xFFFFFFFFu, nan);
  if (lane == 0) maxima[run] = nan ? kNanMarker : ordered_bits(m);
}

__global__ void __launch_bounds__(kThreads) select_kernel(const float* values, int n, int k, int run_length, int runs,
                                                          int runs_pow2, const uint32_t* maxima, TopKResult* out) {
  allow_dependent_launch();
  wait_for_previous_kernel();
  __shared__ uint64_t order[kMaxRuns];       // (maximum << 32) | run, sorted descending
  __shared__ uint64_t keys[kMaxCandidates];  // (value << 32) | ~index of the candidates
  __shared__ int found_nan, candidates, scan_runs;
  if (threadIdx.x == 0) {
    found_nan = 0;
    candidates = 0;
    scan_runs = 0;
  }
  __syncthreads();
  // 1. The maxima with their run numbers; entries past the runs are 0, below every real value.
  for (int r = threadIdx.x; r < runs_pow2; r += kThreads) {
    uint64_t key = 0;
    if (r < runs) {
      const uint32_t bits = __ldcg(maxima + r);
      if (bits == kNanMarker) found_nan = 1;
      key = (uint64_t{bits} << 32) | static_cast<uint32_t>(r);
    }
    order[r] = key;
  }
  __syncthreads();
  if (found_nan) {
    if (threadIdx.x == 0) out->count = 0;
    return;
  }
  // 2. The threshold, the k-th largest maximum, and the runs whose maximum reaches it (a prefix of the order).
  bitonic_sort_descending(order, runs_pow2);
  const uint32_t threshold = static_cast<uint32_t>(order[k - 1] >> 32);
  for (int r = threadIdx.x; r < runs; r += kThreads) {
    if (static_cast<uint32_t>(order[r] >> 32) >= threshold) atomicMax(&scan_runs, r + 1);
  }
  __syncthreads();
  // 3. The values at or above it in those runs (4 loads a thread in flight), then their keys sorted.
  const int total = scan_runs * run_length;
  for (int base = 0; base < total; base += 4 * kThreads) {
    uint32_t bits[4];
    int index[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int t = base + u * kThreads + static_cast<int>(threadIdx.x);
      index[u] = t < total ? static_cast<int>(static_cast<uint32_t>(order[t / run_length])) * run_length + t % run_length : n;
      bits[u] = index[u] < n ? ordered_bits(__ldcg(values + index[u])) : 0;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (index[u] < n && bits[u] >= threshold) {
        const int slot = atomicAdd(&candidates, 1);
        if (slot < kMaxCandidates) keys[slot] = (uint64_t{bits[u]} << 32) | (~static_cast<uint32_t>(index[u]));
      }
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

Status top_k_logits(const float* values, int64_t n, int k, TopKResult* out, void* workspace, Stream stream, bool overlap) {
  if (k < 1 || k > kMaxDeviceTopK || n < k || n > kMaxDeviceTopKValues) {
    return invalid_argument("cuda::top_k_logits: k " + std::to_string(k) + " of " + std::to_string(n) +
                            " values (k 1 to " + std::to_string(kMaxDeviceTopK) + ", at most " +
                            std::to_string(kMaxDeviceTopKValues) + " values)");
  }
  if (!values || !out || !workspace) return invalid_argument("cuda::top_k_logits: null device pointer");
  const int run_length = n >= int64_t{64} * kRun ? kRun : kShortRun;
  const int runs = static_cast<int>((n + run_length - 1) / run_length);
  // At least k entries in the order, so that the k-th exists (padding: fewer than k runs make every value a
  // candidate).
  const int runs_pow2 = static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(k, runs))));
  auto* maxima = static_cast<uint32_t*>(workspace);
  PETREL_RETURN_IF_ERROR(cuda_status(launch_kernel(maxima_kernel, dim3((runs + kMaximaWarps - 1) / kMaximaWarps),
                                                   dim3(kMaximaWarps * 32), 0, stream, overlap, values,
                                                   static_cast<int>(n), run_length, maxima),
                                     "top_k_logits launch (maxima)"));
  return cuda_status(launch_kernel(select_kernel, dim3(1), dim3(kThreads), 0, stream, overlap, values, static_cast<int>(n), k,
                                   run_length, runs, runs_pow2, static_cast<const uint32_t*>(maxima), out),
                     "top_k_logits launch (select)");
}

}  // namespace petrel::cuda
