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
// what costs is the chain of dependent memory round trips in a block. Block (kv_head, y), y < n_blocks =
// min(ceil(context_length / 32), 32, DecodeAttentionShape::fused_max_blocks if set; if not, cut so that the grid
// fits on the GPU at once: decode_attention_one_wave_blocks, +3.6% tg64 after 8,000 tokens), of `slots` quads of
// warps (4 where the context has 3 or more chunks: 512 threads); the n = *position + 1 positions are cut on the
// device into chunks of 32 and each block takes an equal run of whole chunks, at least `slots` of them (so at
// tg128's lengths, up to 128 positions, one block per KV head does everything and the others return at once).
// Slot s takes the block's chunks s, s + slots, ... (one "round" of chunks at a time, all slots in parallel), and
// the slots' softmax states are merged in shared memory at the end: more warps on the latency chain of a chunk,
// and no combine through L2 below 129 positions.
//  - First, before it waits for the projections (programmatic dependent launch, programmatic_launch.cuh), a
//    block copies its first one or two rounds of keys and values into shared memory with cp.async (8 16-byte
//    copies a thread, all in flight together; rows written by earlier steps, never the previous kernel) and
//    computes the cos/sin of the RoPE pairs each lane rotates (rope.cu's float32 angle, double cos/sin rounded
//    to float, no FMA contraction).
//  - After the wait it rotates its query heads into shared memory and, in the block holding *position, this
//    token's key, storing key and value as fp16 at that row of the cache and in shared memory.
//  - Per chunk, warp w of the slot takes the query heads w, w + 4, ... of the group: lane t scores position c0 + t (key row
//    from shared memory, padded by 16 bytes so that 16-byte loads do not conflict), the warp updates an online
//    softmax (running max and sum, shuffles) and each lane accumulates its value dims (adjacent pairs, row u's
//    weight shuffled from lane u). A head's running state stays in registers within a chunk and in shared
//    memory between chunks; the next round's copies are in flight meanwhile (two stage buffers a slot where a
//    block can have several rounds, past 4,096 positions of context, and shared memory allows; else one).
//  - The tensor-core build (the default for decode where head_dim is 32, 64 or 128 and a KV head has at most 16
//    query heads; DecodeAttentionShape::tensor_cores, chunks_with_mma): a slot is one warp (blocks of 32 x slots
//    threads), which scores its chunk for all the group's heads at once with mma.sync (the heads are the M rows,
//    32 positions four N tiles, head_dim the K steps), keeps their online softmax in the accumulators' layout and
//    weighs the values with mma.sync too (the probabilities' fp16 accumulator tiles are the A fragments; values
//    through ldmatrix.trans), its state in registers across its chunks. q and the probabilities are rounded to
//    fp16 (relative error ~2e-4 against ~2e-6 for the float32 build). Against the float32 build (Llama-3.1-8B,
//    H200, 2026-12-04, docs/PERFORMANCE.md session 18): tg64 after an 8,000-token prompt 368 -> 392 tok/s, after
//    2,000 488 -> 519; tg128 from an empty cache the same per channel, +0.3% at group 128 (the attention
//    kernel's share of a layer 6.9 -> 6.4 us, absorbed by the GEMVs around it).
//  - Then the slots' states are merged per head (M = max m_s, l = sum l_s e^(m_s - M), the values likewise),
//    and written as the output (one block) or as the block's partials.
//  - The warm pass (the tensor-core build's default, attention_rope_warm_kernel; session 27): before its wait a
//    block also runs its first round's chunk code and the merge once on the staged rows and stale queries,
//    writing only shared memory, in the same loop body as the real pass after the wait, so that the real pass
//    runs from warm instruction caches; its registers are capped so that it starts beside q/k/v's blocks, and it
//    lets o launch only after its wait. The kernel's share of a tg128 layer 6.8 -> 5.1 us, the step +0.5 to +0.9%.
//  - Behind, the last block of each KV head to arrive (an atomic counter per KV head, reset by that block;
//    partials through L2 as gemv_gptq's split-K) combines the blocks' (max, sum, values); a lone block writes
//    the output itself.
// History (Llama-3.1-8B on an H200, per call in a graph at tg128's average of 64 positions): the first fused
// version, one block per (KV head, 32-position split) with a block-wide softmax, took 23.4 us, more than the
// two-launch pair (16.5); the online softmax over lane-per-position chunks read from L2 took 9.4 us (7.4
// overlapped with the q/k/v GEMV); staging the chunk in shared memory before the wait, 8.0 us (5.1 overlapped);
// four chunk slots a block (session 13): tg128 +2% for the whole step (rope_config says more).
// split_positions applies to the two-launch path only.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <mutex>

#include "petrel/kernels/cuda/async_copy.cuh"
#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/rope_math.cuh"
#include "petrel/kernels/cuda/timeline.cuh"

namespace petrel::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxPerLane = kMaxHeadDim / 32;
constexpr int64_t kMaxSharedBytes = 48 * 1024;  // the default dynamic limit, no opt-in needed

// Max and sum over the 32 lanes of a warp (butterfly shuffles: every lane gets the result).
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

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
      dot = warp_sum(dot);
      if (lane == 0) scores[g * a.split + p] = dot * a.scale;
    }
  }
  __syncthreads();

  for (int g = warp; g < a.group; g += kWarps) {
    float* s = scores + g * a.split;
    float m = -INFINITY;
    for (int p = lane; p < len; p += 32) m = fmaxf(m, s[p]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int p = lane; p < len; p += 32) {
      const float e = expf(s[p] - m);
      s[p] = e;
      sum += e;
    }
    sum = warp_sum(sum);
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
  float* out;          // [n_heads, head_dim]; prefill: [n_tokens, n_heads, head_dim]
  int64_t start;       // prefill: the position of token 0 (blockIdx.z)
  int n_heads, n_kv_heads, head_dim, group, n_blocks, stages;
  int slots;  // chunks a block works on at once, one per quad of warps (blockDim.x = kThreads * slots)
  float scale;
  TimelineRing timeline;  // read only by the kTimeline instantiations (timeline.h)
};

// Positions a warp scores at once: one per lane; also the rows of one staged chunk.
constexpr int kChunk = 32;
// Blocks per KV head at most: the combine gives each block's partials a lane.
constexpr int kMaxRopeBlocks = 32;
// Chunk slots of a block at most: kThreads threads (4 warps) per slot, or one warp in the tensor-core build.
constexpr int kMaxRopeSlots = 4;
// The tensor-core build: query heads of a KV head at most (the M rows of the score and value products).
constexpr int kMmaHeads = 16;

// Four 8x8 fp16 matrices from shared memory: lane L gives the address of row L % 8 of matrix L / 8, register i
// receives matrix i, thread t its elements (t / 4, 2 (t % 4) + {0, 1}); kTranspose: (2 (t % 4) + {0, 1}, t / 4).
template <bool kTranspose = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address) : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address) : "memory");
  }
}

// The fused kernel's shared memory, in bytes from the start (each part 16-byte aligned): the rotated queries
// of the group (float32), each slot's running softmax state of each head (values, max, sum), this token's key
// and value (fp16, as stored), and `stages` x `slots` buffers of one chunk of keys (rows padded by 16 bytes, so
// that the 8 lanes of a 16-byte shared load phase hit distinct banks) and values.
// The tensor-core build (kMma, below) keeps the queries as fp16 rows of the A operand instead ([16][key_stride],
// rows past the group zero) and pads the value rows as the key rows (ldmatrix.trans reads 8 rows at once).
struct RopeSharedLayout {
  int64_t q, acc, max_sum, token, stage, key_stride, value_stride, stage_bytes, total;
};

__host__ __device__ inline int64_t round16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

__host__ __device__ inline RopeSharedLayout rope_shared_layout(int64_t group, int64_t head_dim, int64_t stages,
                                                                int64_t slots, bool mma) {
  RopeSharedLayout l;
  l.key_stride = head_dim % 8 == 0 ? head_dim + 8 : head_dim + 2;  // halves
  l.value_stride = mma ? l.key_stride : head_dim;
  l.q = 0;
  l.acc = l.q + round16(mma ? kMmaHeads * l.key_stride * 2 : group * head_dim * 4);  // [slots][group][head_dim]
  l.max_sum = l.acc + round16(slots * group * head_dim * 4);  // [slots][2][group]
  l.token = l.max_sum + round16(slots * 2 * group * 4);
  l.stage = l.token + round16(2 * head_dim * 2);
  l.stage_bytes = round16(kChunk * l.key_stride * 2) + round16(kChunk * l.value_stride * 2);  // buffer b of slot s: b * slots + s
  l.total = l.stage + stages * slots * l.stage_bytes;
  return l;
}

// dot(q, key row) for one lane's position, both in shared memory: q float32 (every lane reads the same
// element: a broadcast), the key fp16; two float32 partial sums.
template <bool kVector8>
__device__ __forceinline__ float key_dot(const float* q, const __half* key, int head_dim) {
  float d0 = 0.0f, d1 = 0.0f;
  if constexpr (kVector8) {  // head_dim % 8 == 0: 16-byte loads
    const uint4* key8 = reinterpret_cast<const uint4*>(key);
    const float4* q4 = reinterpret_cast<const float4*>(q);
#pragma unroll 4
    for (int b = 0; b < head_dim / 8; ++b) {
      const uint4 raw = key8[b];
      const float4 qa = q4[2 * b], qb = q4[2 * b + 1];
      const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&raw.x)),
                   k1 = __half22float2(*reinterpret_cast<const __half2*>(&raw.y)),
                   k2 = __half22float2(*reinterpret_cast<const __half2*>(&raw.z)),
                   k3 = __half22float2(*reinterpret_cast<const __half2*>(&raw.w));
      d0 = fmaf(qa.x, k0.x, d0);
      d1 = fmaf(qa.y, k0.y, d1);
      d0 = fmaf(qa.z, k1.x, d0);
      d1 = fmaf(qa.w, k1.y, d1);
      d0 = fmaf(qb.x, k2.x, d0);
      d1 = fmaf(qb.y, k2.y, d1);
      d0 = fmaf(qb.z, k3.x, d0);
      d1 = fmaf(qb.w, k3.y, d1);
    }
  } else {  // any even head_dim: 4-byte loads
    const __half2* key2 = reinterpret_cast<const __half2*>(key);
    for (int i = 0; i < head_dim / 2; ++i) {
      const float2 kf = __half22float2(key2[i]);
      d0 = fmaf(q[2 * i], kf.x, d0);
      d1 = fmaf(q[2 * i + 1], kf.y, d1);
    }
  }
  return d0 + d1;
}

// The tensor-core build's chunks (attention_rope_block with kMma = head_dim): warp `slot` takes the block's chunks
// slot, slot + slots, ... (one a round, staged as in the scalar build) and keeps one online softmax for all the
// group's heads in registers, as mma.sync (m16n8k16, fp16 in, float32 sums) fragments:
//  - scores S = Q K^T: M = the group's heads (rows past it are zeros), N = 8 positions a tile (4 tiles a chunk),
//    K = head_dim in steps of 16; Q's A fragments are loaded once, K's B fragments with ldmatrix from the key rows
//    (a position's row is a column of B, as stored);
//  - softmax per head: thread t holds rows t / 4 and t / 4 + 8 of every tile, the row's max is reduced over the 4
//    threads that share it (shuffles), each thread keeps its share of the sum until the end;
//  - values O += P V: M = heads, N = 8 dims a tile (head_dim / 8 tiles), K = 16 positions; P's A fragments are
//    the score tiles' accumulators rounded to fp16 (tiles 2t and 2t + 1 are k-step t: an accumulator's layout is
//    an A fragment's), V's B fragments come from the value rows through ldmatrix.trans.
// Numerics: q and the probabilities rounded to fp16 (keys and values are fp16 already), float32 sums: relative
// error ~1e-4 against the float32 scalar build (tests/kernels_cuda_test.cc), as any fp16 tensor-core attention.
// At the end each head's state (max, sum, values) goes to the slot's shared memory for the block's merge.
template <int kMma, bool kTimeline, class StageChunk, class Stamp>
__device__ __forceinline__ void chunks_with_mma(const RopeAttentionArgs& a, const RopeSharedLayout& layout,
                                                char* shared_bytes, const __half* q_rows, const __half* token_key,
                                                const __half* token_value, int rounds, int n_chunks, int64_t begin,
                                                int64_t end, int64_t own_row, int slot, int lane, float* acc_state,
                                                float* max_state, float* sum_state, StageChunk& stage_chunk, Stamp& stamp) {
  constexpr int kSteps = kMma / 16;       // k-steps of the scores, pairs of value tiles
  constexpr int kTiles = kMma / 8;        // value tiles of 8 dims
  constexpr int kScoreTiles = kChunk / 8;  // score tiles of 8 positions
  const int quad_row = lane / 4, quad_col = lane % 4;
  uint32_t qa[kSteps][4];
  float o[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows quad_row and quad_row + 8
  for (int r = 0; r < rounds; ++r) {
    if (a.stages == 2) cp_async_wait<1>();  // round r's group done (round r + 1's may be in flight)
    else cp_async_wait<0>();
    __syncthreads();  // every thread's copies, the rotated queries and this token's row visible to the block
    if (r == 0) {
      stamp(3);
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        ldmatrix_x4(qa[ks], q_rows + (lane % 16) * layout.key_stride + 16 * ks + (lane / 16) * 8);
      }
    }
    const int c = r * a.slots + slot;
    char* stage = shared_bytes + layout.stage + ((r % a.stages) * a.slots + slot) * layout.stage_bytes;
    __half* key_rows = reinterpret_cast<__half*>(stage);
    __half* value_rows = reinterpret_cast<__half*>(stage + round16(kChunk * layout.key_stride * 2));
    const int64_t c0 = begin + int64_t{c} * kChunk;
    const int count = c < n_chunks ? static_cast<int>(min(int64_t{kChunk}, end - c0)) : 0;
    if (count > 0) {
      if (own_row >= c0 && own_row < c0 + count) {  // this token's row, stored after the wait: into the stage
        const int row = static_cast<int>(own_row - c0);
        constexpr int kPieces = kMma / 8;
        for (int i = lane; i < 2 * kPieces; i += 32) {
          const bool is_value = i >= kPieces;
          const int piece = is_value ? i - kPieces : i;
          __half* dst = is_value ? value_rows + row * layout.value_stride : key_rows + row * layout.key_stride;
          reinterpret_cast<uint4*>(dst)[piece] = reinterpret_cast<const uint4*>(is_value ? token_value : token_key)[piece];
        }
        __syncwarp();
      }
      float s[kScoreTiles][4];
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
        for (int p = 0; p < kScoreTiles / 2; ++p) {
          uint32_t b[4];  // positions 16 p .. 16 p + 7 and + 8 .. + 15, dims 16 ks .. + 7 and + 8 .. + 15
          ldmatrix_x4(b, key_rows + (16 * p + (lane / 16) * 8 + lane % 8) * layout.key_stride + 16 * ks + ((lane / 8) % 2) * 8);
          ptx::mma_m16n8k16(s[2 * p], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[0], b[1]);
          ptx::mma_m16n8k16(s[2 * p + 1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[2], b[3]);
        }
      }
      float max0 = -INFINITY, max1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool valid = 8 * j + 2 * quad_col + (e & 1) < count;
          s[j][e] = valid ? s[j][e] * a.scale : -INFINITY;
        }
        max0 = fmaxf(max0, fmaxf(s[j][0], s[j][1]));
        max1 = fmaxf(max1, fmaxf(s[j][2], s[j][3]));
      }
#pragma unroll
      for (int offset = 1; offset < 4; offset *= 2) {
        max0 = fmaxf(max0, __shfl_xor_sync(0xFFFFFFFFu, max0, offset));
        max1 = fmaxf(max1, __shfl_xor_sync(0xFFFFFFFFu, max1, offset));
      }
      const float new0 = fmaxf(m0, max0), new1 = fmaxf(m1, max1);
      const float correction0 = expf(m0 - new0), correction1 = expf(m1 - new1);  // 0 on the first chunk
      m0 = new0;
      m1 = new1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j) {
        s[j][0] = expf(s[j][0] - new0);
        s[j][1] = expf(s[j][1] - new0);
        s[j][2] = expf(s[j][2] - new1);
        s[j][3] = expf(s[j][3] - new1);
        sum0 += s[j][0] + s[j][1];
        sum1 += s[j][2] + s[j][3];
      }
      l0 = l0 * correction0 + sum0;
      l1 = l1 * correction1 + sum1;
      if (r == 0) stamp(4);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        o[j][0] *= correction0;
        o[j][1] *= correction0;
        o[j][2] *= correction1;
        o[j][3] *= correction1;
      }
#pragma unroll
      for (int t = 0; t < kScoreTiles / 2; ++t) {
        const uint32_t p0 = ptx::pack_half2(s[2 * t][0], s[2 * t][1]), p1 = ptx::pack_half2(s[2 * t][2], s[2 * t][3]),
                       p2 = ptx::pack_half2(s[2 * t + 1][0], s[2 * t + 1][1]),
                       p3 = ptx::pack_half2(s[2 * t + 1][2], s[2 * t + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kSteps; ++dp) {
          uint32_t b[4];  // positions 16 t .. + 7 and + 8 .. + 15 of dims 16 dp .. + 7, then of dims + 8 .. + 15
          ldmatrix_x4<true>(b, value_rows + (16 * t + lane % 8 + ((lane / 8) % 2) * 8) * layout.value_stride + 16 * dp +
                                  (lane / 16) * 8);
          ptx::mma_m16n8k16(o[2 * dp], p0, p1, p2, p3, b[0], b[1]);
          ptx::mma_m16n8k16(o[2 * dp + 1], p0, p1, p2, p3, b[2], b[3]);
        }
      }
      if (r == 0) stamp(5);
    }
    if (r + a.stages < rounds) {
      __syncthreads();  // every warp is done with this buffer
      stage_chunk(r + a.stages, r % a.stages);
    } else {
      cp_async_commit();
    }
  }
#pragma unroll
  for (int offset = 1; offset < 4; offset *= 2) {
    l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, offset);
    l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, offset);
  }
  if (slot >= n_chunks) return;  // a slot without chunks: left out of the merge
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int g = quad_row + 8 * h;
    if (g >= a.group) continue;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      reinterpret_cast<float2*>(acc_state + g * kMma + 8 * j)[quad_col] = make_float2(o[j][2 * h], o[j][2 * h + 1]);
    }
    if (quad_col == 0) {
      max_state[g] = h == 0 ? m0 : m1;
      sum_state[g] = h == 0 ? l0 : l1;
    }
  }
}

// kPairs: value dims a lane owns, in adjacent pairs (2 vp, 2 vp + 1), vp = lane + 32 j, j < kPairs; and RoPE
// pairs (i, i + head_dim / 2), i = lane + 32 j. head_dim / 2 <= 32 kPairs.
// kPrefill (prefill_attention_short): token blockIdx.z of a prompt at position start + blockIdx.z, its query
// rows already rotated and every key and value row already in the cache; no RoPE, no store, n_blocks = 1.
// kMma (decode only; 0: the scalar build): head_dim = kMma (a multiple of 16), at most kMmaHeads query heads a KV
// head; a slot is one warp that scores and weighs its chunks for all the group's heads with mma.sync (see the
// file comment).
// The kernel's work (attention_rope_kernel below); kTimeline: thread 0 stamps `stamps` 1 to 7 (timeline.h).
// kWarm (the tensor-core decode build's default: attention_rope_warm_kernel, DecodeAttentionShape::warm_code):
// before its wait a block runs its chunk and merge code once on the staged rows and stale queries, writing only
// shared memory, so that after the wait the same instructions run from warm instruction caches (code a block runs
// once a layer is otherwise fetched from L2 as it goes: session 18 measured the values 3x slower the first time);
// and it lets the next kernel launch only after its wait (earlier, o's blocks start during q/k/v and slow the warm
// pass and q/k/v: measured -2%).
template <int kPairs, bool kVector8, bool kPrefill, bool kTimeline, int kMma = 0, bool kWarm = false>
__device__ __forceinline__ void attention_rope_block(const RopeAttentionArgs& a, uint64_t (&stamps)[kTimelineStamps]) {
  constexpr bool kTensorCores = kMma > 0;
  static_assert(!kTensorCores || (!kPrefill && kVector8 && kMma % 16 == 0 && kMma / 2 <= 32 * kPairs));
  static_assert(!kWarm || kTensorCores, "the warm pass is the tensor-core decode build's");
  constexpr int kSlotThreads = kTensorCores ? 32 : kThreads;  // threads a chunk slot
  constexpr int kSlotWarps = kSlotThreads / 32;
  auto stamp = [&](int i) {
    if constexpr (kTimeline) {
      if (threadIdx.x == 0) stamps[i] = timeline_now();
    }
  };
  if constexpr (!kWarm) allow_dependent_launch();
  extern __shared__ float4 shared_vectors[];
  char* shared_bytes = reinterpret_cast<char*>(shared_vectors);
  const RopeSharedLayout layout = rope_shared_layout(a.group, a.head_dim, a.stages, a.slots, kTensorCores);
  float* q_group = reinterpret_cast<float*>(shared_bytes + layout.q);          // [group, head_dim], rotated
  __half* token_key = reinterpret_cast<__half*>(shared_bytes + layout.token);  // [head_dim]
  __half* token_value = token_key + a.head_dim;                                // [head_dim]
  const int kv_head = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  // This thread's slot: its quad of warps (its warp) works on chunks slot, slot + slots, ... of the block's positions.
  const int slot = warp / kSlotWarps, slot_warp = warp % kSlotWarps, slot_thread = threadIdx.x % kSlotThreads;
  float* acc_state = reinterpret_cast<float*>(shared_bytes + layout.acc) + slot * a.group * a.head_dim;  // [group, head_dim]
  float* max_state = reinterpret_cast<float*>(shared_bytes + layout.max_sum) + slot * 2 * a.group;      // [group]
  float* sum_state = max_state + a.group;                                                                // [group]
  const int half = a.head_dim / 2;
  const int first_head = kv_head * a.group;
  // The position is written by the host before the step, not by the previous kernel: read before the wait.
  const int64_t position = kPrefill ? a.start + blockIdx.z : int64_t{*a.position};
  // The row this block writes and keeps in shared memory (token_key, token_value); none in prefill.
  const int64_t own_row = kPrefill ? -1 : position;
  const int64_t n = position + 1;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // At least a chunk per slot before the positions spread over more blocks: slots merge in shared memory, blocks
  // through L2 and an arrival counter.
  const int64_t chunks_per_block = max(int64_t{a.slots}, (chunks + a.n_blocks - 1) / a.n_blocks);
  const int active = static_cast<int>((chunks + chunks_per_block - 1) / chunks_per_block);  // blocks with positions
  // Past the sequence: nothing to do and nothing written. Block y = 0 always has positions and waits, so the
  // grid still completes after the kernel it overlaps (programmatic_launch.cuh).
  if (static_cast<int>(blockIdx.y) >= active) return;
  const int64_t begin = int64_t{blockIdx.y} * chunks_per_block * kChunk;
  const int64_t end = min(n, begin + chunks_per_block * kChunk);
  const int n_chunks = static_cast<int>((end - begin + kChunk - 1) / kChunk);
  const int rounds = (n_chunks + a.slots - 1) / a.slots;  // chunk round * slots + slot in round `round`
  const bool holds_position = end == n;  // the last active block stores this token's key and value
  const int64_t kv_stride = int64_t{a.n_kv_heads} * a.head_dim;
  const int64_t head_offset = int64_t{kv_head} * a.head_dim;

  // This slot's chunk of round r of the block's positions into its stage buffer `buffer`, copied by the slot's
  // threads, one cp.async group (empty past the last chunk, so that every thread counts one group a round).
  // The row of *position is skipped: this block writes it (token_key, token_value). The other rows were written
  // by the attention kernels of earlier decode steps (or by the prompt processor), each in a step that
  // completed before this one was launched, so they may be read before the wait for the previous kernel.
  const int pieces = kVector8 ? a.head_dim / 8 : a.head_dim / 2;  // copies per row
  auto stage_chunk = [&](int r, int buffer) {
    const int c = r * a.slots + slot;
    if (c >= n_chunks) {
      cp_async_commit();
      return;
    }
    char* stage = shared_bytes + layout.stage + (buffer * a.slots + slot) * layout.stage_bytes;
    __half* key_rows = reinterpret_cast<__half*>(stage);
    __half* value_rows = reinterpret_cast<__half*>(stage + round16(kChunk * layout.key_stride * 2));
    const int64_t c0 = begin + int64_t{c} * kChunk;
    const int rows = static_cast<int>(min(int64_t{kChunk}, end - c0));
    const int per_tensor = rows * pieces;
    if constexpr (kTensorCores) {  // value rows past the sequence read as zeros (a zero weight times garbage is NaN)
      for (int i = slot_thread; i < (kChunk - rows) * pieces; i += kSlotThreads) {
        *reinterpret_cast<uint4*>(value_rows + (rows + i / pieces) * layout.value_stride + 8 * (i % pieces)) =
            make_uint4(0, 0, 0, 0);
      }
    }
    for (int i = slot_thread; i < 2 * per_tensor; i += kSlotThreads) {
      const bool is_value = i >= per_tensor;
      const int j = is_value ? i - per_tensor : i;
      const int r = j / pieces, piece = j % pieces;
      if (c0 + r == own_row) continue;
      const __half* src = (is_value ? a.values : a.keys) + (c0 + r) * kv_stride + head_offset;
      __half* dst = is_value ? value_rows + r * layout.value_stride : key_rows + r * layout.key_stride;
      if constexpr (kVector8) {
        cp_async16(dst + 8 * piece, src + 8 * piece);
      } else {
        cp_async4(dst + 2 * piece, src + 2 * piece);
      }
    }
    cp_async_commit();
  };
  // A prompt chunk's own KV rows come from the kernel before (rope_store_kv_rows): wait for it first.
  if constexpr (kPrefill) wait_for_previous_kernel();
  for (int r = 0; r < a.stages; ++r) stage_chunk(r, r);  // rounds past the last: empty groups
  __half* q_rows = reinterpret_cast<__half*>(shared_bytes + layout.q);  // kTensorCores: [kMmaHeads][key_stride]
  if constexpr (kTensorCores) {  // the A operand's rows past the group: zeros
    const int row_vectors = static_cast<int>(layout.key_stride / 8);
    for (int i = threadIdx.x; i < (kMmaHeads - a.group) * row_vectors; i += blockDim.x) {
      reinterpret_cast<uint4*>(q_rows + a.group * layout.key_stride)[i] = make_uint4(0, 0, 0, 0);
    }
  }
  // cos/sin of the RoPE pairs this lane rotates.
  float cos_pair[kPairs], sin_pair[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    cos_pair[j] = 1.0f;
    sin_pair[j] = 0.0f;
    if (!kPrefill && i < half) rope_cos_sin(position, a.inv_freq, i, cos_pair[j], sin_pair[j]);
  }

  if constexpr (kTimeline) {
    if (a.timeline.probe & kProbeTouchArgs) {  // the parameters read after the wait, read before it
      asm volatile("" ::"l"(a.q), "l"(a.k), "l"(a.v), "l"(a.out), "l"(a.partial_out), "l"(a.partial_max),
                   "l"(a.partial_sum), "l"(a.counters), "f"(a.scale), "r"(a.n_heads), "r"(a.head_dim), "r"(a.group));
    }
  }
  const int64_t q_row = kPrefill ? int64_t{blockIdx.z} * a.n_heads : 0;  // this token's query and output rows
  // This block's queries rotated (into shared memory) and this token's key and value stored: after the wait.
  auto load_rotate_store = [&] {
    // This token's key and value: by a warp that rotated no query when there is one (warp `group`), else by warp 0,
    // its loads of k and v issued before those of its queries: all go out together (one L2 round trip fewer on
    // the chain; the tensor-core build has a warp a slot, 4 for the group of 4, and lost ~1 us to it).
    const bool token_warp = !kPrefill && holds_position && warp == (warps > a.group ? a.group : 0);
    float2 token_k[kPairs], token_v[kPairs];  // pairs (i, i + half)
    if (token_warp) {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
          token_k[j] = make_float2(__ldcg(a.k + head_offset + i), __ldcg(a.k + head_offset + i + half));
          token_v[j] = make_float2(__ldcg(a.v + head_offset + i), __ldcg(a.v + head_offset + i + half));
        }
      }
    }
    for (int g = warp; g < a.group; g += warps) {
      const float* q_head = a.q + (q_row + first_head + g) * a.head_dim;
      float* rotated = q_group + g * a.head_dim;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
          if constexpr (kPrefill) {
            rotated[i] = __ldcg(q_head + i);
            rotated[i + half] = __ldcg(q_head + i + half);
          } else if constexpr (kTensorCores) {
            const float2 r = rotate_pair(__ldcg(q_head + i), __ldcg(q_head + i + half), cos_pair[j], sin_pair[j]);
            q_rows[g * layout.key_stride + i] = __float2half_rn(r.x);
            q_rows[g * layout.key_stride + i + half] = __float2half_rn(r.y);
          } else {
            const float2 r = rotate_pair(__ldcg(q_head + i), __ldcg(q_head + i + half), cos_pair[j], sin_pair[j]);
            rotated[i] = r.x;
            rotated[i + half] = r.y;
          }
        }
      }
    }
    if (token_warp) {
      __half* key_row = a.keys + position * kv_stride + head_offset;
      __half* value_row = a.values + position * kv_stride + head_offset;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
          const float2 r = rotate_pair(token_k[j].x, token_k[j].y, cos_pair[j], sin_pair[j]);
          const __half k0 = __float2half_rn(r.x), k1 = __float2half_rn(r.y);
          const __half v0 = __float2half_rn(token_v[j].x), v1 = __float2half_rn(token_v[j].y);
          key_row[i] = token_key[i] = k0;
          key_row[i + half] = token_key[i + half] = k1;
          value_row[i] = token_value[i] = v0;
          value_row[i + half] = token_value[i + half] = v1;
        }
      }
    }
  };
  // Head g's state merged over the block's slots in slot order (one slot: its state as it is): M = max_s m_s,
  // l = sum_s l_s e^(m_s - M), acc = sum_s acc_s e^(m_s - M). Every slot's state is in shared memory.
  auto merge_head = [&](int g, float& m, float& l, float2 (&acc)[kPairs]) {
    const int used_slots = min(a.slots, n_chunks);
    const float* all_acc = reinterpret_cast<const float*>(shared_bytes + layout.acc);
    const float* all_max_sum = reinterpret_cast<const float*>(shared_bytes + layout.max_sum);
    m = all_max_sum[g];
    l = all_max_sum[a.group + g];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      acc[j] = lane + 32 * j < half ? reinterpret_cast<const float2*>(all_acc + g * a.head_dim)[lane + 32 * j]
                                    : make_float2(0.0f, 0.0f);
    }
    for (int t = 1; t < used_slots; ++t) {
      const float* ms = all_max_sum + t * 2 * a.group;
      const float mt = ms[g], lt = ms[a.group + g];
      const float m_new = fmaxf(m, mt);
      const float w_old = expf(m - m_new), w_new = expf(mt - m_new);
      l = l * w_old + lt * w_new;
      m = m_new;
      const float2* at = reinterpret_cast<const float2*>(all_acc + (int64_t{t} * a.group + g) * a.head_dim);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        if (lane + 32 * j < half) {
          const float2 v = at[lane + 32 * j];
          acc[j] = make_float2(fmaf(v.x, w_new, acc[j].x * w_old), fmaf(v.y, w_new, acc[j].y * w_old));
        }
      }
    }
  };
  if constexpr (kWarm) {
    // Pass 0 runs the chunk and merge code before the wait on the staged rows and stale queries (one round, no
    // restaging, no row of this token, nothing written outside shared memory); pass 1, after the wait, is the
    // real one. One loop body, not unrolled, so that both passes run the same instructions: pass 1's come from
    // warm instruction caches. (The same steps as the default path below, tensor-core decode only.)
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      const bool warm = pass == 0;
      if (!warm) {
        wait_for_previous_kernel();  // q, k, v are the previous kernel's output: read through L2 after the wait
        allow_dependent_launch();
        stamp(1);
        load_rotate_store();
        stamp(2);
      }
      auto stage = [&](int r, int buffer) {
        if (!warm) stage_chunk(r, buffer);
      };
      chunks_with_mma<kMma, kTimeline>(a, layout, shared_bytes, q_rows, token_key, token_value, warm ? 1 : rounds, n_chunks,
                                       begin, end, warm ? int64_t{-1} : own_row, slot, lane, acc_state, max_state, sum_state,
                                       stage, stamp);
      __syncthreads();  // every slot's state in shared memory
      // The slots' states merged per head, as below; written out in pass 1 only.
      for (int g = warp; g < a.group; g += warps) {
        float m, l;
        float2 acc[kPairs];
        merge_head(g, m, l, acc);
        if (warm) continue;
        const int64_t out_row = int64_t{blockIdx.y} * a.n_heads + first_head;  // this block's partials of head 0
        float2* o = reinterpret_cast<float2*>(active == 1 ? a.out + (q_row + first_head + g) * a.head_dim
                                                          : a.partial_out + (out_row + g) * a.head_dim);
        const float inv = active == 1 ? 1.0f / l : 1.0f;
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int vp = lane + 32 * j;
          if (vp < half) __stcg(o + vp, make_float2(acc[j].x * inv, acc[j].y * inv));
        }
        if (active > 1 && lane == 0) {
          __stcg(a.partial_max + out_row + g, m);
          __stcg(a.partial_sum + out_row + g, l);
        }
      }
      __syncthreads();  // the pass's reads of shared memory done before the next pass writes it
    }
    stamp(7);
    if (active == 1) return;
  } else {
    // q, k, v are the previous kernel's output: read through L2 after the wait.
    wait_for_previous_kernel();
    stamp(1);
    // kTimeline's diagnostic stops (timeline.h), only where this block holds every position (no combine counters).
    const uint32_t stop = kTimeline && !kPrefill && active == 1 ? a.timeline.probe : 0u;
    if (stop & kProbeAttentionStopAfterWait) return;
    load_rotate_store();
    const int64_t out_row = int64_t{blockIdx.y} * a.n_heads + first_head;  // this block's partials of head 0
    // Head g's final state: normalized into the output when this is the only block, else this block's partials.
    auto emit = [&](int g, float m, float l, const float2 (&acc)[kPairs]) {
      if (active == 1) {
        const float inv = 1.0f / l;
        float2* o = reinterpret_cast<float2*>(a.out + (q_row + first_head + g) * a.head_dim);
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int vp = lane + 32 * j;
          if (vp < half) o[vp] = make_float2(acc[j].x * inv, acc[j].y * inv);
        }
      } else {
        float2* o = reinterpret_cast<float2*>(a.partial_out + (out_row + g) * a.head_dim);
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int vp = lane + 32 * j;
          if (vp < half) __stcg(o + vp, acc[j]);
        }
        if (lane == 0) {
          __stcg(a.partial_max + out_row + g, m);
          __stcg(a.partial_sum + out_row + g, l);
        }
      }
    };
    // One slot (a short prompt's attention, or a short context): its last chunk's state is final, written from
    // registers with no merge.
    const bool lone_slot = !kTensorCores && a.slots == 1;
    stamp(2);  // the queries rotated, this token's key and value stored
    if (stop & kProbeAttentionStopAfterQueries) return;
    if constexpr (kTensorCores) {
      chunks_with_mma<kMma, kTimeline>(a, layout, shared_bytes, q_rows, token_key, token_value, rounds, n_chunks, begin, end,
                                       own_row, slot, lane, acc_state, max_state, sum_state, stage_chunk, stamp);
    } else {
      for (int r = 0; r < rounds; ++r) {
        if (a.stages == 2) cp_async_wait<1>();  // round r's group done (round r + 1's may be in flight)
        else cp_async_wait<0>();
        __syncthreads();  // every thread's copies, the rotated queries and this token's row visible to the block
        if (r == 0) stamp(3);  // the first round's chunks of keys and values in shared memory
        const int c = r * a.slots + slot;
        const char* stage = shared_bytes + layout.stage + ((r % a.stages) * a.slots + slot) * layout.stage_bytes;
        const __half* key_rows = reinterpret_cast<const __half*>(stage);
        const __half* value_rows = reinterpret_cast<const __half*>(stage + round16(kChunk * layout.key_stride * 2));
        const int64_t c0 = begin + int64_t{c} * kChunk;
        const int count = c < n_chunks ? static_cast<int>(min(int64_t{kChunk}, end - c0)) : 0;
        for (int g = slot_warp; count > 0 && g < a.group; g += kWarps) {
          // This head's running state in this slot: fresh on the slot's first chunk, from shared memory on later ones.
          float m = -INFINITY, l = 0.0f;
          float2 acc[kPairs];
#pragma unroll
          for (int j = 0; j < kPairs; ++j) acc[j] = make_float2(0.0f, 0.0f);
          const float2* state = reinterpret_cast<const float2*>(acc_state + g * a.head_dim);
          if (r > 0) {
            m = max_state[g];
            l = sum_state[g];
#pragma unroll
            for (int j = 0; j < kPairs; ++j) {
              if (lane + 32 * j < half) acc[j] = state[lane + 32 * j];
            }
          }
          // Scores: lane t takes position c0 + t (lane 0 always has one).
          const bool valid = lane < count;
          const __half* key = c0 + lane == own_row ? token_key : key_rows + lane * layout.key_stride;
          const float s = valid ? key_dot<kVector8>(q_group + g * a.head_dim, key, a.head_dim) * a.scale : -INFINITY;
          // Online softmax: the running max and sum and the value sums rescaled to the new max.
          const float m_new = fmaxf(m, warp_max(s));
          const float correction = expf(m - m_new);  // 0 on the first chunk (m = -inf)
          const float prob = valid ? expf(s - m_new) : 0.0f;
          l = l * correction + warp_sum(prob);
          m = m_new;
          if (r == 0) stamp(4);
#pragma unroll
          for (int j = 0; j < kPairs; ++j) acc[j] = make_float2(acc[j].x * correction, acc[j].y * correction);
          // Values: row u weighted by the probability lane u computed.
#pragma unroll 4
          for (int u = 0; u < count; ++u) {
            const float weight = __shfl_sync(0xFFFFFFFFu, prob, u);
            const __half2* row = reinterpret_cast<const __half2*>(c0 + u == own_row ? token_value : value_rows + u * a.head_dim);
#pragma unroll
            for (int j = 0; j < kPairs; ++j) {
              const int vp = lane + 32 * j;
              if (vp < half) {
                const float2 vf = __half22float2(row[vp]);
                acc[j] = make_float2(fmaf(weight, vf.x, acc[j].x), fmaf(weight, vf.y, acc[j].y));
              }
            }
          }
          if (r == 0) stamp(5);
          if (lone_slot && r + 1 == rounds) {
            emit(g, m, l, acc);
            continue;
          }
          // The state for the slot's next chunk, or for the merge of the slots below.
          float2* keep = reinterpret_cast<float2*>(acc_state + g * a.head_dim);
#pragma unroll
          for (int j = 0; j < kPairs; ++j) {
            if (lane + 32 * j < half) keep[lane + 32 * j] = acc[j];
          }
          if (lane == 0) {
            max_state[g] = m;
            sum_state[g] = l;
          }
        }
        if (r + a.stages < rounds) {
          __syncthreads();  // every warp is done with this buffer
          stage_chunk(r + a.stages, r % a.stages);
        } else {
          cp_async_commit();
        }
      }
    }
    stamp(6);
    if (stop & kProbeAttentionStopAfterChunks) return;
    if (!lone_slot) {
      __syncthreads();  // every slot's state in shared memory
      // The slots' states merged per head (in slot order; one slot: its state as it is): M = max_s m_s,
      // l = sum_s l_s e^(m_s - M), acc = sum_s acc_s e^(m_s - M).
      for (int g = warp; g < a.group; g += warps) {
        float m, l;
        float2 acc[kPairs];
        merge_head(g, m, l, acc);
        emit(g, m, l, acc);
      }
    }
    stamp(7);
    if (kPrefill || active == 1) return;
  }

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
  for (int g = warp; g < a.group; g += warps) {
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

template <int kPairs, bool kVector8, bool kPrefill, bool kTimeline = false, int kMma = 0>
__global__ void __launch_bounds__((kMma > 0 ? 32 : kThreads) * kMaxRopeSlots) attention_rope_kernel(const RopeAttentionArgs a) {
  uint64_t stamps[kTimelineStamps] = {};
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) stamps[0] = timeline_now();
  }
  attention_rope_block<kPairs, kVector8, kPrefill, kTimeline, kMma>(a, stamps);
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) {
      stamps[kTimelineStamps - 1] = timeline_now();
      timeline_append(a.timeline, a.keys, kTimelineAttention, 0, stamps);
    }
  }
}

// The tensor-core decode build with its warm pass (kWarm in attention_rope_block; DecodeAttentionShape::warm_code,
// the default). Its registers are capped so that a block (4 one-warp slots) fits on an SM beside three of the
// token generator's GEMV blocks (3 x 128 threads x 120 registers of 65,536), where head_dim 128's 168 registers
// did not: its blocks then start while q/k/v runs, with time to stage their rows and run the warm pass before the
// release (at 152, 28 bytes of spills). Measured (Llama-3.1-8B tg128, same runs, docs/PERFORMANCE.md session 27):
// H200 591.2, 592.3 -> 596.8, 596.2 tok/s per channel, 526.3, 525.3 -> 530.0, 528.8 at group 128; H100 +0.6 to
// +0.9% per channel, +0.5% at group 128. The attention kernel's share of a layer 6.8 -> 5.1 us, of which o and
// gate/up take back about half (o's blocks start later).
constexpr int kWarmRegisters = 152;
template <int kPairs, bool kTimeline, int kMma>
__global__ void __maxnreg__(kWarmRegisters) attention_rope_warm_kernel(const RopeAttentionArgs a) {
  uint64_t stamps[kTimelineStamps] = {};
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) stamps[0] = timeline_now();
  }
  attention_rope_block<kPairs, true, false, kTimeline, kMma, true>(a, stamps);
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) {
      stamps[kTimelineStamps - 1] = timeline_now();
      timeline_append(a.timeline, a.keys, kTimelineAttention, 0, stamps);
    }
  }
}

// Blocks per KV head of the fused kernel for a cache of context_length positions, at most `max_blocks` (0: no
// cap beyond kMaxRopeBlocks).
int fused_blocks(int64_t context_length, int64_t max_blocks) {
  const int64_t cap = max_blocks > 0 ? std::min<int64_t>(max_blocks, kMaxRopeBlocks) : kMaxRopeBlocks;
  return static_cast<int>(std::clamp<int64_t>((context_length + kChunk - 1) / kChunk, 1, cap));
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
  return std::max<int64_t>(n_splits(shape), fused_blocks(shape.context_length, shape.fused_max_blocks)) * shape.n_heads *
         (shape.head_dim + 2);
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

namespace {

// The current device's limits, cached per device: its opt-in shared memory per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin) less a margin for the kernel's static shared memory (the opt-in
// bounds both together): the dynamic limit the fused kernel's launches raise theirs to, and what its slots and
// stages must fit in; and its SMs, shared memory and threads an SM and shared memory reserved a block, what the
// default grid is cut to (decode_attention_one_wave_blocks).
struct DeviceLimits {
  int64_t opt_in_shared = kMaxSharedBytes, sms = 132, shared_per_sm = 228 * 1024, threads_per_sm = 2048,
          reserved_shared = 1024;
};
DeviceLimits device_limits() {
  static std::mutex mutex;
  static DeviceLimits cached[64];
  static bool known[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {};
  const std::lock_guard<std::mutex> lock(mutex);
  const int at = device % 64;
  if (!known[at]) {
    DeviceLimits& l = cached[at];
    auto get = [&](cudaDeviceAttr attribute, int64_t* out) {
      int value = 0;
      if (cudaDeviceGetAttribute(&value, attribute, device) == cudaSuccess) *out = value;
    };
    get(cudaDevAttrMaxSharedMemoryPerBlockOptin, &l.opt_in_shared);
    l.opt_in_shared = std::max<int64_t>(l.opt_in_shared - 1024, kMaxSharedBytes);
    get(cudaDevAttrMultiProcessorCount, &l.sms);
    get(cudaDevAttrMaxSharedMemoryPerMultiprocessor, &l.shared_per_sm);
    get(cudaDevAttrMaxThreadsPerMultiProcessor, &l.threads_per_sm);
    get(cudaDevAttrReservedSharedMemoryPerBlock, &l.reserved_shared);
    known[at] = true;
  }
  return cached[at];
}

int64_t opt_in_shared_bytes() { return device_limits().opt_in_shared; }

// Chunk slots and stage buffers of the fused kernel: 4 slots (16 warps: a block takes 4 chunks of 32 positions
// at once and merges them in shared memory; at tg128's lengths one block per KV head, no combine through L2),
// with a second stage buffer per slot only where a block can have more than one round of chunks (a context
// past 4 x 32 x `blocks` positions, blocks per KV head); fewer slots where the context has fewer chunks (a short
// prompt's attention: one) or shared memory is short. {0, 0}: nothing fits.
// Measured (8B tg128 on an H200, 2026-12-04): 4 slots against the one-slot kernel, 501.5 / 505.4 -> 514.6 /
// 514.7 tok/s per channel, 459.7 / 463.6 -> 469.0 / 472.0 at group 128 (docs/PERFORMANCE.md, session 13).
struct RopeConfig {
  int slots = 0, stages = 0;
};
RopeConfig rope_config(int64_t group, int64_t head_dim, int64_t context_length, int64_t blocks, bool mma) {
  const int64_t limit = opt_in_shared_bytes();
  const bool long_context = context_length > int64_t{kMaxRopeSlots} * kChunk * blocks;
  const int64_t chunks = (context_length + kChunk - 1) / kChunk;
  const int wanted = chunks >= 3 ? kMaxRopeSlots : chunks == 2 ? 2 : 1;  // 3 chunks take 4 slots
  for (int slots : {kMaxRopeSlots, 2, 1}) {
    if (slots > wanted) continue;
    for (int stages : {2, 1}) {
      if (stages == 2 && !long_context && slots > 1) continue;
      if (rope_shared_layout(group, head_dim, stages, slots, mma).total <= limit) return {slots, stages};
    }
  }
  return {};
}

// The tensor-core build serves the shape (decode; head_dim 32, 64 or 128, the builds compiled; at most kMmaHeads
// query heads a KV head).
bool rope_mma_supported(int64_t group, int64_t head_dim) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && group <= kMmaHeads;
}

// Launches attention_rope_kernel<kPairs, kVector8, kPrefill> (mma: the tensor-core build, decode only) for the
// shape in `args`.
template <bool kPrefill, bool kTimeline = false>
cudaError_t launch_rope_kernel(const RopeAttentionArgs& args, dim3 grid, Stream stream, bool overlap_previous,
                               bool mma = false, bool warm = false) {
  const int64_t shared = rope_shared_layout(args.group, args.head_dim, args.stages, args.slots, mma).total;
  const int half = args.head_dim / 2;
  const bool vector8 = args.head_dim % 8 == 0;
  auto launch = [&](auto kernel) -> cudaError_t {
    if (shared > kMaxSharedBytes) {
      if (const cudaError_t e = raise_shared_limit_once<decltype(kernel)::value>(static_cast<int>(opt_in_shared_bytes())); e != cudaSuccess) return e;
    }
    return launch_kernel(kernel.value, grid, dim3((mma ? 32 : kThreads) * args.slots), static_cast<size_t>(shared), stream,
                         overlap_previous, args);
  };
  using K = decltype(&attention_rope_kernel<1, true, kPrefill, kTimeline>);
  if constexpr (!kPrefill) {
    if (mma && warm) {
      if (args.head_dim == 32) return launch(std::integral_constant<K, attention_rope_warm_kernel<1, kTimeline, 32>>{});
      if (args.head_dim == 64) return launch(std::integral_constant<K, attention_rope_warm_kernel<1, kTimeline, 64>>{});
      return launch(std::integral_constant<K, attention_rope_warm_kernel<2, kTimeline, 128>>{});
    }
    if (mma) {
      if (args.head_dim == 32) return launch(std::integral_constant<K, attention_rope_kernel<1, true, false, kTimeline, 32>>{});
      if (args.head_dim == 64) return launch(std::integral_constant<K, attention_rope_kernel<1, true, false, kTimeline, 64>>{});
      return launch(std::integral_constant<K, attention_rope_kernel<2, true, false, kTimeline, 128>>{});
    }
  }
  if (half <= 32) {
    return vector8 ? launch(std::integral_constant<K, attention_rope_kernel<1, true, kPrefill, kTimeline>>{})
                   : launch(std::integral_constant<K, attention_rope_kernel<1, false, kPrefill, kTimeline>>{});
  }
  if (half <= 64) {
    return vector8 ? launch(std::integral_constant<K, attention_rope_kernel<2, true, kPrefill, kTimeline>>{})
                   : launch(std::integral_constant<K, attention_rope_kernel<2, false, kPrefill, kTimeline>>{});
  }
  return vector8 ? launch(std::integral_constant<K, attention_rope_kernel<4, true, kPrefill, kTimeline>>{})
                 : launch(std::integral_constant<K, attention_rope_kernel<4, false, kPrefill, kTimeline>>{});
}

}  // namespace

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
  int blocks = fused_blocks(shape.context_length, shape.fused_max_blocks);
  const bool mma = shape.tensor_cores && rope_mma_supported(group, shape.head_dim);
  RopeConfig config = rope_config(group, shape.head_dim, shape.context_length, blocks, mma);
  if (config.slots == 0) return unsupported(what + ": too many query heads per KV head for shared memory");
  if (shape.fused_max_blocks == 0) {  // the default grid in one wave (decode_attention_one_wave_blocks)
    const DeviceLimits d = device_limits();
    const int64_t shared = rope_shared_layout(group, shape.head_dim, config.stages, config.slots, mma).total + d.reserved_shared;
    const int64_t threads = int64_t{mma ? 32 : kThreads} * config.slots;
    const int64_t per_sm = std::min(d.shared_per_sm / std::max<int64_t>(shared, 1), d.threads_per_sm / threads);
    const int fit = static_cast<int>(decode_attention_one_wave_blocks(shape.n_kv_heads, blocks, d.sms, per_sm));
    if (fit < blocks) {
      blocks = fit;
      config = rope_config(group, shape.head_dim, shape.context_length, blocks, mma);
      if (config.slots == 0) return unsupported(what + ": too many query heads per KV head for shared memory");
    }
  }
  if (!q || !k || !v || !inv_freq || !position || !key_cache || !value_cache || !workspace || !counters || !out) {
    return invalid_argument(what + ": null device pointer");
  }
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
                               0,
                               static_cast<int>(shape.n_heads),
                               static_cast<int>(shape.n_kv_heads),
                               static_cast<int>(shape.head_dim),
                               static_cast<int>(group),
                               blocks,
                               config.stages,
                               config.slots,
                               1.0f / std::sqrt(static_cast<float>(shape.head_dim)),
                               TimelineRing{}};
  const dim3 grid(static_cast<unsigned>(shape.n_kv_heads), static_cast<unsigned>(blocks));
  if (const TimelineRing* ring = active_timeline()) {  // the diagnostic build of the kernel (timeline.h)
    RopeAttentionArgs timed = args;
    timed.timeline = *ring;
    return cuda_status(launch_rope_kernel<false, true>(timed, grid, stream, overlap_previous, mma, shape.warm_code),
                       "decode_attention_rope launch");
  }
  return cuda_status(launch_rope_kernel<false>(args, grid, stream, overlap_previous, mma, shape.warm_code),
                     "decode_attention_rope launch");
}

bool prefill_attention_short_preferred(int64_t start, int64_t n_tokens) {
  return n_tokens >= 1 && n_tokens <= kShortPrefillTokens && start + n_tokens <= kShortPrefillPositions;
}

Status prefill_attention_short(const float* q, const uint16_t* key_cache, const uint16_t* value_cache, int64_t start,
                               int64_t n_tokens, const PrefillAttentionShape& shape, float* out, Stream stream,
                               bool overlap_previous) {
  const std::string what = "cuda::prefill_attention_short: " + std::to_string(n_tokens) + " tokens at " +
                           std::to_string(start) + ", " + std::to_string(shape.n_heads) + " query heads, " +
                           std::to_string(shape.n_kv_heads) + " KV heads of head_dim " + std::to_string(shape.head_dim);
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.head_dim <= 0 ||
      shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim || shape.n_kv_heads > 65535 || start < 0 ||
      n_tokens <= 0 || n_tokens > 65535) {
    return invalid_argument(what + ": needs n_kv_heads dividing n_heads, an even head_dim of at most " +
                            std::to_string(kMaxHeadDim) + " and 1 to 65535 tokens");
  }
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const RopeConfig config = rope_config(group, shape.head_dim, start + n_tokens, kMaxRopeBlocks, false);
  if (config.slots == 0) return unsupported(what + ": too many query heads per KV head for shared memory");
  if (!q || !key_cache || !value_cache || !out) return invalid_argument(what + ": null device pointer");
  // Cast away const only to share the argument block: the prefill kernel writes nothing but `out`.
  const RopeAttentionArgs args{q,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               const_cast<__half*>(reinterpret_cast<const __half*>(key_cache)),
                               const_cast<__half*>(reinterpret_cast<const __half*>(value_cache)),
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               out,
                               start,
                               static_cast<int>(shape.n_heads),
                               static_cast<int>(shape.n_kv_heads),
                               static_cast<int>(shape.head_dim),
                               static_cast<int>(group),
                               1,
                               config.stages,
                               config.slots,
                               1.0f / std::sqrt(static_cast<float>(shape.head_dim)),
                               TimelineRing{}};
  const dim3 grid(static_cast<unsigned>(shape.n_kv_heads), 1, static_cast<unsigned>(n_tokens));
  return cuda_status(launch_rope_kernel<true>(args, grid, stream, overlap_previous), "prefill_attention_short launch");
}

}  // namespace petrel::cuda
