// kernels/cuda: the k largest of a token's logits, chosen on the GPU, so that the sampler's greedy and top-k
// picks need k (value, id) pairs on the host instead of the whole vocabulary (128,256 floats, 513 KB, copied
// and then scanned on the host at every token). top_k.cu says how.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

inline constexpr int kMaxDeviceTopK = 64;             // the largest k top_k_logits takes
inline constexpr int64_t kMaxDeviceTopKValues = 262144;  // and the most values (Llama 3: 128,256; Gemma: 256,000)

// top_k_logits' answer, written to device memory and copied back as one small block.
struct TopKResult {
  // k when values/ids hold the k largest, sorted by value descending and, among equal values, by id ascending
  // (the host sampler's order: runtime/sampler.cc); 0 when the kernel could not tell (a NaN among the values,
  // or too many values tied at its threshold): the caller then looks at all values on the host.
  int32_t count;
  int32_t reserved;
  float values[kMaxDeviceTopK];
  int32_t ids[kMaxDeviceTopK];
};

// Device scratch memory top_k_logits needs (one maximum per 256 values).
inline constexpr int64_t kTopKWorkspaceBytes = kMaxDeviceTopKValues / 256 * 4;

// *out (device memory) = the k largest of values[0 .. n) (device, float32), 1 <= k <= kMaxDeviceTopK,
// k <= n <= kMaxDeviceTopKValues, with `workspace` (device, kTopKWorkspaceBytes); two launches on `stream`,
// asynchronously, each overlapping the kernel before it when `overlap` (programmatic dependent launch: Hopper
// and later). -0.0 counts as +0.0.
Status top_k_logits(const float* values, int64_t n, int k, TopKResult* out, void* workspace, Stream stream = nullptr,
                    bool overlap = false);

}  // namespace petrel::cuda
