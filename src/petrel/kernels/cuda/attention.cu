// kernels/cuda: decode attention (one query token) over an fp16 KV cache, grouped-query, split over the KV
// length ("flash-decoding"), in two launches: per (KV head, split) partial softmax sums, then a combine.
//
// Layout: q float32 [n_heads, head_dim]; key_cache/value_cache fp16 [context_length, n_kv_heads, head_dim]
// (positions-major, the row of position p holds every KV head); out float32 [n_heads, head_dim];
// workspace float32: partial outputs [n_splits, n_heads, head_dim], then maxima and sums [n_splits, n_heads].
// The number of positions n = *position + 1 is read on the device, so one captured graph serves every step:
// the grid always has ceil(context_length / split) splits; a split past n returns at once, writing nothing,
// and the combine reads only the ceil(n / split) splits that hold positions.
//
// Partial kernel, block (kv_head, split), 128 threads: the G = n_heads / n_kv_heads query heads that read
// this KV head are staged in shared memory, so each key and value row is read from memory once per group
// (what makes GQA cheap). Scores: warp w takes positions start + w, start + w + 4, ...; each lane holds
// head_dim / 32 key elements and the G dot products are reduced with shuffles; scores[G][split] stay in shared
// memory. Softmax per head (one warp per head): max, exp(s - max) (expf), sum. Values: thread t owns
// (head, dim) pairs t, t + 128, ...; for each position it reads value[p][kv_head][dim], consecutive threads
// consecutive dims (coalesced; the G heads re-read the row from L1).
// Combine kernel, block per query head, head_dim threads: M = max_s m_s, o = sum_s o_s e^(m_s - M) /
// sum_s l_s e^(m_s - M).
// Numerics: float32 throughout, scores = dot(q, k) * (1 / sqrt(head_dim)) as ref::attention, exp via expf;
// only summation order and the split-wise rescaling differ from the reference.
// Tuning: the KV cache is small next to the weights at the lengths the token generator is measured at
// (Llama-3.1-8B, 128 positions: 256 KB per layer against 120 MB of W4 weights), so this kernel aims at few,
// cheap launches; the split (decode_attention_split) gives enough blocks to spread long contexts over the SMs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/cuda_check.h"

namespace petrel::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxPerLane = kMaxHeadDim / 32;
constexpr int64_t kMaxSharedBytes = 48 * 1024;  // the default dynamic limit, no opt-in needed

struct PartialArgs {
  const float* q;
  const __half* keys;
  const __half* values;
  const int32_t* position;
  float* partial_out;  // [n_splits, n_heads, head_dim]
  float* partial_max;  // [n_splits, n_heads]
  float* partial_sum;  // [n_splits, n_heads]
  int n_heads, n_kv_heads, head_dim, group, split;
  float scale;
};

__global__ void __launch_bounds__(kThreads) attention_partial_kernel(const PartialArgs a) {
  extern __shared__ float shared[];
  float* q_group = shared;                        // [group, head_dim]
  float* scores = shared + a.group * a.head_dim;  // [group, split]
  const int kv_head = blockIdx.x, split_index = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first_head = kv_head * a.group;
  const int64_t n = int64_t{*a.position} + 1;
  const int64_t start = int64_t{split_index} * a.split;
  const int len = static_cast<int>(max(int64_t{0}, min(int64_t{a.split}, n - start)));
  const int64_t out_base = (int64_t{split_index} * a.n_heads + first_head);
  if (len == 0) return;  // past the sequence: the combine kernel reads only the splits that hold positions
  for (int i = threadIdx.x; i < a.group * a.head_dim; i += kThreads) q_group[i] = a.q[first_head * a.head_dim + i];
  __syncthreads();

  const int64_t kv_stride = int64_t{a.n_kv_heads} * a.head_dim;
  const __half* key_base = a.keys + start * kv_stride + int64_t{kv_head} * a.head_dim;
  for (int p = warp; p < len; p += kWarps) {
    float key[kMaxPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      key[j] = d < a.head_dim ? __half2float(key_base[p * kv_stride + d]) : 0.0f;
    }
    for (int g = 0; g < a.group; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < a.head_dim) dot = fmaf(q_group[g * a.head_dim + d], key[j], dot);
      }
      for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, offset);
      if (lane == 0) scores[g * a.split + p] = dot * a.scale;
    }
  }
  __syncthreads();

  for (int g = warp; g < a.group; g += kWarps) {
    float* s = scores + g * a.split;
    float m = -INFINITY;
    for (int p = lane; p < len; p += 32) m = fmaxf(m, s[p]);
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    float sum = 0.0f;
    for (int p = lane; p < len; p += 32) {
      const float e = expf(s[p] - m);
      s[p] = e;
      sum += e;
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    if (lane == 0) {
      a.partial_max[out_base + g] = m;
      a.partial_sum[out_base + g] = sum;
    }
  }
  __syncthreads();

  const __half* value_base = a.values + start * kv_stride + int64_t{kv_head} * a.head_dim;
  for (int i = threadIdx.x; i < a.group * a.head_dim; i += kThreads) {
    const int g = i / a.head_dim, d = i % a.head_dim;
    const float* s = scores + g * a.split;
    float acc = 0.0f;
    for (int p = 0; p < len; ++p) acc = fmaf(s[p], __half2float(value_base[p * kv_stride + d]), acc);
    a.partial_out[out_base * a.head_dim + i] = acc;
  }
}

__global__ void attention_combine_kernel(const float* partial_out, const float* partial_max, const float* partial_sum,
                                         const int32_t* position, int split, int n_heads, int head_dim, float* out) {
  const int head = blockIdx.x;
  const int n_splits = static_cast<int>((int64_t{*position} + split) / split);  // the splits holding positions 0 .. *position
  float m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, partial_max[s * n_heads + head]);
  float total = 0.0f;
  for (int s = 0; s < n_splits; ++s) total += partial_sum[s * n_heads + head] * expf(partial_max[s * n_heads + head] - m);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float weight = expf(partial_max[s * n_heads + head] - m);
      acc = fmaf(partial_out[(int64_t{s} * n_heads + head) * head_dim + d], weight, acc);
    }
    out[int64_t{head} * head_dim + d] = acc / total;
  }
}

// The split actually used: the requested one, bounded so that the scores fit in shared memory.
int64_t effective_split(const DecodeAttentionShape& shape) {
  int64_t split = shape.split_positions > 0 ? shape.split_positions : decode_attention_split(shape.context_length);
  const int64_t group = shape.n_heads / std::max<int64_t>(shape.n_kv_heads, 1);
  const int64_t fit = (kMaxSharedBytes - group * shape.head_dim * 4) / std::max<int64_t>(group * 4, 1);
  split = std::min({split, fit, shape.context_length});
  return std::max<int64_t>(split, 1);
}

int64_t n_splits(const DecodeAttentionShape& shape) {
  const int64_t split = effective_split(shape);
  return (shape.context_length + split - 1) / split;
}

}  // namespace

int64_t decode_attention_split(int64_t context_length) {
  // Short blocks: a block works through its positions serially (8 per warp for the scores, all of them per
  // thread for the values), so the split bounds the step's latency, while blocks past the sequence cost
  // only a launch slot. The first version used 128 positions a block: at tg128 (64 positions on average)
  // one block per KV head did all the work and the step took ~4.2 ms for Llama-3.1-8B on an H200 instead
  // of the GEMVs' ~2.4 ms. 32 positions a block up to 8K positions (256 splits), then at most 256 splits.
  if (context_length <= 8192) return 32;
  return (context_length + 255) / 256;
}

int64_t decode_attention_workspace_floats(const DecodeAttentionShape& shape) {
  return n_splits(shape) * shape.n_heads * (shape.head_dim + 2);
}

Status decode_attention(const float* q, const uint16_t* key_cache, const uint16_t* value_cache, const int32_t* position,
                        const DecodeAttentionShape& shape, float* workspace, float* out, Stream stream) {
  const std::string what = "cuda::decode_attention: " + std::to_string(shape.n_heads) + " query heads, " +
                           std::to_string(shape.n_kv_heads) + " KV heads of head_dim " + std::to_string(shape.head_dim);
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.head_dim <= 0 ||
      shape.head_dim > kMaxHeadDim || shape.context_length <= 0 || shape.n_kv_heads > 65535) {
    return invalid_argument(what + ", context " + std::to_string(shape.context_length) +
                            ": needs n_kv_heads dividing n_heads and 0 < head_dim <= " + std::to_string(kMaxHeadDim));
  }
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  if (group * shape.head_dim * 4 + group * 4 > kMaxSharedBytes) return unsupported(what + ": too many query heads per KV head");
  if (!q || !key_cache || !value_cache || !position || !workspace || !out) {
    return invalid_argument(what + ": null device pointer");
  }
  const int64_t split = effective_split(shape);
  const int64_t splits = n_splits(shape);
  if (splits > 65535) return unsupported(what + ": " + std::to_string(splits) + " splits");
  float* partial_out = workspace;
  float* partial_max = partial_out + splits * shape.n_heads * shape.head_dim;
  float* partial_sum = partial_max + splits * shape.n_heads;
  const PartialArgs args{q,
                         reinterpret_cast<const __half*>(key_cache),
                         reinterpret_cast<const __half*>(value_cache),
                         position,
                         partial_out,
                         partial_max,
                         partial_sum,
                         static_cast<int>(shape.n_heads),
                         static_cast<int>(shape.n_kv_heads),
                         static_cast<int>(shape.head_dim),
                         static_cast<int>(group),
                         static_cast<int>(split),
                         1.0f / std::sqrt(static_cast<float>(shape.head_dim))};
  const size_t shared = static_cast<size_t>((group * shape.head_dim + group * split) * 4);
  attention_partial_kernel<<<dim3(static_cast<unsigned>(shape.n_kv_heads), static_cast<unsigned>(splits)), kThreads,
                             shared, stream>>>(args);
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "decode_attention launch");
  const int combine_threads = static_cast<int>(std::min<int64_t>((shape.head_dim + 31) / 32 * 32, 256));
  attention_combine_kernel<<<static_cast<unsigned>(shape.n_heads), combine_threads, 0, stream>>>(
      partial_out, partial_max, partial_sum, position, static_cast<int>(split), static_cast<int>(shape.n_heads),
      static_cast<int>(shape.head_dim), out);
  return cuda_status(cudaGetLastError(), "decode_attention combine launch");
}

}  // namespace petrel::cuda
