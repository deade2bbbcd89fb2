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

// First pass over a row of `dim` elements, called by every thread of the block: thread t holds elements
// i = t + j * blockDim.x (j < kRmsRowRegs) as v[j] = x[i] + residual[i] (residual may be null) and w[j] =
// weight[i]; when residual is not null, v is also stored to sum[i] (sum may be x: the residual stream updated
// in place), and elements past the registers are summed in a plain loop that stores them there too. All
// loads of the registers' elements are issued before any is used, so the block waits for memory about once
// (the first version of rms_norm, 256 threads looping with stores between loads, took 15.5 us for a 4096 row
// on an H200). Returns 1 / sqrt(mean(v^2) + eps): float32 sum of squares in a tree order (per thread, then warp
// shuffles, then the warps in order), IEEE sqrt and division, as ref::rms_norm up to that order.
__device__ __forceinline__ float rms_row_first_pass(const float* x, const float* residual, float* sum, int64_t dim,
                                                    const void* weight, WeightType weight_type, float eps,
                                                    float (&v)[kRmsRowRegs], float (&w)[kRmsRowRegs]) {
  const int threads = blockDim.x;
#pragma unroll
  for (int j = 0; j < kRmsRowRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * threads;
    v[j] = 0.0f;
    w[j] = 0.0f;
    if (i < dim) {
      v[j] = x[i] + (residual ? residual[i] : 0.0f);
      w[j] = load_widened(weight, weight_type, i);
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kRmsRowRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * threads;
    if (i < dim) {
      if (residual) sum[i] = v[j];
      sum_sq = fmaf(v[j], v[j], sum_sq);
    }
  }
  for (int64_t i = threadIdx.x + int64_t{kRmsRowRegs} * threads; i < dim; i += threads) {
    const float value = x[i] + (residual ? residual[i] : 0.0f);
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

// The normed value of element i past the registers (i >= kRmsRowRegs * blockDim.x), after the first pass.
__device__ __forceinline__ float rms_row_tail_value(const float* x, const float* residual, const float* sum, int64_t i,
                                                    const void* weight, WeightType weight_type, float inv_rms) {
  return load_widened(weight, weight_type, i) * ((residual ? sum : x)[i] * inv_rms);
}

}  // namespace petrel::cuda
