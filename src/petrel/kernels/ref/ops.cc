#include "petrel/kernels/ref/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "petrel/util/parallel.h"

namespace petrel::ref {

float DenseMatrix::at(int64_t r, int64_t c) const {
  const int64_t i = r * cols + c;
  switch (dtype) {
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

void DenseMatrix::row_to_f32(int64_t r, float* out) const {
  switch (dtype) {
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = f16_to_f32(p[c]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(p[c]);
      break;
    }
    default: std::copy_n(static_cast<const float*>(data) + r * cols, cols, out);
  }
}

void embedding_lookup(const DenseMatrix& table, std::span<const int32_t> tokens, float* out) {
  for (size_t i = 0; i < tokens.size(); ++i) table.row_to_f32(tokens[i], out + i * table.cols);
}

void rms_norm(const float* x, int64_t n_rows, int64_t dim, const DenseMatrix& weight, float eps, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum_sq += xr[i] * xr[i];
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight.at(0, i) * (xr[i] * inv_rms);
  }
}

namespace {

// y[n_rows, w.rows] = x * w^T for any matrix type with row_to_f32: each weight row is widened once and used
// for every token. Parallel over output features.
template <typename Matrix>
void matmul_rows(const float* x, int64_t n_rows, const Matrix& w, float* y) {
  const int64_t in = w.cols, out = w.rows;
  ThreadPool::global().parallel_for(
      out,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(in);
        for (int64_t o = begin; o < end; ++o) {
          w.row_to_f32(o, row.data());
          for (int64_t t = 0; t < n_rows; ++t) y[t * out + o] = dot(x + t * in, row.data(), in);
        }
      },
      /*min_block=*/16);
}

}  // namespace

void matmul(const float* x, int64_t n_rows, const DenseMatrix& w, float* y) { matmul_rows(x, n_rows, w, y); }

void apply_rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // transformers: q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[half:], q[:half]).
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void attention(const float* q, const float* keys, const float* values, int64_t n_rows, int64_t first_pos,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ThreadPool::global().parallel_for(n_rows * n_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t r = job / n_heads, h = job % n_heads, kv_head = h / group;
      const int64_t n_keys = first_pos + r + 1;  // causal: keys at positions <= this query's
      const float* qv = q + (r * n_heads + h) * head_dim;
      scores.resize(n_keys);
      for (int64_t k = 0; k < n_keys; ++k) {
        const float* kv = keys + k * kv_stride + kv_head * head_dim;
        scores[k] = dot(qv, kv, head_dim) * scale;
      }
      softmax(scores.data(), n_keys);
      float* o = out + (r * n_heads + h) * head_dim;
      std::fill_n(o, head_dim, 0.0f);
      for (int64_t k = 0; k < n_keys; ++k) {
        const float* vv = values + k * kv_stride + kv_head * head_dim;
        const float p = scores[k];
        for (int64_t i = 0; i < head_dim; ++i) o[i] += p * vv[i];
      }
    }
  });
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add_in_place(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

float dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) partial[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) partial[i % 8] += a[i] * b[i];
  return ((partial[0] + partial[4]) + (partial[1] + partial[5])) + ((partial[2] + partial[6]) + (partial[3] + partial[7]));
}

double log_sum_exp(std::span<const float> x) {
  double max = -INFINITY;
  for (float v : x) max = std::max(max, static_cast<double>(v));
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - max);
  return max + std::log(sum);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float max_value = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace petrel::ref

namespace petrel::ref {

int GptqMatrix::code(int64_t r, int64_t c) const {
  const int per_word = 32 / bits;
  const uint32_t word = static_cast<uint32_t>(qweight[(c / per_word) * stride() + r]);
  return static_cast<int>((word >> (bits * (c % per_word))) & ((1u << bits) - 1));
}

int GptqMatrix::zero(int64_t g, int64_t r) const {
  const int per_word = 32 / bits;
  const int64_t words_per_group = rows * bits / 32;
  const uint32_t word = static_cast<uint32_t>(qzeros[g * words_per_group + r / per_word]);
  return static_cast<int>((word >> (bits * (r % per_word))) & ((1u << bits) - 1)) + zero_offset;
}

float GptqMatrix::at(int64_t r, int64_t c) const {
  const int g = group_of(c);
  return scale(g, r) * static_cast<float>(code(r, c) - zero(g, r));
}

void GptqMatrix::row_to_f32(int64_t r, float* out) const {
  if (g_idx) {  // act-order: groups are scattered over the columns
    for (int64_t c = 0; c < cols; ++c) out[c] = at(r, c);
    return;
  }
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t g = 0; g < n_groups(); ++g) {
    const float s = scale(g, r);
    const int z = zero(g, r);
    const int64_t c_end = std::min(cols, (g + 1) * group_size);
    for (int64_t c = g * group_size; c < c_end; c += per_word) {
      const uint32_t word = static_cast<uint32_t>(qweight[(c / per_word) * stride() + r]);
      for (int k = 0; k < per_word; ++k) {
        out[c + k] = s * static_cast<float>(static_cast<int>((word >> (bits * k)) & mask) - z);
      }
    }
  }
}

void matmul(const float* x, int64_t n_rows, const GptqMatrix& w, float* y) { matmul_rows(x, n_rows, w, y); }

void embedding_lookup(const GptqMatrix& table, std::span<const int32_t> tokens, float* out) {
  for (size_t i = 0; i < tokens.size(); ++i) table.row_to_f32(tokens[i], out + i * table.cols);
}

}  // namespace petrel::ref
