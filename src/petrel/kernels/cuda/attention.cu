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
// Fused kernel (decode_attention_rope, the fused decode step): one launch instead of three (rope_store_kv,
// partial, combine), laid out for latency, since at the lengths the token generator runs at the KV cache is
// small next to the weights (Llama-3.1-8B, 128 positions: 256 KB a layer against 120 MB of W4 weights) and
// what costs is the chain of dependent steps in a block. Block (kv_head, y), y < n_blocks =
// min(ceil(context_length / 32), 32); the n = *position + 1 positions are cut on the device into chunks of 32
// and each block takes an equal run of whole chunks (so at tg128 each of the first few blocks has one chunk and
// the rest return at once). Warp w takes the query heads w, w + 4, ... of the group; per chunk, lane t
// scores position c0 + t (its key row read with 16-byte loads, q broadcast from shared memory), the warp
// updates an online softmax (running max and sum, shuffles), and each lane accumulates its value dims
// (adjacent pairs, 8 rows' loads in flight, each row's weight shuffled from the lane that scored it). No
// block-wide reduction: a warp's heads are its own. In front, each lane computes cos/sin of the RoPE pairs
// it rotates (rope.cu's float32 angle, double cos/sin rounded to float, no FMA contraction), rotates its
// warp's query heads into shared memory and, in the block holding *position, the key, storing it and the
// value as fp16 at that row. Behind, the last block of each KV head to arrive (an atomic counter per KV head,
// reset by that block; partials through L2 as gemv_gptq's split-K) combines the blocks' (max, sum, values);
// a lone block writes the output itself. Before it waits for the projections (programmatic dependent launch,
// programmatic_launch.cuh) a block computes cos/sin and asks its rows into L2. The cache is read with
// ld.global.cg, so the row this block stored is seen by all its threads. split_positions applies to the
// two-launch path only.
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

// The fused kernel (decode_attention_rope): block (kv_head, y) of kThreads threads; warp w works on the query
// heads w, w + kWarps, ... of the KV head's group over the block's positions (see the file comment).
struct RopeAttentionArgs {
  const float* q;  // [n_heads, head_dim], not rotated
  const float* k;  // [n_kv_heads, head_dim], not rotated
  const float* v;  // [n_kv_heads, head_dim]
  const float* inv_freq;
  const int32_t* position;
  __half* keys;
  __half* values;
  float* partial_out;  // [n_blocks, n_heads, head_dim]: unnormalized sums of e^(s - m) v
  float* partial_max;  // [n_blocks, n_heads]: m
  float* partial_sum;  // [n_blocks, n_heads]: sum of e^(s - m)
  uint32_t* counters;  // [n_kv_heads]
  float* out;          // [n_heads, head_dim]
  int n_heads, n_kv_heads, head_dim, group, n_blocks;
  float scale;
};

// Positions a warp scores at once: one per lane.
constexpr int kChunk = 32;
// Blocks per KV head at most: the combine gives each block's partials a lane.
constexpr int kMaxRopeBlocks = 32;
// Key vectors (8 fp16 each) a lane loads before it multiplies them, and value rows a warp loads together.
constexpr int kKeyLoads = 8;
constexpr int kValueLoads = 8;

// rope.cu's angle and cos/sin (float32 angle, double cos/sin rounded to float) of frequency i at `position`.
__device__ __forceinline__ void rope_cos_sin(int64_t position, const float* inv_freq, int i, float& c, float& s) {
  const float angle = __fmul_rn(static_cast<float>(position), inv_freq[i]);
  c = static_cast<float>(cos(static_cast<double>(angle)));
  s = static_cast<float>(sin(static_cast<double>(angle)));
}

// rope.cu's rotation of the pair (x0, x1) = (x[i], x[i + half]), no FMA contraction.
__device__ __forceinline__ float2 rotate_pair(float x0, float x1, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
}

// dot(q, key row) for one lane's position: q float32 in shared memory (every lane reads the same element: a
// broadcast), the key fp16 from the cache, two float32 partial sums.
template <bool kVector8>
__device__ __forceinline__ float key_dot(const float* q, const __half* key, int head_dim) {
  float d0 = 0.0f, d1 = 0.0f;
  if constexpr (kVector8) {  // head_dim % 8 == 0: 16-byte loads, kKeyLoads of them in flight
    const uint4* key8 = reinterpret_cast<const uint4*>(key);
    const float4* q4 = reinterpret_cast<const float4*>(q);
    const int n8 = head_dim / 8;
    for (int b = 0; b < n8; b += kKeyLoads) {
      uint4 raw[kKeyLoads];
#pragma unroll
      for (int u = 0; u < kKeyLoads; ++u) raw[u] = b + u < n8 ? __ldcg(key8 + b + u) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kKeyLoads; ++u) {
        if (b + u < n8) {
          const float4 qa = q4[2 * (b + u)], qb = q4[2 * (b + u) + 1];
          const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&raw[u].x)),
                       k1 = __half22float2(*reinterpret_cast<const __half2*>(&raw[u].y)),
                       k2 = __half22float2(*reinterpret_cast<const __half2*>(&raw[u].z)),
                       k3 = __half22float2(*reinterpret_cast<const __half2*>(&raw[u].w));
          d0 = fmaf(qa.x, k0.x, d0);
          d1 = fmaf(qa.y, k0.y, d1);
          d0 = fmaf(qa.z, k1.x, d0);
          d1 = fmaf(qa.w, k1.y, d1);
          d0 = fmaf(qb.x, k2.x, d0);
          d1 = fmaf(qb.y, k2.y, d1);
          d0 = fmaf(qb.z, k3.x, d0);
          d1 = fmaf(qb.w, k3.y, d1);
        }
      }
    }
  } else {  // any even head_dim: 4-byte loads
    const __half2* key2 = reinterpret_cast<const __half2*>(key);
    for (int i = 0; i < head_dim / 2; ++i) {
      const float2 kf = __half22float2(__ldcg(key2 + i));
      d0 = fmaf(q[2 * i], kf.x, d0);
      d1 = fmaf(q[2 * i + 1], kf.y, d1);
    }
  }
  return d0 + d1;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

// kPairs: value dims a lane owns, in adjacent pairs (2 vp, 2 vp + 1), vp = lane + 32 j, j < kPairs; and RoPE
// pairs (i, i + head_dim / 2), i = lane + 32 j. head_dim / 2 <= 32 kPairs.
template <int kPairs, bool kVector8>
__global__ void __launch_bounds__(kThreads) attention_rope_kernel(const RopeAttentionArgs a) {
  allow_dependent_launch();
  extern __shared__ float4 shared_vectors[];
  float* q_group = reinterpret_cast<float*>(shared_vectors);  // [group, head_dim], rotated
  const int kv_head = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int half = a.head_dim / 2;
  const int first_head = kv_head * a.group;
  // The position is written by the host before the step, not by the previous kernel: read before the wait.
  const int64_t position = *a.position;
  const int64_t n = position + 1;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t chunks_per_block = (chunks + a.n_blocks - 1) / a.n_blocks;
  const int active = static_cast<int>((chunks + chunks_per_block - 1) / chunks_per_block);  // blocks with positions
  // Past the sequence: nothing to do and nothing written. Block y = 0 always has positions and waits, so the
  // grid still completes after the kernel it overlaps (programmatic_launch.cuh).
  if (static_cast<int>(blockIdx.y) >= active) return;
  const int64_t begin = int64_t{blockIdx.y} * chunks_per_block * kChunk;
  const int64_t end = min(n, begin + chunks_per_block * kChunk);
  const bool holds_position = end == n;  // the last active block stores this token's key and value
  const int64_t kv_stride = int64_t{a.n_kv_heads} * a.head_dim;
  const int64_t head_offset = int64_t{kv_head} * a.head_dim;

  // The rows written by earlier steps into L2 while the projections finish: the first and the last byte of
  // each key and value row (2 head_dim bytes: at most three 128-byte lines).
  const int64_t cached_end = holds_position ? end - 1 : end;
  for (int64_t i = threadIdx.x; i < 4 * (cached_end - begin); i += kThreads) {
    const int64_t p = begin + i / 4;
    const int part = static_cast<int>(i % 4);
    const __half* row = (part < 2 ? a.keys : a.values) + p * kv_stride + head_offset;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + (part % 2 == 0 ? 0 : a.head_dim - 1)));
  }
  // cos/sin of the RoPE pairs this lane rotates.
  float cos_pair[kPairs], sin_pair[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    if (i < half) rope_cos_sin(position, a.inv_freq, i, cos_pair[j], sin_pair[j]);
  }

  // q, k, v are the previous kernel's output: read through L2 after the wait.
  wait_for_previous_kernel();
  for (int g = warp; g < a.group; g += kWarps) {
    const float* q_head = a.q + int64_t{first_head + g} * a.head_dim;
    float* rotated = q_group + g * a.head_dim;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      if (i < half) {
        const float2 r = rotate_pair(__ldcg(q_head + i), __ldcg(q_head + i + half), cos_pair[j], sin_pair[j]);
        rotated[i] = r.x;
        rotated[i + half] = r.y;
      }
    }
  }
  if (holds_position && warp == 0) {
    __half* key_row = a.keys + position * kv_stride + head_offset;
    __half* value_row = a.values + position * kv_stride + head_offset;
    const float* k_head = a.k + head_offset;
    const float* v_head = a.v + head_offset;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      if (i < half) {
        const float2 r = rotate_pair(__ldcg(k_head + i), __ldcg(k_head + i + half), cos_pair[j], sin_pair[j]);
        key_row[i] = __float2half_rn(r.x);
        key_row[i + half] = __float2half_rn(r.y);
        value_row[i] = __float2half_rn(__ldcg(v_head + i));
        value_row[i + half] = __float2half_rn(__ldcg(v_head + i + half));
      }
    }
  }
  __syncthreads();  // the rotated queries, and this token's cache row, visible to the whole block

  const int64_t out_row = int64_t{blockIdx.y} * a.n_heads + first_head;  // this block's partials of head 0
  for (int g = warp; g < a.group; g += kWarps) {
    const float* q = q_group + g * a.head_dim;
    float m = -INFINITY, l = 0.0f;
    float2 acc[kPairs];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) acc[j] = make_float2(0.0f, 0.0f);
    for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
      // Scores: lane t takes position c0 + t (lane 0 always has one).
      const int64_t p = c0 + lane;
      const bool valid = p < end;
      const float s = valid ? key_dot<kVector8>(q, a.keys + p * kv_stride + head_offset, a.head_dim) * a.scale : -INFINITY;
      // Online softmax: the running max and sum and the value sums rescaled to the new max.
      const float m_new = fmaxf(m, warp_max(s));
      const float correction = expf(m - m_new);  // 0 on the first chunk (m = -inf)
      const float prob = valid ? expf(s - m_new) : 0.0f;
      l = l * correction + warp_sum(prob);
      m = m_new;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) acc[j] = make_float2(acc[j].x * correction, acc[j].y * correction);
      // Values: kValueLoads rows' loads in flight, then each row's weight from the lane that scored it.
      const int count = static_cast<int>(min(int64_t{kChunk}, end - c0));
      const __half* value_base = a.values + c0 * kv_stride + head_offset;
      for (int t0 = 0; t0 < count; t0 += kValueLoads) {
        __half2 row[kValueLoads][kPairs];
#pragma unroll
        for (int u = 0; u < kValueLoads; ++u) {
#pragma unroll
          for (int j = 0; j < kPairs; ++j) {
            const int vp = lane + 32 * j;
            row[u][j] = t0 + u < count && vp < half
                            ? __ldcg(reinterpret_cast<const __half2*>(value_base + (t0 + u) * kv_stride) + vp)
                            : __float2half2_rn(0.0f);
          }
        }
#pragma unroll
        for (int u = 0; u < kValueLoads; ++u) {
          const float weight = __shfl_sync(0xFFFFFFFFu, prob, t0 + u);  // 0 past count
#pragma unroll
          for (int j = 0; j < kPairs; ++j) {
            const float2 vf = __half22float2(row[u][j]);
            acc[j] = make_float2(fmaf(weight, vf.x, acc[j].x), fmaf(weight, vf.y, acc[j].y));
          }
        }
      }
    }
    if (active == 1) {  // the only block: normalize and write the output, no partials
      const float inv = 1.0f / l;
      float* o = a.out + int64_t{first_head + g} * a.head_dim;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int vp = lane + 32 * j;
        if (vp < half) reinterpret_cast<float2*>(o)[vp] = make_float2(acc[j].x * inv, acc[j].y * inv);
      }
    } else {
      float* o = a.partial_out + (out_row + g) * a.head_dim;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int vp = lane + 32 * j;
        if (vp < half) __stcg(reinterpret_cast<float2*>(o) + vp, acc[j]);
      }
      if (lane == 0) {
        __stcg(a.partial_max + out_row + g, m);
        __stcg(a.partial_sum + out_row + g, l);
      }
    }
  }
  if (active == 1) return;

  // The last block of this KV head to finish combines the active blocks' partials.
  __shared__ bool is_last_block;
  __threadfence();  // partials visible device-wide before this block is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(a.counters + kv_head, 1u);
    is_last_block = arrived == static_cast<uint32_t>(active - 1);
    if (is_last_block) a.counters[kv_head] = 0;  // every block of this step has arrived: reset for the next
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();
  // attention_combine_kernel's formula: M = max_b m_b, o = sum_b o_b e^(m_b - M) / sum_b l_b e^(m_b - M); a warp
  // per head, lane b holds block b's max and sum (active <= kMaxRopeBlocks = 32).
  for (int g = warp; g < a.group; g += kWarps) {
    const int head = first_head + g;
    const float mb = lane < active ? __ldcg(a.partial_max + int64_t{lane} * a.n_heads + head) : -INFINITY;
    const float lb = lane < active ? __ldcg(a.partial_sum + int64_t{lane} * a.n_heads + head) : 0.0f;
    const float max_all = warp_max(mb);
    const float wb = lane < active ? expf(mb - max_all) : 0.0f;
    const float inv_total = 1.0f / warp_sum(lb * wb);
    float2 o[kPairs];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) o[j] = make_float2(0.0f, 0.0f);
#pragma unroll 4
    for (int b = 0; b < active; ++b) {
      const float weight = __shfl_sync(0xFFFFFFFFu, wb, b);
      const float2* part = reinterpret_cast<const float2*>(a.partial_out + (int64_t{b} * a.n_heads + head) * a.head_dim);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int vp = lane + 32 * j;
        if (vp < half) {
          const float2 po = __ldcg(part + vp);
          o[j] = make_float2(fmaf(po.x, weight, o[j].x), fmaf(po.y, weight, o[j].y));
        }
      }
    }
    float* out = a.out + int64_t{head} * a.head_dim;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int vp = lane + 32 * j;
      if (vp < half) reinterpret_cast<float2*>(out)[vp] = make_float2(o[j].x * inv_total, o[j].y * inv_total);
    }
  }
}

// Blocks per KV head of the fused kernel for a cache of context_length positions.
int fused_blocks(int64_t context_length) {
  return static_cast<int>(std::clamp<int64_t>((context_length + kChunk - 1) / kChunk, 1, kMaxRopeBlocks));
}

// The split of the two-launch path actually used: the requested one, bounded so that the scores fit in shared
// memory.
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
  // Per split (two launches) or per block (fused) and query head: head_dim sums, the max and the sum.
  return std::max<int64_t>(n_splits(shape), fused_blocks(shape.context_length)) * shape.n_heads * (shape.head_dim + 2);
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
  if (group * shape.head_dim * 4 > kMaxSharedBytes) return unsupported(what + ": too many query heads per KV head");
  if (!q || !k || !v || !inv_freq || !position || !key_cache || !value_cache || !workspace || !counters || !out) {
    return invalid_argument(what + ": null device pointer");
  }
  const int blocks = fused_blocks(shape.context_length);
  const int64_t n_blocks_all = std::max<int64_t>(n_splits(shape), blocks);  // the workspace's layout
  float* partial_out = workspace;
  float* partial_max = partial_out + n_blocks_all * shape.n_heads * shape.head_dim;
  float* partial_sum = partial_max + n_blocks_all * shape.n_heads;
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
                               blocks,
                               1.0f / std::sqrt(static_cast<float>(shape.head_dim))};
  const size_t shared = static_cast<size_t>(group * shape.head_dim * 4);
  const dim3 grid(static_cast<unsigned>(shape.n_kv_heads), static_cast<unsigned>(blocks));
  const int half = static_cast<int>(shape.head_dim / 2);
  const bool vector8 = shape.head_dim % 8 == 0;
  cudaError_t error;
  if (half <= 32) {
    error = vector8 ? launch_kernel(attention_rope_kernel<1, true>, grid, dim3(kThreads), shared, stream, overlap_previous, args)
                    : launch_kernel(attention_rope_kernel<1, false>, grid, dim3(kThreads), shared, stream, overlap_previous, args);
  } else if (half <= 64) {
    error = vector8 ? launch_kernel(attention_rope_kernel<2, true>, grid, dim3(kThreads), shared, stream, overlap_previous, args)
                    : launch_kernel(attention_rope_kernel<2, false>, grid, dim3(kThreads), shared, stream, overlap_previous, args);
  } else {
    error = vector8 ? launch_kernel(attention_rope_kernel<4, true>, grid, dim3(kThreads), shared, stream, overlap_previous, args)
                    : launch_kernel(attention_rope_kernel<4, false>, grid, dim3(kThreads), shared, stream, overlap_previous, args);
  }
  return cuda_status(error, "decode_attention_rope launch");
}

}  // namespace petrel::cuda
