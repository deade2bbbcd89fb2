// kernels/cuda internal: RoPE's per-pair arithmetic, shared by rope.cu and attention.cu's fused decode kernel.
// Numerics as model/rope.cc and ref::apply_rope: the angle is the float32 product float(position) *
// inv_freq[i], cos/sin are computed in double and rounded to float, and the rotation of the pair
// (a, b) = (x[i], x[i + head_dim / 2]) is a' = a cos - b sin, b' = b cos + a sin without FMA contraction, so
// the result is bit-identical to the CPU's. Only for files built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace petrel::cuda {

// cos and sin of pair i's angle at `position`.
__device__ __forceinline__ void rope_cos_sin(int64_t position, const float* inv_freq, int i, float& c, float& s) {
  const float angle = __fmul_rn(static_cast<float>(position), inv_freq[i]);
  c = static_cast<float>(cos(static_cast<double>(angle)));
  s = static_cast<float>(sin(static_cast<double>(angle)));
}

// The pair (a, b) rotated by the angle whose cos and sin are c and s.
__device__ __forceinline__ float2 rotate_pair(float a, float b, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

}  // namespace petrel::cuda
