// kernels/cuda internal: widening of stored float element types inside kernels (F32, F16, BF16), shared by
// the .cu files that read weights in their checkpoint dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "petrel/util/dtype.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// The element types kernels widen, as a small integer passed to kernels.
enum class WeightType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline Result<WeightType> weight_type(DType dtype, const char* what) {
  switch (dtype) {
    case DType::kF32: return WeightType::kF32;
    case DType::kF16: return WeightType::kF16;
    case DType::kBF16: return WeightType::kBF16;
    default:
      return unsupported(std::string(what) + ": weights of dtype " + std::string(dtype_name(dtype)) +
                         " (only F32, F16, BF16)");
  }
}

__host__ __device__ inline int weight_type_bytes(WeightType type) { return type == WeightType::kF32 ? 4 : 2; }

// Element i of a weight array of `type`, exactly widened to float32.
__device__ __forceinline__ float load_widened(const void* data, WeightType type, int64_t i) {
  if (type == WeightType::kF32) return __ldg(static_cast<const float*>(data) + i);
  const unsigned short bits = __ldg(static_cast<const unsigned short*>(data) + i);
  if (type == WeightType::kF16) return __half2float(__ushort_as_half(bits));
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);  // bf16 is float32's upper half
}

// Elements j .. j + 3 (j % 4 == 0) of a norm weight vector of `type` in shared memory, exactly widened.
__device__ __forceinline__ float4 widen4_shared(const char* data, WeightType type, int64_t j) {
  if (type == WeightType::kF32) return *reinterpret_cast<const float4*>(data + 4 * j);
  const uint2 bits = *reinterpret_cast<const uint2*>(data + 2 * j);
  if (type == WeightType::kF16) {
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&bits.x)),
                 hi = __half22float2(*reinterpret_cast<const __half2*>(&bits.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xFFFF0000u), __uint_as_float(bits.y << 16),
                     __uint_as_float(bits.y & 0xFFFF0000u));  // bf16 is float32's upper half
}

}  // namespace petrel::cuda
