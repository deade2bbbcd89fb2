// kernels/cuda: GPTQ (Frantar et al. 2022, the reference implementation's `fasterquant`) on the device, and the
// float32 pieces of a calibration forward that quant/ needs around it. Plain C++ (no CUDA header); without the
// backend every function answers "not built" (cuda_unavailable.cc). Layout, numerics and the work
// decomposition are in gptq.cu's header comment; quant/gptq_cuda.h is the caller.
//
// All pointers are device pointers; all matrices are row-major unless said otherwise. Work is issued on
// `stream` (the BlasHandle / SolverHandle passed in are bound to it here); functions that must read a result
// on the host (the factorization's success) synchronize the stream.
#pragma once

#include <cstdint>
#include <string>

#include "petrel/kernels/cuda/blas.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/util/dtype.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// ---- Hessian ----

// h_upper[dim, dim] += x^T x for x[n_rows, dim] (float32 products and sums, cublasSsyrk). Only the upper
// triangle (j >= i of row-major h) is written, as HessianAccumulator keeps it.
Status gptq_hessian_add(const float* x, int64_t n_rows, int64_t dim, float* h_upper, BlasHandle& blas,
                        Stream stream = nullptr);

// out[dim, dim] float64 = the full symmetric matrix whose upper triangle h_upper holds.
Status gptq_hessian_to_f64(const float* h_upper, int64_t dim, double* out, Stream stream = nullptr);

// ---- The inverse Hessian's Cholesky factor ----

struct GptqInverseReport {
  double damp_used = 0;      // the damping added to the diagonal (after any x10 retries)
  int64_t dead_columns = 0;  // inputs whose Hessian diagonal was 0
};

// From h[cols, cols] (float64, symmetric; consumed: overwritten), as quantize_gptq does on the CPU: inputs
// with h[i, i] == 0 are marked in dead[cols] (uint8 1/0) and get h[i, i] = 1; damp = damp_percent * mean
// diagonal, multiplied by 10 (up to 6 times) while H + damp I is not positive definite; then
// u[cols, cols] float32 = the upper Cholesky factor U of (H + damp I)^-1 = U^T U, zero below the diagonal.
// Factorizations in float64 with cuSOLVER (potrf, potri, potrf). `what` names the tensor in errors.
Result<GptqInverseReport> gptq_inverse_factor(double* h, int64_t cols, double damp_percent, float* u, uint8_t* dead,
                                              SolverHandle& solver, Stream stream, const std::string& what);

// ---- The blocked column loop ----

// The quantization grid (quant::QuantScheme without the quant/ dependency).
struct GptqGrid {
  int bits = 4;               // 4 or 8
  int64_t group_size = -1;    // <= 0: one group per row (per channel)
  bool symmetric = true;
  bool clip_search = true;
};

// Where the results go: codes uint8 [rows, cols]; scales fp16 bits [n_groups, rows]; zeros uint8 [n_groups,
// rows] (the real zero point), n_groups = 1 per channel, else cols / group_size.
struct GptqOutput {
  uint8_t* codes = nullptr;
  uint16_t* scales = nullptr;
  uint8_t* zeros = nullptr;
};

inline constexpr int64_t kGptqMaxBlock = 128;  // columns per lazy batch update the in-block kernel can hold

// Floats of scratch gptq_quantize needs: the scaled errors of one block of columns, [rows, block_size].
inline int64_t gptq_workspace_floats(int64_t rows, int64_t block_size) { return rows * block_size; }

// GPTQ of w[rows, cols] (float32, in place) with u and dead from gptq_inverse_factor: dead columns of w are
// zeroed; per-channel parameters come from each whole row first, group parameters at each group's first column
// from the updated row; columns are quantized in blocks of block_size (1 .. kGptqMaxBlock) with the lazy batch
// update W[:, end:] -= Err * U[block, end:] (cublasSgemm) after each. On return w holds the dequantized
// weights (scale * (code - zero)), which is what the next calibration step multiplies by.
Status gptq_quantize(float* w, int64_t rows, int64_t cols, const float* u, const uint8_t* dead, const GptqGrid& grid,
                     int64_t block_size, const GptqOutput& out, float* workspace, BlasHandle& blas,
                     Stream stream, const std::string& what);

// ---- The calibration forward (float32 throughout, as quant/quantize_checkpoint.cc's CPU path) ----

// out[n] = in[n] widened to float32 (F32, F16 or BF16): checkpoint weights uploaded in their stored dtype.
Status widen_to_f32(const void* in, DType dtype, int64_t n, float* out, Stream stream = nullptr);

// y[m, out_features] = x[m, in_features] w[out_features, in_features]^T, float32 (cublasSgemm, no TF32).
Status linear_f32(const float* x, int64_t m, const float* w, int64_t out_features, int64_t in_features, float* y,
                  BlasHandle& blas, Stream stream = nullptr);

// Rotary embedding (rotate-half, as ref::apply_rope) of x[n_rows, n_heads, head_dim] in place, where the rows
// are sequences of seq_len tokens one after another: row r is at position r % seq_len. cos, sin:
// [seq_len, head_dim / 2] on the device, from model/rope.h's rope_cos_sin (so the angles equal the CPU's).
Status rope_sequences(float* x, int64_t n_rows, int64_t seq_len, int64_t n_heads, int64_t head_dim, const float* cos,
                      const float* sin, Stream stream = nullptr);

struct SequenceAttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;
};

// Floats of scratch sequence_attention needs: one head's scores for every sequence.
inline int64_t sequence_attention_workspace_floats(int64_t n_sequences, int64_t seq_len) {
  return n_sequences * seq_len * seq_len;
}

// Causal grouped-query attention of n_sequences independent sequences of seq_len tokens, each at positions
// 0 .. seq_len - 1, as ref::attention with first_pos 0 on each: q, out [n_sequences * seq_len, n_heads,
// head_dim]; k, v [n_sequences * seq_len, n_kv_heads, head_dim]; all float32 (keys and values are not
// rounded to fp16 as the serving KV cache does, so that calibration sees what the CPU path sees).
Status sequence_attention(const float* q, const float* k, const float* v, int64_t n_sequences, int64_t seq_len,
                          const SequenceAttentionShape& shape, float* workspace, float* out, BlasHandle& blas,
                          Stream stream = nullptr);

}  // namespace petrel::cuda
