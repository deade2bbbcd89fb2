// kernels/ref: the plain scalar reference of every op the model uses. Readable, float32 accumulation,
// threaded only over independent rows. Every optimized kernel (kernels/cpu, kernels/cuda) is tested
// against these. Nothing here knows about Llama: shapes come in as arguments.
//
// Conventions: activations are float32, row-major; a "row" is one token. Weight matrices are stored as
// PyTorch's nn.Linear keeps them, [out_features, in_features] row-major, in their stored dtype, so that
// y = x W^T.
#pragma once

#include <cstdint>
#include <span>

#include "petrel/util/dtype.h"

namespace petrel::ref {

// A dense matrix in its stored element type (F32, F16 or BF16). A vector is a matrix with one row.
struct DenseMatrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;  // out_features (or vocabulary rows of an embedding table)
  int64_t cols = 0;  // in_features (or the embedding width)
  const void* data = nullptr;

  // Element (r, c) widened to float32 (exact for all three dtypes).
  float at(int64_t r, int64_t c) const;
  // Row r widened to float32 into out[cols].
  void row_to_f32(int64_t r, float* out) const;
};

// out[i, :] = table[tokens[i], :]. Token ids must be in [0, table.rows) (checked by the caller).
void embedding_lookup(const DenseMatrix& table, std::span<const int32_t> tokens, float* out);

// RMSNorm as transformers' LlamaRMSNorm: out = weight * (x / sqrt(mean(x^2) + eps)), per row.
// x, out: [n_rows, dim]; weight: one row of dim. x and out may alias.
void rms_norm(const float* x, int64_t n_rows, int64_t dim, const DenseMatrix& weight, float eps, float* out);

// y[n_rows, w.rows] = x[n_rows, w.cols] * w^T. Parallel over output features.
void matmul(const float* x, int64_t n_rows, const DenseMatrix& w, float* y);

// Rotary embedding, rotate-half convention (pairs i and i + head_dim/2), in place on
// x[n_rows, n_heads, head_dim]; cos/sin: [n_rows, head_dim/2] for each row's position.
void apply_rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin);

// Causal grouped-query attention for n_rows queries at positions first_pos .. first_pos + n_rows - 1.
// q:   [n_rows, n_heads, head_dim]
// keys, values: [>= first_pos + n_rows, n_kv_heads, head_dim] (the cache, this chunk included)
// out: [n_rows, n_heads, head_dim]
// Query head h reads KV head h / (n_heads / n_kv_heads); scores are scaled by 1/sqrt(head_dim).
void attention(const float* q, const float* keys, const float* values, int64_t n_rows, int64_t first_pos,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float* out);

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)).
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i].
void add_in_place(float* x, const float* y, int64_t n);

// sum_i a[i] * b[i] in float32, with eight interleaved partial sums (a fixed order, so results are
// reproducible; the independent sums let the compiler vectorize the loop).
float dot(const float* a, const float* b, int64_t n);

// Numerically stable softmax of x[n] in place.
void softmax(float* x, int64_t n);

// log(sum_i exp(x[i])) in double, shifted by the maximum: the normalizer of a log-softmax (x[i] - it).
double log_sum_exp(std::span<const float> x);

}  // namespace petrel::ref

namespace petrel::ref {

// A weight matrix quantized in the GPTQ convention (the layout vLLM, transformers and GPTQModel load),
// viewed in place. For a linear layer with `rows` = out_features and `cols` = in_features:
//   qweight  int32 [cols * bits / 32, rows]: 32/bits codes per word packed along the INPUT dimension,
//            code k of a word in bits k*bits .. k*bits + bits - 1; word row i starts at qweight + i * stride()
//            (stride() = rows in GPTQ's dense layout; CPU bundles pad it, see cpu::preferred_word_row_stride)
//   scales   fp16  [n_groups, rows]
//   qzeros   int32 [n_groups, rows * bits / 32]: zero points packed along the OUTPUT dimension
//   g_idx    int32 [cols] or null: the group of each input column (null: column / group_size)
// Dequantized weight (r, c) = scale[g, r] * (code(r, c) - zero(g, r)), where the stored zero is the real
// zero minus one in GPTQ's classic v1 format (`zero_offset` = 1) and the real zero in gptq_v2 (0).
struct GptqMatrix {
  int bits = 4;  // 4 or 8
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  // cols for per-channel (GPTQ's group_size -1)
  int zero_offset = 1;
  const int32_t* qweight = nullptr;
  int64_t word_row_stride = 0;  // int32 words from one word row of qweight to the next; 0: rows (dense)
  const uint16_t* scales = nullptr;
  const int32_t* qzeros = nullptr;
  const int32_t* g_idx = nullptr;

  int64_t stride() const { return word_row_stride ? word_row_stride : rows; }
  int64_t n_groups() const { return (cols + group_size - 1) / group_size; }
  int group_of(int64_t c) const { return g_idx ? g_idx[c] : static_cast<int>(c / group_size); }
  int code(int64_t r, int64_t c) const;
  int zero(int64_t g, int64_t r) const;
  float scale(int64_t g, int64_t r) const { return f16_to_f32(scales[g * rows + r]); }
  float at(int64_t r, int64_t c) const;
  // Row r dequantized to float32 into out[cols].
  void row_to_f32(int64_t r, float* out) const;
};

// y[n_rows, w.rows] = x[n_rows, w.cols] * dequant(w)^T, dequantizing on the fly.
void matmul(const float* x, int64_t n_rows, const GptqMatrix& w, float* y);

// out[i, :] = dequant(table)[tokens[i], :] for a quantized embedding table ([vocab, hidden] stored as a GPTQ
// matrix with rows = vocabulary; see docs/QUANTIZATION.md). Token ids must be in [0, table.rows).
void embedding_lookup(const GptqMatrix& table, std::span<const int32_t> tokens, float* out);

}  // namespace petrel::ref
