// kernels/cuda internal: the input stage of gemv_gptq's GemvInput::kAttention build (gemv_gptq.cu): the token
// generator's attention computed inside the o projection's launch, so that the step has no attention kernel
// (and no kernel boundary) between q/k/v and o. Only for files built with CUDA.
//
// Why. The decode step's attention moves almost no bytes (the KV rows of one layer at tg128's lengths are
// ~0.5 MB against o's 8.4 MB of weights) but costs ~6.3 us a layer of an 8B step on the H200, of which ~2.3 us
// are its launch boundary (a second grid to complete before o may start, its blocks' pre-wait staging; probes of
// sessions 19 and 22, docs/PERFORMANCE.md). Session 19's one-launch attempt computed a KV head's attention in
// every o block (16 times over) in large blocks that crowded out the next kernel's; this one computes it once
// per thread-block cluster, spread over the cluster's blocks, in the o GEMV's own blocks (128 threads, the
// GEMV's registers, ~22 KB of shared memory for Llama-3.1-8B).
//
// Layout. The o GEMV's grid is (row tiles, n_kv_heads input slices): slice h is KV head h's query heads
// (group * head_dim inputs). Clusters are `cluster` consecutive row tiles of one slice. The n = position + 1
// positions are cut into chunks of 32; block (rank r of its cluster) computes chunks r, r + cluster, ... as an
// online softmax of the group's heads (warp w: query head w; lane t: position c0 + t; each lane owns head_dim / 32
// value dims), float32 throughout as decode_attention_rope's float32 build. Before the wait for q/k/v, a block
// copies its first chunk's key and value rows into shared memory (cp.async; rows of earlier steps) and computes
// its RoPE cos/sin; after it, it rotates its heads' queries (and, in the block holding the last chunk, this
// token's key, stored as fp16 with the value at row `position` of the caches by the first cluster of the head),
// computes its chunks, and leaves (max, sum, values) per head in its shared memory. After a cluster barrier
// every block merges the states of the cluster's blocks that had chunks (distributed shared memory) into its
// input slice, staged as fp16 in the GEMV's fragment order; the GEMV's main loop follows as for any input. Each
// cluster of a head computes the same attention (at tg128 the KV rows are read once per cluster from L2).
// Precondition (gemv_gptq_attention_supported): head_dim 32, 64 or 128, group <= 4, 4-bit weights.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "petrel/kernels/cuda/async_copy.cuh"
#include "petrel/kernels/cuda/attention_math.cuh"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/rope_math.cuh"

namespace petrel::cuda {

// The kernel arguments of GemvFusion::attention (gemv_gptq.h's GemvAttention), as the device reads them.
struct GemvAttentionArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* inv_freq;
  const int32_t* position;
  __half* keys;
  __half* values;
  int n_kv_heads, head_dim, group;
  int cluster;  // blocks a cluster along the row tiles; 0: not an attention launch
  float scale;  // 1 / sqrt(head_dim)
  int shared_offset;  // bytes of dynamic shared memory before the attention's (the GEMV's staged x)
  int next_launch;    // GemvAttention::NextLaunch: when the next kernel may launch
};

inline constexpr int kAttentionChunk = 32;  // positions a chunk: one a lane
inline constexpr int kAttentionMaxPairs = 2;  // RoPE pairs a lane: head_dim / 2 <= 64
inline constexpr int kAttentionMaxDims = 4;   // value dims a lane: head_dim / 32 <= 4
inline constexpr int kMaxCluster = 8;         // blocks a cluster at most (portable cluster sizes)

// The attention's shared memory, bytes from GemvAttentionArgs::shared_offset (each part 16-byte aligned): the
// rotated queries (float32 [group][head_dim]), one chunk of key rows (fp16, padded by 16 bytes so that the 8
// lanes of a 16-byte load phase hit distinct banks) and value rows, this token's key and value (fp16), and the
// block's softmax state (values float32 [group][head_dim], then max[group], sum[group]) that the cluster reads.
struct GemvAttentionLayout {
  int q, keys, values, token, acc, max_sum, total, key_stride;
};

__host__ __device__ inline int gemv_attention_round16(int bytes) { return (bytes + 15) / 16 * 16; }

__host__ __device__ inline GemvAttentionLayout gemv_attention_layout(int group, int head_dim) {
  GemvAttentionLayout l;
  l.key_stride = head_dim + 8;  // halves
  l.q = 0;
  l.keys = l.q + gemv_attention_round16(group * head_dim * 4);
  l.values = l.keys + gemv_attention_round16(kAttentionChunk * l.key_stride * 2);
  l.token = l.values + gemv_attention_round16(kAttentionChunk * head_dim * 2);
  l.acc = l.token + gemv_attention_round16(2 * head_dim * 2);
  l.max_sum = l.acc + gemv_attention_round16(group * head_dim * 4);
  l.total = l.max_sum + gemv_attention_round16(2 * group * 4);
  return l;
}

// One block's share of its KV head's attention; construct and call prepare() before the wait for the previous
// kernel, run() after it (every thread of the block, every block of the cluster), finish() before the block
// exits. 128 threads a block.
class ClusterAttention {
 public:
  __device__ __forceinline__ ClusterAttention(const GemvAttentionArgs& a, char* shared) : a_(a) {
    base_ = shared + a.shared_offset;
    layout_ = gemv_attention_layout(a.group, a.head_dim);
    kv_head_ = static_cast<int>(blockIdx.y);
    rank_ = static_cast<int>(blockIdx.x) % a.cluster;
    first_cluster_ = static_cast<int>(blockIdx.x) < a.cluster;
  }

  // Before the wait: the position (written by the host before the step), the block's first chunk of keys and
  // values into shared memory (rows of earlier steps: never the previous kernel's), this lane's cos/sin.
  __device__ __forceinline__ void prepare() {
    position_ = int64_t{*a_.position};
    n_ = position_ + 1;
    chunks_ = static_cast<int>((n_ + kAttentionChunk - 1) / kAttentionChunk);
    if (rank_ < chunks_) stage_chunk(rank_);
    const int lane = threadIdx.x % 32, half = a_.head_dim / 2;
    if (lane < half) rope_cos_sin(position_, a_.inv_freq, lane, cos0_, sin0_);
    if (lane + 32 < half) rope_cos_sin(position_, a_.inv_freq, lane + 32, cos1_, sin1_);
  }

  // After the wait: this block's chunks, the cluster's merge, the slice's input staged at x_staged (fp16 in
  // gemv_gptq's 4-bit fragment order: word i = inputs 8i .. 8i + 7 as {x0,x4},{x1,x5},{x2,x6},{x3,x7}).
  __device__ __forceinline__ void run(uint4* x_staged) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    if (rank_ < chunks_) attend();
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's state written (release / acquire over the cluster's shared memory)
    const int slice_words = a_.group * a_.head_dim / 8;
    const int used = min(a_.cluster, chunks_);  // blocks with chunks; their states in rank order
    for (int word = threadIdx.x; word < slice_words; word += blockDim.x) {
      const int g = 8 * word / a_.head_dim, d0 = 8 * word % a_.head_dim;
      // Unrolled over the cluster's largest size with predicates, so that the loads of all ranks go out together
      // (one distributed shared memory round trip for the maxima and sums, one for the values).
      float ms[kMaxCluster], ls[kMaxCluster];
      float m = -INFINITY;
#pragma unroll
      for (int r = 0; r < kMaxCluster; ++r) {
        if (r < used) {
          ms[r] = *cluster.map_shared_rank(max_state() + g, r);
          ls[r] = *cluster.map_shared_rank(sum_state() + g, r);
        }
      }
#pragma unroll
      for (int r = 0; r < kMaxCluster; ++r) {
        if (r < used) m = fmaxf(m, ms[r]);
      }
      float l = 0.0f, x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
      for (int r = 0; r < kMaxCluster; ++r) {
        if (r >= used) break;
        const float w = expf(ms[r] - m);
        l = fmaf(ls[r], w, l);
        const float4* acc = reinterpret_cast<const float4*>(cluster.map_shared_rank(acc_state() + g * a_.head_dim + d0, r));
        const float4 lo = acc[0], hi = acc[1];
        x[0] = fmaf(lo.x, w, x[0]);
        x[1] = fmaf(lo.y, w, x[1]);
        x[2] = fmaf(lo.z, w, x[2]);
        x[3] = fmaf(lo.w, w, x[3]);
        x[4] = fmaf(hi.x, w, x[4]);
        x[5] = fmaf(hi.y, w, x[5]);
        x[6] = fmaf(hi.z, w, x[6]);
        x[7] = fmaf(hi.w, w, x[7]);
      }
      const float inv = 1.0f / l;
      x_staged[word] = make_uint4(ptx::pack_half2(x[0] * inv, x[4] * inv), ptx::pack_half2(x[1] * inv, x[5] * inv),
                                  ptx::pack_half2(x[2] * inv, x[6] * inv), ptx::pack_half2(x[3] * inv, x[7] * inv));
    }
    // The other blocks may still read this block's state: it stays until they have (finish()).
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
    __trap();  // no clusters before Hopper: gemv_gptq_attention_supported refuses the launch
#endif
  }

  // Before the block exits: every block of the cluster is done reading this one's shared memory.
  __device__ __forceinline__ static void finish() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
  }

 private:
  __device__ float* q_rows() const { return reinterpret_cast<float*>(base_ + layout_.q); }
  __device__ __half* key_rows() const { return reinterpret_cast<__half*>(base_ + layout_.keys); }
  __device__ __half* value_rows() const { return reinterpret_cast<__half*>(base_ + layout_.values); }
  __device__ __half* token_rows() const { return reinterpret_cast<__half*>(base_ + layout_.token); }
  __device__ float* acc_state() const { return reinterpret_cast<float*>(base_ + layout_.acc); }
  __device__ float* max_state() const { return reinterpret_cast<float*>(base_ + layout_.max_sum); }
  __device__ float* sum_state() const { return max_state() + a_.group; }

  // Chunk c's key and value rows into shared memory by the block's threads, one cp.async group; the row of
  // `position` (this token's, not yet in the cache) is left for run() to fill.
  __device__ __forceinline__ void stage_chunk(int c) {
    const int64_t c0 = int64_t{c} * kAttentionChunk;
    const int rows = static_cast<int>(min(int64_t{kAttentionChunk}, n_ - c0));
    const int pieces = a_.head_dim / 8;  // 16-byte copies a row
    const int64_t kv_stride = int64_t{a_.n_kv_heads} * a_.head_dim;
    const int64_t head_offset = int64_t{kv_head_} * a_.head_dim;
    for (int i = threadIdx.x; i < 2 * rows * pieces; i += blockDim.x) {
      const bool is_value = i >= rows * pieces;
      const int j = is_value ? i - rows * pieces : i;
      const int r = j / pieces, piece = j % pieces;
      if (c0 + r == position_) continue;
      const __half* src = (is_value ? a_.values : a_.keys) + (c0 + r) * kv_stride + head_offset + 8 * piece;
      __half* dst = is_value ? value_rows() + r * a_.head_dim + 8 * piece : key_rows() + r * layout_.key_stride + 8 * piece;
      cp_async16(dst, src);
    }
    cp_async_commit();
  }

  __device__ __forceinline__ void attend() {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = a_.head_dim / 2;
    const int dims = a_.head_dim / 32;  // value dims a lane: lane * dims .. + dims - 1
    const int last_chunk = chunks_ - 1;
    const bool holds_token = last_chunk % a_.cluster == rank_;
    const int64_t kv_stride = int64_t{a_.n_kv_heads} * a_.head_dim;
    const int64_t head_offset = int64_t{kv_head_} * a_.head_dim;
    // Loads first, all together: the token's key and value (threads 0 .. half - 1 of the block holding it, pair
    // t = their thread index), and warp w's query head.
    const int t = threadIdx.x;
    float2 token_k = make_float2(0, 0), token_v = make_float2(0, 0);
    if (holds_token && t < half) {
      token_k = make_float2(__ldcg(a_.k + head_offset + t), __ldcg(a_.k + head_offset + t + half));
      token_v = make_float2(__ldcg(a_.v + head_offset + t), __ldcg(a_.v + head_offset + t + half));
    }
    float2 q_pair[kAttentionMaxPairs];
    const float* q_head = a_.q + (int64_t{kv_head_} * a_.group + warp) * a_.head_dim;
#pragma unroll
    for (int j = 0; j < kAttentionMaxPairs; ++j) {
      const int i = lane + 32 * j;
      q_pair[j] = warp < a_.group && i < half ? make_float2(__ldcg(q_head + i), __ldcg(q_head + i + half)) : make_float2(0, 0);
    }
    if (warp < a_.group) {
#pragma unroll
      for (int j = 0; j < kAttentionMaxPairs; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
          const float2 r = rotate_pair(q_pair[j].x, q_pair[j].y, j == 0 ? cos0_ : cos1_, j == 0 ? sin0_ : sin1_);
          q_rows()[warp * a_.head_dim + i] = r.x;
          q_rows()[warp * a_.head_dim + i + half] = r.y;
        }
      }
    }
    if (holds_token && t < half) {  // pair t's cos/sin are lane t % 32's pair t / 32
      const float c = t < 32 ? cos0_ : cos1_, s = t < 32 ? sin0_ : sin1_;
      const float2 r = rotate_pair(token_k.x, token_k.y, c, s);
      const __half k0 = __float2half_rn(r.x), k1 = __float2half_rn(r.y);
      const __half v0 = __float2half_rn(token_v.x), v1 = __float2half_rn(token_v.y);
      token_rows()[t] = k0;
      token_rows()[t + half] = k1;
      token_rows()[a_.head_dim + t] = v0;
      token_rows()[a_.head_dim + t + half] = v1;
      if (first_cluster_) {
        __half* key_row = a_.keys + position_ * kv_stride + head_offset;
        __half* value_row = a_.values + position_ * kv_stride + head_offset;
        key_row[t] = k0;
        key_row[t + half] = k1;
        value_row[t] = v0;
        value_row[t + half] = v1;
      }
    }
    float m = -INFINITY, l = 0.0f, acc[kAttentionMaxDims] = {0, 0, 0, 0};
    for (int c = rank_; c < chunks_; c += a_.cluster) {
      const int64_t c0 = int64_t{c} * kAttentionChunk;
      const int rows = static_cast<int>(min(int64_t{kAttentionChunk}, n_ - c0));
      cp_async_wait<0>();
      __syncthreads();  // the rows copied, the queries and this token's row written
      if (c == last_chunk) {  // this token's row into the stage
        const int row = static_cast<int>(position_ - c0);
        for (int i = threadIdx.x; i < a_.head_dim; i += blockDim.x) {
          key_rows()[row * layout_.key_stride + i] = token_rows()[i];
          value_rows()[row * a_.head_dim + i] = token_rows()[a_.head_dim + i];
        }
        __syncthreads();
      }
      if (warp < a_.group) {
        // Scores: lane `lane` takes position c0 + lane.
        float s = -INFINITY;
        if (lane < rows) {
          s = key_dot<true>(q_rows() + warp * a_.head_dim, key_rows() + lane * layout_.key_stride, a_.head_dim) * a_.scale;
        }
        float chunk_max = s;
        for (int offset = 16; offset > 0; offset /= 2) chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xFFFFFFFFu, chunk_max, offset));
        const float m_new = fmaxf(m, chunk_max);
        const float correction = expf(m - m_new);  // 0 on the block's first chunk
        const float p = lane < rows ? expf(s - m_new) : 0.0f;
        float p_sum = p;
        for (int offset = 16; offset > 0; offset /= 2) p_sum += __shfl_xor_sync(0xFFFFFFFFu, p_sum, offset);
        l = l * correction + p_sum;
        m = m_new;
#pragma unroll
        for (int j = 0; j < kAttentionMaxDims; ++j) acc[j] *= correction;
        const __half* value_base = value_rows() + lane * dims;
        for (int u = 0; u < rows; ++u) {
          const float pu = __shfl_sync(0xFFFFFFFFu, p, u);
          const __half* row = value_base + u * a_.head_dim;
          if (dims == 4) {
            const uint2 raw = *reinterpret_cast<const uint2*>(row);
            const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x)),
                         hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
            acc[0] = fmaf(pu, lo.x, acc[0]);
            acc[1] = fmaf(pu, lo.y, acc[1]);
            acc[2] = fmaf(pu, hi.x, acc[2]);
            acc[3] = fmaf(pu, hi.y, acc[3]);
          } else if (dims == 2) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(row));
            acc[0] = fmaf(pu, f.x, acc[0]);
            acc[1] = fmaf(pu, f.y, acc[1]);
          } else {
            acc[0] = fmaf(pu, __half2float(row[0]), acc[0]);
          }
        }
      }
      if (c + a_.cluster < chunks_) {
        __syncthreads();  // every warp done with the stage
        stage_chunk(c + a_.cluster);
      }
    }
    if (warp < a_.group) {
#pragma unroll
      for (int j = 0; j < kAttentionMaxDims; ++j) {
        if (j < dims) acc_state()[warp * a_.head_dim + lane * dims + j] = acc[j];
      }
      if (lane == 0) {
        max_state()[warp] = m;
        sum_state()[warp] = l;
      }
    }
  }

  const GemvAttentionArgs a_;  // a copy: the kernel's parameter, read where used
  char* base_;
  GemvAttentionLayout layout_;
  int kv_head_, rank_;
  bool first_cluster_;
  int64_t position_ = 0, n_ = 0;
  int chunks_ = 0;
  float cos0_ = 1.0f, sin0_ = 0.0f, cos1_ = 1.0f, sin1_ = 0.0f;  // RoPE pairs lane and lane + 32
};

}  // namespace petrel::cuda
