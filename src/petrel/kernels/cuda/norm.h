// kernels/cuda: RMSNorm (transformers' LlamaRMSNorm), optionally fused with the residual add before it.
// Layout, preconditions and numerics are in norm.cu's header comment.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/dtype.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// A weight vector in device memory in its stored element type (F32, F16 or BF16).
struct DeviceVector {
  DType dtype = DType::kF32;
  int64_t size = 0;
  const void* data = nullptr;
};

// For each of n_rows rows of x[n_rows, dim] (device, float32): when `residual` is not null, first
// x += residual (x is updated in memory: the residual stream), then
// out = weight * (x / sqrt(mean(x^2) + eps)), as ref::rms_norm. out may alias neither x nor residual.
// overlap_previous: launched to overlap the kernel before it on the stream (programmatic dependent launch;
// the kernel waits for it before it reads anything).
Status rms_norm(float* x, const float* residual, int64_t n_rows, int64_t dim, const DeviceVector& weight, float eps,
                float* out, Stream stream = nullptr, bool overlap_previous = false);

}  // namespace petrel::cuda
