// kernels/cuda: y = W x for a dense weight matrix in its stored element type (F32, F16 or BF16), the linears
// of float checkpoints and a tied LM head (the embedding table). Layout and tuning in gemv_dense.cu.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// y[w.rows] = w[rows, cols] (row-major, nn.Linear's [out, in]) * x[w.cols]; x and y float32 on the device.
// Products and sums in float32 (weights widened exactly), as ref::matmul up to summation order.
Status gemv_dense(const DeviceDenseMatrix& w, const float* x, float* y, Stream stream = nullptr);

}  // namespace petrel::cuda
