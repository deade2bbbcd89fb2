// kernels/cuda: the element-wise ops of the token generator: embedding lookup, SiLU(gate) * up, residual add.
// Layout, preconditions and numerics are in elementwise.cu's header comment.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/util/dtype.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// A row-major matrix in device memory in its stored element type (F32, F16 or BF16).
struct DeviceDenseMatrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
};

// out[i, :] = table[tokens[i], :] widened to float32, for i < n_tokens. `tokens` is a device array (so that a
// captured graph reads the current token); ids outside [0, table.rows) give rows of NaN, not a fault (the
// host checks ids before it uploads them).
Status embedding_lookup(const DeviceDenseMatrix& table, const int32_t* tokens, int64_t n_tokens, float* out,
                        Stream stream = nullptr);

// The same lookup in a GPTQ table (petrel quantize --embedding-bits: token = output row), dequantized as
// ref::GptqMatrix::row_to_f32 (bitwise the CPU's rows); the table stays at its stored size on the device.
// Preconditions: bits 4 or 8, a group size (cols for per channel) a multiple of 32 / bits, rows and cols too.
Status embedding_lookup_gptq(const DeviceGptqMatrix& table, const int32_t* tokens, int64_t n_tokens, float* out,
                             Stream stream = nullptr);

// values[i] = -infinity where bit i % 32 of allowed[i / 32] is clear (a constraint's token mask, device memory).
// overlap_previous: as rms_norm's (norm.h).
Status mask_logits(float* values, const uint32_t* allowed, int64_t n, Stream stream = nullptr, bool overlap_previous = false);

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)), as ref::silu_mul. out may alias gate or up.
// overlap_previous: as rms_norm's (norm.h).
Status silu_mul(const float* gate, const float* up, int64_t n, float* out, Stream stream = nullptr,
                bool overlap_previous = false);

// x[i] += y[i], as ref::add_in_place.
Status add_in_place(float* x, const float* y, int64_t n, Stream stream = nullptr);

}  // namespace petrel::cuda
