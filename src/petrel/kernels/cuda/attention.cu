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
// Fused kernel (decode_attention_rope, the fused decode step): the same blocks and arithmetic, plus in front
// RoPE of this token's query heads (each block rotates its group's G heads into shared memory; cos/sin as
// rope.cu, angle in float32, cos/sin in double rounded to float, no FMA contraction) and, in the block whose
// split holds *position, the rotated key and the value rounded to fp16 and stored at that row; and behind,
// the combine, done by the last split of each KV head to arrive (an atomic counter per KV head, reset by that
// block, partials through L2 as gemv_gptq's split-K): one launch instead of three (rope_store_kv, partial,
// combine). Before it waits for the projections (programmatic dependent launch, programmatic_launch.cuh) a
// block computes cos/sin and asks its split's cache rows into L2; the scores load 4 key rows per warp before
// the dot products and the value loop is unrolled, so a block waits for memory a few times, not once per
// position. The cache is read with ld.global.cg, so the row this block stored is seen by all its threads.
// Tuning: the KV cache is small next to the weights at the lengths the token generator is measured at
// (Llama-3.1-8B, 128 positions: 256 KB per layer against 120 MB of W4 weights), so this kernel aims at few,
// cheap launches; the split (decode_attention_split) gives enough blocks to spread long contexts over the SMs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/programmatic_launch.cuh"

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

// The fused kernel (decode_attention_rope): block (kv_head, split), kThreads threads.
struct RopeAttentionArgs {
  const float* q;  // [n_heads, head_dim], not rotated
  const float* k;  // [n_kv_heads, head_dim], not rotated
  const float* v;  // [n_kv_heads, head_dim]
  const float* inv_freq;
  const int32_t* position;
  __half* keys;
  __half* values;
  float* partial_out;  // [n_splits, n_heads, head_dim]
  float* partial_max;  // [n_splits, n_heads]
  float* partial_sum;  // [n_splits, n_heads]
  uint32_t* counters;  // [n_kv_heads]
  float* out;          // [n_heads, head_dim]
  int n_heads, n_kv_heads, head_dim, group, split;
  float scale;
};

// Positions a warp's scores step loads together (one key row per position, all loads issued before the dots).
constexpr int kPositionsPerLoad = 8;
// Query heads of a group whose value sums a thread carries at once (registers), and the shared memory their
// reduction over position parts takes.
constexpr int kHeadsPerPass = 8;
constexpr int64_t kValueReductionBytes = int64_t{kThreads} * 2 * kHeadsPerPass * 4;

// rope.cu's rotation of the pair (a, b) = (x[i], x[i + half]): a cos - b sin, b cos + a sin, no FMA contraction.
__device__ __forceinline__ float rotated(const float* x, int d, int half, const float* cos_half, const float* sin_half) {
  const int i = d < half ? d : d - half;
  const float a = __ldcg(x + i), b = __ldcg(x + i + half), c = cos_half[i], s = sin_half[i];
  return d < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

__global__ void __launch_bounds__(kThreads) attention_rope_kernel(const RopeAttentionArgs a) {
  allow_dependent_launch();
  extern __shared__ float shared[];
  const int half = a.head_dim / 2;
  float* q_group = shared;                            // [group, head_dim], rotated
  float* cos_half = q_group + a.group * a.head_dim;   // [half]
  float* sin_half = cos_half + half;                  // [half]
  float* scores = sin_half + half;                    // [group, split], then [2, group], then the reduction
  const int kv_head = blockIdx.x, split_index = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first_head = kv_head * a.group;
  // The position is written by the host before the step, not by the previous kernel: read before the wait.
  const int64_t position = *a.position;
  const int64_t n = position + 1;
  const int64_t start = int64_t{split_index} * a.split;
  const int len = static_cast<int>(max(int64_t{0}, min(int64_t{a.split}, n - start)));
  // Past the sequence: nothing to do and nothing written. Split 0 always holds position 0 and waits, so the
  // grid still completes after the kernel it overlaps (programmatic_launch.cuh).
  if (len == 0) return;
  const int64_t kv_stride = int64_t{a.n_kv_heads} * a.head_dim;
  const int64_t head_offset = int64_t{kv_head} * a.head_dim;
  const bool holds_position = position < start + len;  // the last split: it stores this token's key and value
  // The rows of this split written by earlier steps, into L2 while the projections finish: the first and the
  // last byte of each row (a row is 2 head_dim bytes, 256 for head_dim 128: at most two or three 128-byte lines).
  const int cached_rows = holds_position ? len - 1 : len;
  for (int i = threadIdx.x; i < 4 * cached_rows; i += kThreads) {
    const int p = i / 4, part = i % 4;
    const __half* row = (part < 2 ? a.keys : a.values) + (start + p) * kv_stride + head_offset;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + (part % 2 == 0 ? 0 : a.head_dim - 1)));
  }
  if (threadIdx.x < half) {  // cos/sin as rope.cu: float32 angle, double cos/sin rounded to float
    const float angle = __fmul_rn(static_cast<float>(position), a.inv_freq[threadIdx.x]);
    cos_half[threadIdx.x] = static_cast<float>(cos(static_cast<double>(angle)));
    sin_half[threadIdx.x] = static_cast<float>(sin(static_cast<double>(angle)));
  }
  for (int i = threadIdx.x + kThreads; i < half; i += kThreads) {
    const float angle = __fmul_rn(static_cast<float>(position), a.inv_freq[i]);
    cos_half[i] = static_cast<float>(cos(static_cast<double>(angle)));
    sin_half[i] = static_cast<float>(sin(static_cast<double>(angle)));
  }
  __syncthreads();

  // q, k, v are the previous kernel's output.
  wait_for_previous_kernel();
  for (int i = threadIdx.x; i < a.group * a.head_dim; i += kThreads) {
    const int g = i / a.head_dim, d = i % a.head_dim;
    q_group[i] = rotated(a.q + int64_t{first_head + g} * a.head_dim, d, half, cos_half, sin_half);
  }
  if (holds_position) {
    __half* key_row = a.keys + position * kv_stride + head_offset;
    __half* value_row = a.values + position * kv_stride + head_offset;
    for (int d = threadIdx.x; d < a.head_dim; d += kThreads) {
      key_row[d] = __float2half_rn(rotated(a.k + head_offset, d, half, cos_half, sin_half));
      value_row[d] = __float2half_rn(__ldcg(a.v + head_offset + d));
    }
  }
  __syncthreads();  // the rotated queries, and this token's cache row, visible to the whole block

  // Scores, kPositionsPerLoad positions per warp at a time. The cache is read through L2 (.cg): the row just
  // stored is then seen by every thread of the block.
  const __half* key_base = a.keys + start * kv_stride + head_offset;
  for (int p0 = warp * kPositionsPerLoad; p0 < len; p0 += kWarps * kPositionsPerLoad) {
    float key[kPositionsPerLoad][kMaxPerLane];
#pragma unroll
    for (int c = 0; c < kPositionsPerLoad; ++c) {
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int d = lane + 32 * j;
        key[c][j] = p0 + c < len && d < a.head_dim ? __half2float(__ldcg(key_base + (p0 + c) * kv_stride + d)) : 0.0f;
      }
    }
    for (int g = 0; g < a.group; ++g) {
#pragma unroll
      for (int c = 0; c < kPositionsPerLoad; ++c) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j) {
          const int d = lane + 32 * j;
          if (d < a.head_dim) dot = fmaf(q_group[g * a.head_dim + d], key[c][j], dot);
        }
        for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, offset);
        if (lane == 0 && p0 + c < len) scores[g * a.split + p0 + c] = dot * a.scale;
      }
    }
  }
  __syncthreads();

  const int64_t out_base = int64_t{split_index} * a.n_heads + first_head;
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
      __stcg(a.partial_max + out_base + g, m);
      __stcg(a.partial_sum + out_base + g, sum);
    }
  }
  __syncthreads();

  // Values: thread t takes the dims (2 pair, 2 pair + 1), pair = t % (head_dim / 2), and the positions part,
  // part + parts, ... (part = t / (head_dim / 2)): one 4-byte load per position serves every head of the
  // group, and 8 positions' loads are in flight together. The parts' sums meet in shared memory, added in
  // part order (fixed, so results are reproducible).
  const int pairs = half;
  const int parts = kThreads / pairs;  // >= 1: head_dim <= 256
  const int pair = threadIdx.x % pairs, part = threadIdx.x / pairs;
  float* head_max = scores + a.group * a.split;  // [group] (the combine's)
  float* head_total = head_max + a.group;        // [group]
  float* reduction = head_total + a.group;       // [parts, kHeadsPerPass, head_dim]
  const __half* value_base = a.values + start * kv_stride + head_offset + 2 * pair;
  for (int g0 = 0; g0 < a.group; g0 += kHeadsPerPass) {
    if (part < parts) {
      float acc[kHeadsPerPass][2] = {};
#pragma unroll 8
      for (int p = part; p < len; p += parts) {
        const float2 v = __half22float2(__ldcg(reinterpret_cast<const __half2*>(value_base + p * kv_stride)));
#pragma unroll
        for (int j = 0; j < kHeadsPerPass; ++j) {
          if (g0 + j < a.group) {
            const float weight = scores[(g0 + j) * a.split + p];
            acc[j][0] = fmaf(weight, v.x, acc[j][0]);
            acc[j][1] = fmaf(weight, v.y, acc[j][1]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kHeadsPerPass; ++j) {
        reduction[(part * kHeadsPerPass + j) * a.head_dim + 2 * pair] = acc[j][0];
        reduction[(part * kHeadsPerPass + j) * a.head_dim + 2 * pair + 1] = acc[j][1];
      }
    }
    __syncthreads();
    const int heads = min(kHeadsPerPass, a.group - g0);
    for (int i = threadIdx.x; i < heads * a.head_dim; i += kThreads) {
      float sum = 0.0f;
      for (int q = 0; q < parts; ++q) sum += reduction[q * kHeadsPerPass * a.head_dim + i];
      __stcg(a.partial_out + (out_base + g0) * a.head_dim + i, sum);
    }
    __syncthreads();
  }

  // The last split of this KV head to finish combines all of them (the splits holding positions).
  __shared__ bool is_last_block;
  __threadfence();  // partials visible device-wide before this block is counted
  __syncthreads();
  const int n_splits = static_cast<int>((position + a.split) / a.split);
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(a.counters + kv_head, 1u);
    is_last_block = arrived == static_cast<uint32_t>(n_splits - 1);
    if (is_last_block) a.counters[kv_head] = 0;  // every split of this step has arrived: reset for the next
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();
  // attention_combine_kernel's formula: M = max_s m_s, o = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M); a
  // warp per head reduces over the splits (lanes in parallel, a fixed tree order), and each thread's 4
  // elements load every split's partials together.
  for (int g = warp; g < a.group; g += kWarps) {
    const int head = first_head + g;
    float m = -INFINITY;
    for (int s = lane; s < n_splits; s += 32) m = fmaxf(m, __ldcg(a.partial_max + s * a.n_heads + head));
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    float total = 0.0f;
    for (int s = lane; s < n_splits; s += 32) {
      total += __ldcg(a.partial_sum + s * a.n_heads + head) * expf(__ldcg(a.partial_max + s * a.n_heads + head) - m);
    }
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
    if (lane == 0) {
      head_max[g] = m;
      head_total[g] = total;
    }
  }
  __syncthreads();
  constexpr int kCombinePerThread = 4;
  for (int i0 = threadIdx.x; i0 < a.group * a.head_dim; i0 += kThreads * kCombinePerThread) {
    float acc[kCombinePerThread] = {};
#pragma unroll 2
    for (int s = 0; s < n_splits; ++s) {
#pragma unroll
      for (int e = 0; e < kCombinePerThread; ++e) {
        const int i = i0 + e * kThreads;
        if (i < a.group * a.head_dim) {
          const int g = i / a.head_dim, d = i % a.head_dim, head = first_head + g;
          const float weight = expf(__ldcg(a.partial_max + s * a.n_heads + head) - head_max[g]);
          acc[e] = fmaf(__ldcg(a.partial_out + (int64_t{s} * a.n_heads + head) * a.head_dim + d), weight, acc[e]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kCombinePerThread; ++e) {
      const int i = i0 + e * kThreads;
      if (i < a.group * a.head_dim) {
        const int g = i / a.head_dim, d = i % a.head_dim;
        a.out[int64_t{first_head + g} * a.head_dim + d] = acc[e] / head_total[g];
      }
    }
  }
}

// The split actually used: the requested one, bounded so that the scores fit in shared memory.
int64_t effective_split(const DecodeAttentionShape& shape) {
  int64_t split = shape.split_positions > 0 ? shape.split_positions : decode_attention_split(shape.context_length);
  const int64_t group = shape.n_heads / std::max<int64_t>(shape.n_kv_heads, 1);
  // The fused kernel also keeps cos and sin (head_dim floats), two floats per head and the value reduction;
  // both kernels use the same split (and so the same workspace).
  const int64_t fit = (kMaxSharedBytes - (group + 1) * shape.head_dim * 4 - group * 8 - kValueReductionBytes) /
                      std::max<int64_t>(group * 4, 1);
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

Status decode_attention_rope(const float* q, const float* k, const float* v, const float* inv_freq,
                             const int32_t* position, uint16_t* key_cache, uint16_t* value_cache,
                             const DecodeAttentionShape& shape, float* workspace, uint32_t* counters, float* out,
                             Stream stream, bool overlap_previous) {
  const std::string what = "cuda::decode_attention_rope: " + std::to_string(shape.n_heads) + " query heads, " +
                           std::to_string(shape.n_kv_heads) + " KV heads of head_dim " + std::to_string(shape.head_dim);
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.head_dim <= 0 ||
      shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim || shape.context_length <= 0 || shape.n_kv_heads > 65535) {
    return invalid_argument(what + ", context " + std::to_string(shape.context_length) +
                            ": needs n_kv_heads dividing n_heads and an even head_dim of at most " +
                            std::to_string(kMaxHeadDim));
  }
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  if ((group + 1) * shape.head_dim * 4 + group * 12 + kValueReductionBytes > kMaxSharedBytes) {
    return unsupported(what + ": too many query heads per KV head");
  }
  if (!q || !k || !v || !inv_freq || !position || !key_cache || !value_cache || !workspace || !counters || !out) {
    return invalid_argument(what + ": null device pointer");
  }
  const int64_t split = effective_split(shape);
  const int64_t splits = n_splits(shape);
  if (splits > 65535) return unsupported(what + ": " + std::to_string(splits) + " splits");
  float* partial_out = workspace;
  float* partial_max = partial_out + splits * shape.n_heads * shape.head_dim;
  float* partial_sum = partial_max + splits * shape.n_heads;
  const RopeAttentionArgs args{q,
                               k,
                               v,
                               inv_freq,
                               position,
                               reinterpret_cast<__half*>(key_cache),
                               reinterpret_cast<__half*>(value_cache),
                               partial_out,
                               partial_max,
                               partial_sum,
                               counters,
                               out,
                               static_cast<int>(shape.n_heads),
                               static_cast<int>(shape.n_kv_heads),
                               static_cast<int>(shape.head_dim),
                               static_cast<int>(group),
                               static_cast<int>(split),
                               1.0f / std::sqrt(static_cast<float>(shape.head_dim))};
  const size_t shared =
      static_cast<size_t>(((group + 1) * shape.head_dim + group * split + 2 * group) * 4 + kValueReductionBytes);
  const cudaError_t error =
      launch_kernel(attention_rope_kernel, dim3(static_cast<unsigned>(shape.n_kv_heads), static_cast<unsigned>(splits)),
                    dim3(kThreads), shared, stream, overlap_previous, args);
  return cuda_status(error, "decode_attention_rope launch");
}

}  // namespace petrel::cuda
