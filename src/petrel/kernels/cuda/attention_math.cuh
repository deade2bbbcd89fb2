// kernels/cuda internal: the decode attention's per-position arithmetic (attention.cu's kernels; session 30's
// attention inside o's launch shared it, docs/PERFORMANCE.md). Only for files built with CUDA.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace petrel::cuda {

// dot(q, key row) for one lane's position, both in shared memory: q float32 (every lane reads the same
// element: a broadcast), the key fp16; two float32 partial sums.
template <bool kVector8>
__device__ __forceinline__ float key_dot(const float* q, const __half* key, int head_dim) {
  float d0 = 0.0f, d1 = 0.0f;
  if constexpr (kVector8) {  // head_dim % 8 == 0: 16-byte loads
    const uint4* key8 = reinterpret_cast<const uint4*>(key);
    const float4* q4 = reinterpret_cast<const float4*>(q);
#pragma unroll 4
    for (int b = 0; b < head_dim / 8; ++b) {
      const uint4 raw = key8[b];
      const float4 qa = q4[2 * b], qb = q4[2 * b + 1];
      const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&raw.x)),
                   k1 = __half22float2(*reinterpret_cast<const __half2*>(&raw.y)),
                   k2 = __half22float2(*reinterpret_cast<const __half2*>(&raw.z)),
                   k3 = __half22float2(*reinterpret_cast<const __half2*>(&raw.w));
      d0 = fmaf(qa.x, k0.x, d0);
      d1 = fmaf(qa.y, k0.y, d1);
      d0 = fmaf(qa.z, k1.x, d0);
      d1 = fmaf(qa.w, k1.y, d1);
      d0 = fmaf(qb.x, k2.x, d0);
      d1 = fmaf(qb.y, k2.y, d1);
      d0 = fmaf(qb.z, k3.x, d0);
      d1 = fmaf(qb.w, k3.y, d1);
    }
  } else {  // any even head_dim: 4-byte loads
    const __half2* key2 = reinterpret_cast<const __half2*>(key);
    for (int i = 0; i < head_dim / 2; ++i) {
      const float2 kf = __half22float2(key2[i]);
      d0 = fmaf(q[2 * i], kf.x, d0);
      d1 = fmaf(q[2 * i + 1], kf.y, d1);
    }
  }
  return d0 + d1;
}

}  // namespace petrel::cuda
