// kernels/cuda: RoPE of one token's query and key heads and the store of its key and value into an fp16 KV
// cache, in one launch (the token generator's step between the q/k/v projections and attention).
//
// Layout: q float32 [n_heads, head_dim] (rotated in place); k, v float32 [n_kv_heads, head_dim];
// key_cache, value_cache fp16 bits [context_length, n_kv_heads, head_dim] (positions-major, as KvCache on the
// CPU), the row written is *position. inv_freq float32 [head_dim / 2].
// Rotate-half (transformers' rotate_half): pairs (i, i + head_dim / 2); a' = a cos - b sin, b' = b cos + a sin.
// Numerics: the angle is the float32 product float(position) * inv_freq[i] and cos/sin are computed in double
// and rounded to float, exactly as model/rope.cc (rope_cos_sin), so the rotation is bit-identical to
// ref::apply_rope with those tables (same float32 expressions; no FMA contraction: __fmul_rn/__fadd_rn).
// fp16 rounding is round-to-nearest-even, as util/dtype.h's f32_to_f16.
// One block per head (query heads, then KV heads), one thread per rotated pair: a few KB of work, so the
// launch is about one memory round trip; cos/sin are recomputed per block (cheap next to that).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/kernels/cuda/rope_math.cuh"

namespace petrel::cuda {

namespace {

constexpr int kMaxHalf = 128;  // head_dim <= 256

// Block h < n_heads rotates query head h; block n_heads + j rotates key head j, stores it and value head j.
// Thread i handles the pair (i, i + half) and computes its own cos/sin (the first version, one block looping
// over all heads after one table pass, took 10.8 us for Llama-3.1-8B's 40 heads on an H200).
__global__ void __launch_bounds__(kMaxHalf) rope_store_kv_kernel(float* __restrict__ q, const float* __restrict__ k,
                                                                 const float* __restrict__ v, int n_heads, int head_dim,
                                                                 int64_t kv_dim, const float* __restrict__ inv_freq,
                                                                 const int32_t* __restrict__ position, int64_t start,
                                                                 uint16_t* __restrict__ key_cache,
                                                                 uint16_t* __restrict__ value_cache) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  const int half = head_dim / 2;
  const int i = threadIdx.x;
  // Token blockIdx.y of the batch: its rows of q, k and v, at position start + blockIdx.y (or *position, the
  // token generator's single token, read at run time).
  const int64_t token = blockIdx.y;
  const int64_t pos = (position ? int64_t{*position} : start) + token;
  q += token * n_heads * head_dim;
  k += token * kv_dim;
  v += token * kv_dim;
  const int head = blockIdx.x;
  const bool is_query = head < n_heads;
  const int kv_head = head - n_heads;
  const float* in = is_query ? q + int64_t{head} * head_dim : k + int64_t{kv_head} * head_dim;
  float a = 0.0f, b = 0.0f, value_lo = 0.0f, value_hi = 0.0f;
  if (i < half) {
    a = in[i];
    b = in[i + half];
    if (!is_query) {
      value_lo = v[int64_t{kv_head} * head_dim + i];
      value_hi = v[int64_t{kv_head} * head_dim + i + half];
    }
  }
  if (i >= half) return;
  float c, s;
  rope_cos_sin(pos, inv_freq, i, c, s);
  const float2 rotated = rotate_pair(a, b, c, s);
  const float a_out = rotated.x, b_out = rotated.y;
  if (is_query) {
    float* qh = q + int64_t{head} * head_dim;
    qh[i] = a_out;
    qh[i + half] = b_out;
    return;
  }
  __half* key_row = reinterpret_cast<__half*>(key_cache) + pos * kv_dim + int64_t{kv_head} * head_dim;
  __half* value_row = reinterpret_cast<__half*>(value_cache) + pos * kv_dim + int64_t{kv_head} * head_dim;
  key_row[i] = __float2half_rn(a_out);
  key_row[i + half] = __float2half_rn(b_out);
  value_row[i] = __float2half_rn(value_lo);
  value_row[i + half] = __float2half_rn(value_hi);
}

}  // namespace

namespace {

Status launch_rope(float* q, const float* k, const float* v, int64_t n_tokens, const RopeShape& shape,
                   const float* inv_freq, const int32_t* position, int64_t start, uint16_t* key_cache,
                   uint16_t* value_cache, Stream stream, bool overlap_previous, const char* what) {
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || shape.head_dim % 2 != 0 ||
      shape.head_dim > 2 * kMaxHalf || shape.n_heads + shape.n_kv_heads > (int64_t{1} << 30)) {
    return invalid_argument(std::string("cuda::") + what + ": " + std::to_string(shape.n_heads) + " query heads, " +
                            std::to_string(shape.n_kv_heads) + " KV heads of head_dim " + std::to_string(shape.head_dim) +
                            " (head_dim must be even and at most " + std::to_string(2 * kMaxHalf) + ")");
  }
  if (n_tokens <= 0 || n_tokens > 65535 || start < 0) {
    return invalid_argument(std::string("cuda::") + what + ": " + std::to_string(n_tokens) + " tokens at position " +
                            std::to_string(start) + " (1 to 65535 tokens, position >= 0)");
  }
  if (!q || !k || !v || !inv_freq || !key_cache || !value_cache) {
    return invalid_argument(std::string("cuda::") + what + ": null device pointer");
  }
  const int threads = static_cast<int>((shape.head_dim / 2 + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(shape.n_heads + shape.n_kv_heads), static_cast<unsigned>(n_tokens));
  return cuda_status(launch_kernel(rope_store_kv_kernel, grid, dim3(threads), 0, stream, overlap_previous, q, k, v,
                                   static_cast<int>(shape.n_heads), static_cast<int>(shape.head_dim),
                                   shape.n_kv_heads * shape.head_dim, inv_freq, position, start, key_cache, value_cache),
                     std::string(what) + " launch");
}

}  // namespace

Status rope_store_kv(float* q, const float* k, const float* v, const RopeShape& shape, const float* inv_freq,
                     const int32_t* position, uint16_t* key_cache, uint16_t* value_cache, Stream stream) {
  if (!position) return invalid_argument("cuda::rope_store_kv: null device pointer");
  return launch_rope(q, k, v, 1, shape, inv_freq, position, 0, key_cache, value_cache, stream, false, "rope_store_kv");
}

Status rope_store_kv_rows(float* q, const float* k, const float* v, int64_t n_tokens, int64_t start,
                          const RopeShape& shape, const float* inv_freq, uint16_t* key_cache, uint16_t* value_cache,
                          Stream stream, bool overlap_previous) {
  return launch_rope(q, k, v, n_tokens, shape, inv_freq, nullptr, start, key_cache, value_cache, stream,
                     overlap_previous, "rope_store_kv_rows");
}

}  // namespace petrel::cuda
