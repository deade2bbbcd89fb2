// kernels/cuda: RMSNorm with the residual add fused in front of it.
//
// Layout: x, residual, out float32 [n_rows, dim] row-major; weight [dim] in its stored dtype (F32/F16/BF16).
// One block per row, up to 1024 threads; each thread owns elements tid, tid + blockDim, ... (at most 8 of
// them, held in registers between the two passes) and the sum of squares is reduced with warp shuffles and
// one shared-memory pass. Numerics as ref::rms_norm: float32 sum of squares (a tree
// order instead of ref's sequential one), 1 / sqrtf(mean + eps) with IEEE sqrt and division,
// out = weight * (x * inv_rms).
// Why fused: in the token generator every residual add is followed by the next RMSNorm (attention ->
// post-attention norm, MLP -> next layer's input norm or the final norm), so one launch does both and x is
// read from memory once for the add and the sum. The row (4096 floats for Llama-3.1-8B) is 16 KB, so this
// is latency-bound: all loads in flight at once matter more than their width.
#include <cuda_runtime.h>

#include <algorithm>

#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/cuda/programmatic_launch.cuh"

namespace petrel::cuda {

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kPerThread = 8;  // elements a thread keeps in registers: rows up to 8192 are read once

__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(float* __restrict__ x, const float* __restrict__ residual,
                                                                int64_t dim, const void* __restrict__ weight,
                                                                WeightType weight_type, float eps, float* __restrict__ out) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  float* xr = x + blockIdx.x * dim;
  float* yr = out + blockIdx.x * dim;
  const float* rr = residual ? residual + blockIdx.x * dim : nullptr;
  const int threads = blockDim.x;
  // First pass: every load of the row (x, residual, weight) is issued before any is used, so the block waits
  // for memory about once instead of once per element (the first version, 256 threads looping with stores
  // between loads, took 15.5 us for a 4096 row on an H200, one DRAM round trip per iteration).
  float v[kPerThread], w[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * threads;
    v[j] = 0.0f;
    w[j] = 0.0f;
    if (i < dim) {
      v[j] = xr[i] + (rr ? rr[i] : 0.0f);
      w[j] = load_widened(weight, weight_type, i);
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * threads;
    if (i < dim) {
      if (rr) xr[i] = v[j];
      sum_sq = fmaf(v[j], v[j], sum_sq);
    }
  }
  // Rows longer than threads * kPerThread: the rest in a plain loop (each thread re-reads only its own writes).
  for (int64_t i = threadIdx.x + int64_t{kPerThread} * threads; i < dim; i += threads) {
    const float value = xr[i] + (rr ? rr[i] : 0.0f);
    if (rr) xr[i] = value;
    sum_sq = fmaf(value, value, sum_sq);
  }
  __shared__ float warp_sums[kMaxThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) sum_sq += __shfl_xor_sync(0xFFFFFFFFu, sum_sq, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  float total = 0.0f;
  for (int k = 0; k < threads / 32; ++k) total += warp_sums[k];
  const float inv_rms = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * threads;
    if (i < dim) yr[i] = w[j] * (v[j] * inv_rms);
  }
  for (int64_t i = threadIdx.x + int64_t{kPerThread} * threads; i < dim; i += threads) {
    yr[i] = load_widened(weight, weight_type, i) * (xr[i] * inv_rms);
  }
}

}  // namespace

Status rms_norm(float* x, const float* residual, int64_t n_rows, int64_t dim, const DeviceVector& weight, float eps,
                float* out, Stream stream, bool overlap_previous) {
  PETREL_ASSIGN_OR_RETURN(WeightType type, weight_type(weight.dtype, "cuda::rms_norm"));
  if (n_rows <= 0 || dim <= 0 || weight.size != dim) {
    return invalid_argument("cuda::rms_norm: " + std::to_string(n_rows) + " rows of " + std::to_string(dim) +
                            " with a weight of " + std::to_string(weight.size));
  }
  if (!x || !out || !weight.data) return invalid_argument("cuda::rms_norm: null device pointer");
  // Enough whole warps that each thread holds at most kPerThread elements (1024 threads for 8192).
  const int64_t wanted = (dim + kPerThread - 1) / kPerThread;
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (wanted + 31) / 32 * 32));
  return cuda_status(launch_kernel(rms_norm_kernel, dim3(static_cast<unsigned>(n_rows)), dim3(threads), 0, stream,
                                   overlap_previous, x, residual, dim, weight.data, type, eps, out),
                     "rms_norm launch");
}

}  // namespace petrel::cuda
