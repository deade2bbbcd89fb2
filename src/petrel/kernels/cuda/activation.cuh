// kernels/cuda internal: SiLU(gate) * up as every kernel that applies it computes it (elementwise.cu's
// silu_mul, the down projection's fused input in gemv_gptq.cu and gemm_gptq.cu), so their results agree bit
// for bit: expf (not the approximate __expf) and IEEE division, as ref::silu_mul.
#pragma once

#include <cuda_runtime.h>

namespace petrel::cuda {

__device__ __forceinline__ float silu_mul_value(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

__device__ __forceinline__ float4 silu_mul4(float4 gate, float4 up) {
  return make_float4(silu_mul_value(gate.x, up.x), silu_mul_value(gate.y, up.y), silu_mul_value(gate.z, up.z),
                     silu_mul_value(gate.w, up.w));
}

}  // namespace petrel::cuda
