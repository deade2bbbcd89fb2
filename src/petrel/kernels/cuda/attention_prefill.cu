// kernels/cuda: causal grouped-query attention of the prompt processor (n new tokens at once) over the fp16
// KV cache, as two batched cuBLAS products around a softmax kernel.
//
// Layout. q float32 [n, n_heads, head_dim] (rotated), the cache fp16 [positions, n_kv_heads, head_dim],
// out float32 [n, n_heads, head_dim]. L = start + n keys are visible to the last query; Lp = L rounded up to 8.
// Workspace, in order (each section 256-byte aligned):
//   qh  fp16    [n_heads, n, head_dim]   q regrouped head-major, so the hpg = n_heads / n_kv_heads query heads
//                                        of KV head g are one contiguous [hpg * n, head_dim] matrix;
//   s   float32 [n_heads, n, Lp]         scores, row h * n + t;
//   p   fp16    [n_heads, n, Lp]         probabilities, zero past the causal limit;
//   oh  float32 [n_heads, n, head_dim]   the products, regrouped into out at the end.
// Steps: pack q; per KV head g (one strided-batched GemmEx over the n_kv_heads groups) S_g = Qh_g K_g^T, with
// K_g read in place from the cache (leading dimension n_kv_heads * head_dim); softmax of each row t over keys
// 0 .. start + t with the 1/sqrt(head_dim) scale, written as fp16; O_g = P_g V_g (second batched GemmEx);
// unpack. The products run fp16 x fp16 -> float32 on the tensor cores with float32 accumulation.
//
// Why cuBLAS and not a fused (flash) kernel: prefill attention is a small part of a prompt's arithmetic
// (Llama-3.1-8B, 512 tokens: 4 * 512^2 / 2 * 128 * 32 heads * 32 layers = 69 GFLOP, against 7.1 TFLOP in the
// linears), and at the context lengths petrel serves (4096 by default) the scores of one 512-token chunk are
// at most 32 heads x 512 x 4096 x 6 bytes = 400 MB, written and read once per layer: a few percent of the
// chunk's time. The causal half of the products is computed and masked (no saving there either).
//
// Numerics against ref::attention (float32 q, float32 probabilities, keys and values as the fp16 cache holds
// them): q and p are rounded to fp16 (relative 2^-11 each) before the tensor cores; sums in float32.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/blas_check.h"
#include "petrel/kernels/cuda/cuda_check.h"

namespace petrel::cuda {

namespace {

constexpr int64_t kAlign = 256;
int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct Sections {
  int64_t qh = 0, s = 0, p = 0, oh = 0, total = 0;
  int64_t lp = 0;
};

Sections sections(const PrefillAttentionShape& shape, int64_t n, int64_t kv_length) {
  Sections x;
  x.lp = align_up(kv_length, 8);
  const int64_t rows = shape.n_heads * n;
  x.qh = 0;
  x.s = align_up(x.qh + rows * shape.head_dim * 2, kAlign);
  x.p = align_up(x.s + rows * x.lp * 4, kAlign);
  x.oh = align_up(x.p + rows * x.lp * 2, kAlign);
  x.total = align_up(x.oh + rows * shape.head_dim * 4, kAlign);
  return x;
}

// qh[h, t, d] = fp16(q[t, h, d]); one thread per element in q's order (coalesced reads and writes along d).
__global__ void pack_queries(const float* __restrict__ q, __half* __restrict__ qh, int64_t n, int64_t n_heads,
                             int64_t head_dim) {
  const int64_t total = n * n_heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % head_dim, h = (i / head_dim) % n_heads, t = i / (head_dim * n_heads);
    qh[(h * n + t) * head_dim + d] = __float2half_rn(q[i]);
  }
}

// out[t, h, d] = oh[h, t, d].
__global__ void unpack_outputs(const float* __restrict__ oh, float* __restrict__ out, int64_t n, int64_t n_heads,
                               int64_t head_dim) {
  const int64_t total = n * n_heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % head_dim, h = (i / head_dim) % n_heads, t = i / (head_dim * n_heads);
    out[i] = oh[(h * n + t) * head_dim + d];
  }
}

constexpr int kSoftmaxThreads = 256;

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* shared) {
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from the previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) v = is_max ? fmaxf(v, shared[w]) : v + shared[w];
  return v;
}

// Row r = h * n + t of s: p[r, k] = softmax_k(s[r, k] * scale) for k <= start + t, 0 for the rest up to lp.
__global__ void __launch_bounds__(kSoftmaxThreads) causal_softmax(const float* __restrict__ s, __half* __restrict__ p,
                                                                  int64_t n, int64_t start, int64_t lp, float scale) {
  __shared__ float partial[kSoftmaxThreads / 32];
  const int64_t r = blockIdx.x;
  const int64_t t = r % n;
  const int64_t valid = start + t + 1;
  const float* row = s + r * lp;
  __half* out = p + r * lp;
  float m = -INFINITY;
  for (int64_t k = threadIdx.x; k < valid; k += kSoftmaxThreads) m = fmaxf(m, row[k] * scale);
  m = block_reduce(m, true, partial);
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < valid; k += kSoftmaxThreads) sum += expf(row[k] * scale - m);
  sum = block_reduce(sum, false, partial);
  const float inv = 1.0f / sum;
  for (int64_t k = threadIdx.x; k < lp; k += kSoftmaxThreads) {
    out[k] = __float2half_rn(k < valid ? expf(row[k] * scale - m) * inv : 0.0f);
  }
}

unsigned grid_for(int64_t elements, int threads) {
  const int64_t blocks = (elements + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

int64_t prefill_attention_workspace_bytes(const PrefillAttentionShape& shape, int64_t n_tokens, int64_t kv_length) {
  return sections(shape, n_tokens, kv_length).total;
}

Status prefill_attention(const float* q, const uint16_t* key_cache, const uint16_t* value_cache, int64_t start,
                         int64_t n_tokens, const PrefillAttentionShape& shape, BlasHandle& blas, void* workspace,
                         int64_t workspace_bytes, float* out, Stream stream) {
  const int64_t n = n_tokens, d = shape.head_dim;
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || d <= 0 || d % 2 != 0 ||
      d > kMaxHeadDim) {
    return invalid_argument("cuda::prefill_attention: " + std::to_string(shape.n_heads) + " query heads, " +
                            std::to_string(shape.n_kv_heads) + " KV heads of head_dim " + std::to_string(d) +
                            " (KV heads must divide query heads; head_dim even, at most " + std::to_string(kMaxHeadDim) + ")");
  }
  if (n <= 0 || start < 0) {
    return invalid_argument("cuda::prefill_attention: " + std::to_string(n) + " tokens at position " + std::to_string(start));
  }
  if (!q || !key_cache || !value_cache || !workspace || !out) {
    return invalid_argument("cuda::prefill_attention: null device pointer");
  }
  const int64_t kv_length = start + n;
  const Sections x = sections(shape, n, kv_length);
  if (workspace_bytes < x.total) {
    return out_of_range("cuda::prefill_attention: " + std::to_string(n) + " tokens over " + std::to_string(kv_length) +
                        " positions need " + std::to_string(x.total) + " bytes of workspace, " +
                        std::to_string(workspace_bytes) + " given");
  }
  const int64_t groups = shape.n_kv_heads, per_group = shape.n_heads / groups, kv_dim = groups * d;
  const int64_t group_rows = per_group * n;
  if (kv_length > (int64_t{1} << 31) - 1 || group_rows * x.lp > (int64_t{1} << 40)) {
    return out_of_range("cuda::prefill_attention: " + std::to_string(n) + " tokens over " + std::to_string(kv_length) +
                        " positions is too large");
  }
  char* base = static_cast<char*>(workspace);
  __half* qh = reinterpret_cast<__half*>(base + x.qh);
  float* s = reinterpret_cast<float*>(base + x.s);
  __half* p = reinterpret_cast<__half*>(base + x.p);
  float* oh = reinterpret_cast<float*>(base + x.oh);

  constexpr int kThreads = 256;
  const int64_t elements = n * shape.n_heads * d;
  pack_queries<<<grid_for(elements, kThreads), kThreads, 0, stream>>>(q, qh, n, shape.n_heads, d);
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "prefill_attention: pack launch");

  PETREL_RETURN_IF_ERROR(blas.set_stream(stream));
  cublasHandle_t handle = blas.get();
  const float one = 1.0f, zero = 0.0f;
  // S_g^T [L x hpg*n] (column-major, ld lp) = K_g [L x d] * Qh_g^T [d x hpg*n].
  PETREL_BLAS_RETURN_IF_ERROR(
      cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(kv_length), static_cast<int>(group_rows),
                                 static_cast<int>(d), &one, key_cache, CUDA_R_16F, static_cast<int>(kv_dim), d, qh,
                                 CUDA_R_16F, static_cast<int>(d), group_rows * d, &zero, s, CUDA_R_32F,
                                 static_cast<int>(x.lp), group_rows * x.lp, static_cast<int>(groups), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
      "prefill_attention: scores (" + std::to_string(n) + " tokens x " + std::to_string(kv_length) + " keys)");

  causal_softmax<<<static_cast<unsigned>(shape.n_heads * n), kSoftmaxThreads, 0, stream>>>(
      s, p, n, start, x.lp, 1.0f / std::sqrt(static_cast<float>(d)));
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "prefill_attention: softmax launch");

  // O_g^T [d x hpg*n] (column-major, ld d) = V_g^T [d x L] * P_g^T [L x hpg*n].
  PETREL_BLAS_RETURN_IF_ERROR(
      cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(d), static_cast<int>(group_rows),
                                 static_cast<int>(kv_length), &one, value_cache, CUDA_R_16F, static_cast<int>(kv_dim), d, p,
                                 CUDA_R_16F, static_cast<int>(x.lp), group_rows * x.lp, &zero, oh, CUDA_R_32F,
                                 static_cast<int>(d), group_rows * d, static_cast<int>(groups), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
      "prefill_attention: values (" + std::to_string(n) + " tokens x " + std::to_string(kv_length) + " keys)");

  unpack_outputs<<<grid_for(elements, kThreads), kThreads, 0, stream>>>(oh, out, n, shape.n_heads, d);
  return cuda_status(cudaGetLastError(), "prefill_attention: unpack launch");
}

}  // namespace petrel::cuda
