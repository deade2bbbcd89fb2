// kernels/cuda: RMSNorm with the residual add fused in front of it.
//
// Layout: x, residual, out float32 [n_rows, dim] row-major; weight [dim] in its stored dtype (F32/F16/BF16).
// One block per row, up to 1024 threads; each thread owns 8 consecutive elements (16-byte loads and stores,
// held in registers between the two passes) and the sum of squares is reduced with warp shuffles and one
// shared-memory pass (rms_row.cuh, shared with the GEMM's fused x staging). Numerics as ref::rms_norm:
// float32 sum of squares (a tree order instead of ref's sequential one), 1 / sqrtf(mean + eps) with IEEE sqrt
// and division, out = weight * (x * inv_rms).
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
#include "petrel/kernels/cuda/rms_row.cuh"

namespace petrel::cuda {

namespace {

__global__ void __launch_bounds__(kRmsRowMaxThreads) rms_norm_kernel(float* x, const float* residual, int64_t dim,
                                                                     const void* weight, WeightType weight_type,
                                                                     float eps, float* __restrict__ out) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  float* xr = x + blockIdx.x * dim;
  float* yr = out + blockIdx.x * dim;
  const float* rr = residual ? residual + blockIdx.x * dim : nullptr;
  float v[kRmsRowRegs], w[kRmsRowRegs];
  const bool vectorized = rms_row_vectorized(xr, rr, xr, dim, weight) && aligned16(yr);
  const float inv_rms = rms_row_first_pass(xr, rr, xr, dim, weight, weight_type, eps, vectorized, v, w);  // x += residual in place
  float y[kRmsRowRegs];
#pragma unroll
  for (int j = 0; j < kRmsRowRegs; ++j) y[j] = w[j] * (v[j] * inv_rms);
  const int64_t i0 = rms_row_first(threadIdx.x);
  if (vectorized) {
    if (i0 < dim) {
      float4* y4 = reinterpret_cast<float4*>(yr + i0);
      y4[0] = make_float4(y[0], y[1], y[2], y[3]);
      y4[1] = make_float4(y[4], y[5], y[6], y[7]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kRmsRowRegs; ++j) {
      if (i0 + j < dim) yr[i0 + j] = y[j];
    }
  }
  for (int64_t i = threadIdx.x + int64_t{kRmsRowRegs} * blockDim.x; i < dim; i += blockDim.x) {
    yr[i] = rms_row_tail_value(xr, rr, xr, i, weight, weight_type, inv_rms);
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
  const int threads = rms_row_threads(dim);
  return cuda_status(launch_kernel(rms_norm_kernel, dim3(static_cast<unsigned>(n_rows)), dim3(threads), 0, stream,
                                   overlap_previous, x, residual, dim, weight.data, type, eps, out),
                     "rms_norm launch");
}

}  // namespace petrel::cuda
