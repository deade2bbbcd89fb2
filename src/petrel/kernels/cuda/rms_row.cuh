// kernels/cuda internal: one row of RMSNorm with the residual add in front of it, for one block. Shared by
// norm.cu (rms_norm: the normed row as float32) and gemm_gptq.cu (the fused kernel's x staging: the normed row
// as fp16 fragments), so both compute the same sums in the same order and their outputs agree bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "petrel/kernels/cuda/dtype_load.cuh"

namespace petrel::cuda {

// Elements a thread keeps in registers between the two passes: rows up to 8 * blockDim.x are read once.
inline constexpr int kRmsRowRegs = 8;
inline constexpr int kRmsRowMaxThreads = 1024;

// The block size for rows of `dim`: enough whole warps that each thread holds at most kRmsRowRegs elements
// (512 threads for 4096, 1024 from 8192 on).
inline int rms_row_threads(int64_t dim) {
  const int64_t wanted = (dim + kRmsRowRegs - 1) / kRmsRowRegs;
  return static_cast<int>(std::min<int64_t>(kRmsRowMaxThreads, (wanted + 31) / 32 * 32));
}

// Thread t holds the kRmsRowRegs consecutive elements rms_row_first(t) .. + 7 of the row in registers
// (elements past 8 * blockDim.x, rows above 8192 at most 1024 threads, are the tail: strided loops). The
// first version gave thread t elements t, t + blockDim.x, ...: scalar loads, stores and index arithmetic,
// ~1,000 instructions a warp for a 4096 row (6.2-9.3 us for 29 rows on an H200, 12 cycles an instruction with
// 16 warps an SM); consecutive elements move as 16-byte vectors and make the fused GEMM staging's 4-bit
// fragment (8 inputs) one store.
__device__ __forceinline__ int64_t rms_row_first(int thread) { return int64_t{thread} * kRmsRowRegs; }

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether the register elements move as 16-byte vectors: whole 8-element chunks, aligned rows (every thread
// of the block decides the same).
__device__ __forceinline__ bool rms_row_vectorized(const float* x, const float* residual, const float* sum, int64_t dim,
                                                   const void* weight) {
  return dim % kRmsRowRegs == 0 && aligned16(x) && (!residual || (aligned16(residual) && aligned16(sum))) &&
         aligned16(weight);
}

// Elements i0 .. i0 + 7 of a weight array of `type` (16-byte aligned there), widened exactly as load_widened.
__device__ __forceinline__ void load8_widened(const void* data, WeightType type, int64_t i0, float (&w)[8]) {
  if (type == WeightType::kF32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(data) + i0));
    const float4 b = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(data) + i0) + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    return;
  }
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(data) + i0));
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (type == WeightType::kF16) {
      w[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[k] & 0xFFFFu)));
      w[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[k] >> 16)));
    } else {  // bf16 is float32's upper half
      w[2 * k] = __uint_as_float(words[k] << 16);
      w[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
  }
}

// First pass over a row of `dim` elements, called by every thread of the block: thread t holds elements
// i = rms_row_first(t) + j (j < kRmsRowRegs) as v[j] = x[i] + residual[i] (residual may be null) and w[j] =
// weight[i] (zeros past dim); when residual is not null, v is also stored to sum[i] (sum may be x: the
// residual stream updated in place), and tail elements are summed in a plain loop that stores them there too.
// All loads of the registers' elements are issued before any is used, so the block waits for memory about
// once. x and residual were written by the previous kernel: read through L2 (programmatic_launch.cuh).
// Returns 1 / sqrt(mean(v^2) + eps): float32 sum of squares in a tree order (per thread in element order,
// then warp shuffles, then the warps in order), IEEE sqrt and division, as ref::rms_norm up to that order.
// `vectorized` is rms_row_vectorized(x, residual, sum, dim, weight).
__device__ __forceinline__ float rms_row_first_pass(const float* x, const float* residual, float* sum, int64_t dim,
                                                    const void* weight, WeightType weight_type, float eps,
                                                    bool vectorized, float (&v)[kRmsRowRegs], float (&w)[kRmsRowRegs]) {
  const int threads = blockDim.x;
  const int64_t i0 = rms_row_first(threadIdx.x);
#pragma unroll
  for (int j = 0; j < kRmsRowRegs; ++j) v[j] = w[j] = 0.0f;
  if (vectorized) {
    if (i0 < dim) {  // the whole chunk (dim % 8 == 0)
      const float4* x4 = reinterpret_cast<const float4*>(x + i0);
      float4 a = __ldcg(x4), b = __ldcg(x4 + 1);
      if (residual) {
        const float4* r4 = reinterpret_cast<const float4*>(residual + i0);
        const float4 ra = __ldcg(r4), rb = __ldcg(r4 + 1);
        a = make_float4(a.x + ra.x, a.y + ra.y, a.z + ra.z, a.w + ra.w);
        b = make_float4(b.x + rb.x, b.y + rb.y, b.z + rb.z, b.w + rb.w);
      }
      load8_widened(weight, weight_type, i0, w);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      if (residual) {
        float4* s4 = reinterpret_cast<float4*>(sum + i0);
        s4[0] = a;
        s4[1] = b;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kRmsRowRegs; ++j) {
      const int64_t i = i0 + j;
      if (i < dim) {
        v[j] = __ldcg(x + i) + (residual ? __ldcg(residual + i) : 0.0f);
        w[j] = load_widened(weight, weight_type, i);
      }
    }
    if (residual) {
#pragma unroll
      for (int j = 0; j < kRmsRowRegs; ++j) {
        if (i0 + j < dim) sum[i0 + j] = v[j];
      }
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kRmsRowRegs; ++j) sum_sq = fmaf(v[j], v[j], sum_sq);  // zeros past dim add nothing
  for (int64_t i = int64_t{kRmsRowRegs} * threads + threadIdx.x; i < dim; i += threads) {
    const float value = __ldcg(x + i) + (residual ? __ldcg(residual + i) : 0.0f);
    if (residual) sum[i] = value;
    sum_sq = fmaf(value, value, sum_sq);
  }
  __shared__ float warp_sums[kRmsRowMaxThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) sum_sq += __shfl_xor_sync(0xFFFFFFFFu, sum_sq, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  float total = 0.0f;
  for (int k = 0; k < threads / 32; ++k) total += warp_sums[k];
  return 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
}

// The normed value of tail element i (i >= kRmsRowRegs * blockDim.x), after the first pass.
__device__ __forceinline__ float rms_row_tail_value(const float* x, const float* residual, const float* sum, int64_t i,
                                                    const void* weight, WeightType weight_type, float inv_rms) {
  return load_widened(weight, weight_type, i) * (__ldcg((residual ? sum : x) + i) * inv_rms);
}

}  // namespace petrel::cuda
