// kernels/cuda: the W4A16 (and W8A16 LM head) matrix-vector product y = dequant(W) x of the token generator,
// reading GPTQ tensors in place. Host-side checks and the launch plan are in gemv_gptq.cc.
//
// Layout (ref::GptqMatrix, kernels/ref/ops.h), for W [rows = out, cols = in]:
//   qweight int32 [cols * bits / 32, rows]: word (i, r) holds the codes of inputs 32/bits * i .. of row r,
//           code j in bits j*bits ..; consecutive output rows are consecutive words.
//   scales  fp16  [n_groups, rows];  qzeros int32 [n_groups, rows * bits / 32] (packed along the rows);
//   weight (r, c) = scale[g, r] * (code(r, c) - (stored zero + zero_offset)), g = c / group_size.
// Preconditions (gemv_gptq_supports): bits 4 or 8; rows % 4 == 0; cols % (32 / bits) == 0; per-channel, or
// group_size a multiple of 4 words (32 inputs at 4 bits, 16 at 8) dividing cols; no act-order g_idx;
// qweight, x and y 16-byte aligned, scales 8-byte aligned.
//
// Bytes-moved floor. One call must read qweight (rows * cols * bits / 8), scales and zeros
// (n_groups * rows * (2 + bits / 8)), x (4 * cols) and write y (4 * rows): Llama-3.1-8B's 4096x4096 at 4 bits
// per channel is 8.43 MB, 1.96 us at the H200's ~4.3 TB/s (device copy, read + write counted); 14336x4096 is
// 29.4 MB (6.8 us); the 8-bit LM head 128256x4096 is 525 MB (122 us). Arithmetic is 2 * rows * cols FLOP,
// 0.25 to 0.5 FLOP per byte: far below any ceiling, but see "why tensor cores".
//
// Work decomposition (both kernels). A block of 128 threads owns 128 output rows and one slice of the input
// (split-K, blockIdx.y); the slice of x is staged in shared memory once per block. The plan (gemv_gptq.cc)
// picks a power-of-two number of splits that gives at most ~4 blocks per SM, each with at least 8 steps of 4
// words: rows = 1024 or 4096 alone would give 8 or 32 blocks for 132 SMs. (Sweeping 1..32 splits on the H200
// this picks the fastest for every Llama-3.1-8B shape: 16 for 4096x4096, 1024x4096 and 4096x14336, 4 for
// 14336x4096, 1 for the LM head; odd counts such as 5 or 17 ran 10-20% slower.) A split block writes its
// partial sums to the workspace; the last block of a row range to arrive (an atomic counter per row block,
// reset by that block) adds the slices in a fixed order, so results are deterministic and one launch does it.
// With GemvOptions::cluster_reduce the k_splits blocks of a row range form a thread-block cluster and add their
// sums through distributed shared memory instead (same order, same bits): that saves the threadfence, the atomic
// and the L2 round trip (~1 us of a small call) but measured no faster in the 8B decode step (-0.5% per channel,
// +1% at group 128, 2026-12-03), so it is off by default. With GemvOptions::atomic_reduce (the vector kernels)
// every block instead adds its row sums into y with one float4 reduction (red.global.add.v4.f32) and exits, y
// holding the residual or zeros beforehand (GemvFusion::clear lets an earlier launch zero it): no partials, no
// fence, no counter, no second pass, at the price of an order that varies from run to run. The block timeline
// (timeline.h) showed the ordered epilogue at 1.7-3.1 us of the decode step's critical path per product; with
// atomics the fused step went 515 -> 569 tok/s per channel (docs/PERFORMANCE.md, session 14), and it is the
// token generator's default (CudaModelOptions::decode_atomic_reduce).
//
// Why tensor cores (kTensorCore, the default). At batch 1 the dequantization, not the FMA, is the cost: the
// float32 way (the kCudaCore kernel: shift, mask, magic-number convert with the zero folded in, FMA) issues
// about 4 instructions per 4-bit weight, and the H200 must consume ~8.6e12 weights/s to keep up with its
// memory, against ~3.3e13 issued thread-instructions/s for the whole chip: it runs compute-bound. The
// tensor-core kernel dequantizes two codes per instruction into fp16 pairs (the 0x6400 magic-number trick:
// (w & 0x000F000F) | 0x64006400 is the half2 {1024 + c0, 1024 + c4}; one sub.f16x2 or fma.f16x2 removes 1024
// and the zero; code - zero is a small integer, exact in fp16) and lets mma.sync.m16n8k16 (f16 in, f32
// accumulate) do 256 products per warp-instruction: ~1.3 instructions per weight in all. Two details keep the
// hot loop at ~41 instructions a step (4 words of 32 rows a warp: 36 for dequantization, 4 mma, 1 shared load;
// cuobjdump -sass): the mask-and-magic is one LOP3 (gptq_ptx.cuh's mask_or_magic; written in C++ it took two),
// and the end-of-slice, group-change and promotion checks are made once per batch of 4 steps when the batch
// is whole (compute_batch's fast path), not per step. Before both, a step took ~76 instructions; the big
// GEMVs got 5-15% faster (gate 14336x4096 per channel 15.3 -> 13.1 us), so issue was not their main limit.
//
// Fragment mapping (tensor-core kernel). Thread (quad_row = lane / 4, quad_col = lane % 4) of a warp loads
// one 16-byte vector: word (word0 + quad_col) of rows R + 4 quad_row + 0..3, R = the warp's first row. A warp
// step thus reads 4 input words (32 inputs at 4 bits) of 32 rows, as four fully used 128-byte lines.
// The mma's M dimension is rows: logical row quad_row is row R + 4 quad_row + 0 (or + 2), logical row
// quad_row + 8 is row + 1 (or + 3). Its K dimension is 16 inputs, permuted so that each thread's registers
// are what the magic trick yields: for 4-bit, logical k (2 quad_col, 2 quad_col + 1) are inputs (8w + 0,
// 8w + 4) and (2 quad_col + 8, + 9) are (8w + 1, 8w + 5) in the first mma and (8w + 2, 8w + 6), (8w + 3,
// 8w + 7) in the second, w = word0 + quad_col. The B operand (x) is staged in that order, so one 16-byte
// shared load gives a thread both mmas' B registers. All 8 N columns of B hold x (the mma has no N = 1), so
// every column of D is y: up to 8 vectors could go through for the same instructions (small-batch decode).
// 8-bit: a word is 4 inputs, (w & 0x00FF00FF) | 0x64006400 = {c0, c2}, (w >> 8) gives {c1, c3}; one mma per
// pair of rows and word, inputs ordered (0, 2), (1, 3).
//
// Scales are applied per group in float32 after the mma (acc_group * scale added to the row total, at each
// group's end and at least every kPromoteSteps), so dequantization is exact and the only rounding beyond
// ref::matmul's is x to fp16 and the order and rounding of the float32 sums.
//
// Loads and latency (measured on an H200, bench/gemv_cuda_bench.cc --sweep). The weights are read once, so
// they go through ld.global.nc.L1::no_allocate. What limits this kernel is bytes in flight, not the layout
// and not arithmetic: a loads-only kernel with exactly this grid and access pattern reads the LM head at
// 4.4 TB/s (above the 3.9 TB/s of a plain streaming kernel), and the same with each block's bytes contiguous
// (a tiled layout) is no faster. So the tensor-core kernel keeps two batches of 4 steps of weight loads in
// flight per thread (three at 8 bits and for the per-channel RMSNorm products: kInFlight in the kernel,
// sessions 15-16) (ping-pong registers, the next batch issued before this one's arithmetic, the first one
// before x is staged) and loads the next group's scales and zeros during the current group, in 105 registers
// since the batch fast path (4 blocks of 128 threads per SM, as many as the planner's grids put on an SM).
// Holding it at 96 (__launch_bounds__(128, 5)) measured the same tg128 per channel and 2% less at group 128,
// the big GEMVs ~3% slower (2026-12-03, two H200 runs): left to the compiler. Versions measured and dropped:
// one batch of 4 steps (64-72 registers):
// LM head 3.1 TB/s; scales and zeros carried per step in the pipeline (124 registers, 4 blocks/SM):
// 2.9 TB/s; weights streamed through an 8-slot cp.async ring in shared memory (68 registers): 2.1 TB/s;
// this version capped at 80 registers for 6 blocks/SM (spills): 3.5 TB/s, against 3.4 to 3.7 TB/s
// (two runs) now; and (2026-12-03) the weights through 2-4 shared-memory stages filled by Hopper's bulk copy
// engine (one cp.async.bulk per 128-row run, mbarrier completion): 16-75% slower on every shape (gate 13.8 ->
// 16.4 us at 2 stages), so bytes in flight are not what limits it (branch experiment/l2-read-ahead-and-bulk-gemv,
// docs/PERFORMANCE.md session 8). The layer matrices (2 to 30 MB) stay far from the copy bandwidth because a call is only
// 0.5 to 7 us of transfer: the launch, the first load's latency and the split-K epilogue are a fixed ~3 us
// (a 128x256 GEMV takes 2.8 to 2.9 us in a CUDA graph). The token generator's fused step attacks that fixed
// cost three ways (below); bench/README.md has the measurements.
//
// Grouped launches (gemv_gptq_grouped). q/k/v (4096 + 1024 + 1024 rows for Llama-3.1-8B) and gate/up (2 x
// 14336) read the same input: one grid covers all members' row blocks, each block picks its matrix from a
// small table in the kernel arguments (selected with constant indices, so no local-memory copy), and
// partial sums and arrival counters are indexed by the grid's row block. One launch, one first-load latency
// and one split-K epilogue instead of three; the weights stay in each matrix's own GPTQ tensors.
//
// Fused input and output (GemvFusion). The step's element-wise ops ride along where the vector is touched
// anyway: RMSNorm of x as x is staged (each block recomputes sum(x^2) over the whole 16 KB vector from L2,
// 8 loads a thread in flight: cheaper than a kernel of its own, and no cross-block reduction; the slice's norm
// weights are copied into shared memory with cp.async before the wait, since read from global memory after
// it they cost ~1 us a RMSNorm launch in the token generator, 1.5% of tg128: session 15), SiLU(gate) * up
// as the down projection stages its input, and the residual add where each row's sum is final (y = residual
// + sum, in place: the last block of a split-K row range, or the writer when there is no split). Numerics
// are those of norm.cu and elementwise.cu, except the sum of squares' order.
//
// Overlap with the previous kernel (GemvOptions::overlap_previous, programmatic dependent launch,
// programmatic_launch.cuh). A block first lets the next kernel launch, then issues what depends on nothing
// earlier: its first two batches of weight loads (8 steps a thread, in registers), its group's scales and
// zeros, and an L2 prefetch (cp.async.bulk.prefetch.L2, 512 bytes a packed word: one 128-row run) of the
// rest of its first l2_prefetch_steps steps; only then does it wait for the previous kernel and read x. So
// the weight stream of one GEMV starts while the kernel before it (attention, or the tail and split-K
// epilogue of another GEMV) is finishing. Activations written by the previous kernel are read with
// ld.global.cg (L2), never through a possibly stale L1 line. Outputs are bitwise the same with and without
// overlap (tests/kernels_cuda_test.cc).
//
// Batch kernels (gemv_gptq_batch, kTiles 1 to 4). The mma's N dimension, which the vector kernel fills with
// copies of x, carries 8 token rows per n-tile: thread (quad_row, quad_col) loads B from token quad_row of
// each n-tile, and its D registers are tokens 2 quad_col and 2 quad_col + 1 of its 4 rows. Each step's weights
// are dequantized once for all n-tiles (36 instructions) and cost 4 mma and one shared load per n-tile; the
// promotion schedule and the split-K order are the vector kernel's, so a token's result equals the vector
// kernel's on that row with the same splits, bit for bit (tests). x is staged for all 8 kTiles rows (fp16,
// token rows 64 bytes apart modulo 128 for conflict-free loads, up to 96 KB with the opt-in); a block may
// compute several row tiles with one staged x (GemvOptions::row_tiles), issuing the next tile's first weight
// batches before the current tile's epilogue. Staging and the split-K reduction issue 8 to 16 loads per thread
// at a time: the first version, one dependent L2 load at a time, took 58 us for q/o at 29 tokens (now 15).
// Measured at 29 tokens (docs/PERFORMANCE.md, session 6): faster than the GEMM for q/o (15.3 against 17.2 us)
// and, grouped, q/k/v; slower for gate/up and down, where every row tile's blocks read all tokens' x from L2
// as float32 (1.8x the weight bytes at 29 tokens) and down's 16 splits write partials of half the weight bytes.
// Tried in session 7: x staged once in fp16 fragment order by a small kernel and copied with cp.async (all of a
// block's slice in flight at once): no faster (q/k/v 34.0 against 34.4 us under Nsight Compute), so staging is
// not where the time goes; the q/k/v of short prompts now run the GEMM as one grouped launch instead
// (gemm.h's gemm_gptq_group, 5.10 -> 4.83 ms for the 8B prompt of 29 tokens), and only o uses this kernel there.
//
// Layout choice. The GPTQ layout is what this kernel wants: 16-byte loads, every byte of each 128-byte line
// used, consecutive warps on consecutive lines, no repacking at load; the loads-only experiment above found
// no gain from a contiguous (Marlin-style) tiling, so `petrel export --backend cuda` can keep it.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/async_copy.cuh"
#include "petrel/kernels/cuda/bulk_copy.cuh"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/timeline.cuh"

namespace petrel::cuda {

namespace {

using namespace ptx;  // gptq_ptx.cuh: fp16x2 arithmetic, mma, dequantization

constexpr int kRowsPerBlock = GemvPlan::kRowsPerBlock;  // 4 warps x 32 rows (tensor core), 32 lanes x 4 rows
constexpr int kThreads = GemvPlan::kThreadsPerBlock;
constexpr int kWordsPerStep = 4;  // packed input words per warp step
constexpr int kUnroll = 4;        // the CUDA-core kernel: steps whose weight loads are in flight together
// The tensor cores' float32 accumulation is not IEEE round-to-nearest (it truncates), so its error grows with
// the number of accumulations: the mma accumulators are added into float32 registers at least every 8 steps
// (16 mmas, 256 inputs), also within a long group (per-channel).
constexpr int kPromoteSteps = 8;
constexpr int kMaxParts = kMaxGemvGroupMembers;
constexpr int kMaxClusterSplits = 16;  // the largest (non-portable) cluster Hopper schedules
static_assert(kRowsPerBlock == 128 && kThreads == 128, "both kernels map 128 threads onto 128 rows");

// One matrix of a launch: its tensors, its output, and its first row tile (of kRowsPerBlock rows) among the
// launch's (the tile of block blockIdx.x is blockIdx.x, or blockIdx.x * row_tiles + r for the batch kernels).
struct GemvPart {
  const int32_t* qweight;
  const uint16_t* scales;
  const int32_t* qzeros;
  float* y;
  int64_t rows;
  int zero_offset;
  int first_tile;
  int uniform_zero;  // DeviceGptqMatrix::uniform_zero (read by the kBuildUniformZeros kernels)
};

struct GemvArgs {
  GemvPart parts[kMaxParts];
  int n_parts;
  const float* x;
  const float* up;          // GemvInput::kSiluMul
  const void* norm_weight;  // GemvInput::kRmsNorm
  WeightType norm_type;
  float norm_eps;
  const float* residual;  // y = residual + W input when not null (one part)
  float* partials;        // [k_splits, tokens, total_tiles * kRowsPerBlock] when k_splits > 1
  uint32_t* counters;     // [total_tiles], zero between launches
  int64_t cols;
  int64_t words;        // packed words along the input: cols * bits / 32
  int64_t group_words;  // packed words per group
  int group_steps;      // steps per group (2^30, more than any matrix has, for per-channel)
  int k_splits;
  int steps_per_split;
  int l2_prefetch_steps;
  int cluster_reduce;  // the k_splits blocks of a row range form a cluster (GemvOptions::cluster_reduce)
  int64_t tokens;      // rows of x and y: 1, or up to 8 * kTiles for the batch kernels
  int row_tiles;       // batch kernels: row tiles a block computes one after another
  int total_tiles;     // row tiles of all parts (the grid's blocks when row_tiles is 1)
  int x_stride_bytes;  // batch kernels: bytes per token row of the staged x (batch_token_stride_bytes)
  int atomic_reduce;     // split-K sums added into y with atomics (GemvOptions::atomic_reduce)
  int shallow;           // not the kBuildDeep build where it would be (GemvOptions::deep_batches off)
  int late_batches;      // GemvOptions::late_batches (the kBuildLate kernels)
  int uniform_zeros;     // GemvOptions::uniform_zeros, and every part's zeros uniform
  float* clear[2];       // GemvFusion::clear: zeroed after the wait (clear_vectors float4 each)
  int64_t clear_vectors[2];
  TimelineRing timeline;  // read only by the kTimeline instantiations (timeline.h)
};

// The matrix row tile `tile` belongs to. Unrolled over constant indices, so the parameter array is not copied
// to local memory.
__device__ __forceinline__ GemvPart tile_part(const GemvArgs& a, int tile) {
  GemvPart part = a.parts[0];
#pragma unroll
  for (int i = 1; i < kMaxParts; ++i) {
    if (i < a.n_parts && tile >= a.parts[i].first_tile) part = a.parts[i];
  }
  return part;
}

// 16 bytes of weights that no other thread reads: skip L1.
__device__ __forceinline__ uint4 load_streaming(const int32_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Scale and zero of 4 consecutive rows (row % 4 == 0) in one group.
struct RowGroupParams {
  float scale[4];
  int zero[4];
};

template <int kBits>
__device__ __forceinline__ RowGroupParams load_group_params(const GemvPart& m, int64_t group, int64_t row, bool row_ok) {
  RowGroupParams p;
  uint2 s = make_uint2(0, 0);
  uint32_t zeros = 0;
  if (row_ok) {
    s = __ldg(reinterpret_cast<const uint2*>(m.scales + group * m.rows + row));
    zeros = static_cast<uint32_t>(__ldg(m.qzeros + group * (m.rows * kBits / 32) + row * kBits / 32));
  }
  p.scale[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(s.x & 0xFFFFu)));
  p.scale[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(s.x >> 16)));
  p.scale[2] = __half2float(__ushort_as_half(static_cast<unsigned short>(s.y & 0xFFFFu)));
  p.scale[3] = __half2float(__ushort_as_half(static_cast<unsigned short>(s.y >> 16)));
  // 4-bit zeros pack 8 rows per word: these 4 rows are its low or high half.
  const int shift = kBits == 4 ? 4 * static_cast<int>(row % 8) : 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    p.zero[r] = static_cast<int>((zeros >> (shift + kBits * r)) & ((1u << kBits) - 1)) + m.zero_offset;
  }
  return p;
}

// Split-K: called by every thread of a block after it stored its partial sums for row tile `tile`; true in the
// last of the tile's k_splits blocks to arrive (which resets the tile's counter for the next launch), and then
// the other blocks' partials are visible to it.
__device__ __forceinline__ bool last_to_arrive(const GemvArgs& a, int tile) {
  __shared__ bool is_last_block;
  __threadfence();  // partials visible device-wide before this block is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(a.counters + tile, 1u);
    is_last_block = arrived == static_cast<uint32_t>(a.k_splits - 1);
    if (is_last_block) a.counters[tile] = 0;  // every block of this launch has arrived: reset for the next
  }
  __syncthreads();
  if (!is_last_block) return false;
  __threadfence();
  return true;
}

// Writes the 4 row sums a thread holds (rows row .. row + 3 of its matrix), or, with split-K, its partials,
// and lets the last block of the row range reduce the slices (adding the residual where there is one). Every
// thread of the block calls it.
__device__ __forceinline__ void finish_rows(const GemvArgs& a, const GemvPart& m, int tile, int64_t block_row0,
                                            int64_t row, float4 sums, bool writer) {
  if (a.atomic_reduce && a.k_splits > 1) {
    // y already holds the residual (in place) or zeros: every slice adds into it; the next kernel's wait covers
    // the adds (fire-and-forget reductions, completed with this grid).
    if (writer) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(m.y + row), sums);  // one vector reduction (sm_90)
#else
      atomicAdd(m.y + row, sums.x);
      atomicAdd(m.y + row + 1, sums.y);
      atomicAdd(m.y + row + 2, sums.z);
      atomicAdd(m.y + row + 3, sums.w);
#endif
    }
    return;
  }
  if (a.k_splits == 1) {
    if (writer) {
      if (a.residual) {
        const float4 r = __ldcg(reinterpret_cast<const float4*>(a.residual + row));
        sums = make_float4(r.x + sums.x, r.y + sums.y, r.z + sums.z, r.w + sums.w);
      }
      *reinterpret_cast<float4*>(m.y + row) = sums;
    }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.cluster_reduce) {
    // Each block leaves its 128 row sums in its shared memory; after a cluster barrier, block (rank) r adds
    // float4 i = r, r + k_splits, ... of every rank's sums in rank order (the order of the L2 path below, so
    // the same bits) and writes them; a second barrier keeps every block's shared memory alive until read.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ float4 block_sums[kRowsPerBlock / 4];
    if (writer) block_sums[(row - block_row0) / 4] = sums;
    cluster.sync();
    const int i = static_cast<int>(cluster.block_rank()) + a.k_splits * static_cast<int>(threadIdx.x);
    const int64_t r = block_row0 + 4 * i;
    if (i < kRowsPerBlock / 4 && r < m.rows) {
      float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int s = 0; s < a.k_splits; ++s) {
        const float4 v = *cluster.map_shared_rank(block_sums + i, s);
        total = make_float4(total.x + v.x, total.y + v.y, total.z + v.z, total.w + v.w);
      }
      if (a.residual) {
        const float4 res = __ldcg(reinterpret_cast<const float4*>(a.residual + r));
        total = make_float4(res.x + total.x, res.y + total.y, res.z + total.z, res.w + total.w);
      }
      *reinterpret_cast<float4*>(m.y + r) = total;
    }
    cluster.sync();
    return;
  }
#endif
  const int64_t slice_stride = int64_t{a.total_tiles} * kRowsPerBlock;  // partials of one input slice
  const int64_t slot = int64_t{tile} * kRowsPerBlock;                   // this tile's rows in a slice's partials
  if (writer) __stcg(reinterpret_cast<float4*>(a.partials + blockIdx.y * slice_stride + slot + (row - block_row0)), sums);
  if (!last_to_arrive(a, tile)) return;
  const int64_t r = block_row0 + threadIdx.x;
  if (r < m.rows) {
    float sum = 0.0f;
    for (int s = 0; s < a.k_splits; ++s) sum += __ldcg(a.partials + s * slice_stride + slot + threadIdx.x);  // fixed order
    if (a.residual) sum = __ldcg(a.residual + r) + sum;
    m.y[r] = sum;
  }
}

// The steps (of kWordsPerStep words) of this block's input slice, and the first word.
struct Slice {
  int64_t first_word;
  int steps;
};

__device__ __forceinline__ Slice block_slice(const GemvArgs& a) {
  Slice s;
  s.first_word = int64_t{blockIdx.y} * a.steps_per_split * kWordsPerStep;
  const int64_t remaining = (a.words - s.first_word + kWordsPerStep - 1) / kWordsPerStep;
  s.steps = static_cast<int>(remaining < a.steps_per_split ? remaining : a.steps_per_split);
  return s;
}

// The vector kernels' dynamic shared memory, bytes from its start: the staged slice of x (fp16 in fragment
// order: 16 bytes a packed word at 4 bits, 8 at 8), then the slice's RMSNorm weights as stored (norm_bytes a
// weight; 0 without kRmsNorm), 16-byte aligned.
struct GemvSharedLayout {
  int64_t norm, total;
};

__host__ __device__ inline GemvSharedLayout gemv_shared_layout(int bits, int64_t steps_per_split, int norm_bytes) {
  const int64_t words = steps_per_split * kWordsPerStep;
  GemvSharedLayout l;
  l.norm = words * (bits == 4 ? 16 : 8);
  l.total = l.norm + (words * (32 / bits) * norm_bytes + 15) / 16 * 16;
  return l;
}

// The kRmsNorm kernels keep the first kNormCacheVectors float4 of x (all of it up to 4096 elements) in static
// shared memory from the sum-of-squares pass, so staging the slice does not go back to L2.
constexpr int kNormCacheVectors = 1024;

// 1 / sqrt(mean(x^2) + eps) over all cols elements of x, for the kRmsNorm input: every block recomputes it
// from the whole vector (16 KB for Llama-3.1-8B, from L2: cheaper than a launch of its own), all loads issued
// together. Float32 sums in a tree order, as norm.cu; the same expression for the result. Every thread calls it.
// kLate (the kBuildLate kernels): issue_late() runs right after this thread's first kNormFirstLoads reads of x
// went out, so that the weight batches held back until after the wait (GemvOptions::late_batches) queue behind
// x, not ahead of it; the same sums in the same order.
// probe: TimelineRing::probe in the timeline build (0 in the product's: folded away).
constexpr int kNormFirstLoads = 8;
template <GemvInput kInput, bool kLate, typename IssueLate>
__device__ __forceinline__ float input_inv_rms(const GemvArgs& a, float4* x_cache, uint32_t probe, int64_t slice_begin4,
                                               int64_t slice_end4, IssueLate&& issue_late) {
  if constexpr (kInput != GemvInput::kRmsNorm) {
    return 1.0f;
  } else {
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const bool slice_only = probe & kProbeNormSliceOnly;
    const bool cached = (probe & kProbeNormFewReaders) && blockIdx.x % 8 != 0;  // probe: x_cache's old bytes
    const int64_t n4 = slice_only ? slice_end4 : a.cols / 4;  // cols % 4 == 0 (gemv_gptq_supports)
    const int64_t begin = (slice_only ? slice_begin4 : 0) + threadIdx.x;
    float sum = 0.0f;
    if constexpr (!kLate) {
#pragma unroll 8
      for (int64_t i = begin; i < n4; i += kThreads) {
        const float4 v = cached && i < kNormCacheVectors ? x_cache[i] : __ldcg(x4 + i);
        if (!cached && i < kNormCacheVectors) x_cache[i] = v;
        sum = fmaf(v.x, v.x, sum);
        sum = fmaf(v.y, v.y, sum);
        sum = fmaf(v.z, v.z, sum);
        sum = fmaf(v.w, v.w, sum);
      }
    } else {
      // kNormFirstLoads loads a thread go out together, then the late batches, and only then are the loaded
      // elements kept and summed (a shared-memory store between two loads would hold the second until the
      // first's data came). An element past the end reads as zero and adds exactly nothing (the sum is never -0).
      auto chunk = [&](int64_t first, bool with_late) {
        float4 v[kNormFirstLoads];
#pragma unroll
        for (int u = 0; u < kNormFirstLoads; ++u) {
          const int64_t i = first + int64_t{u} * kThreads;
          v[u] = i >= n4 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : cached && i < kNormCacheVectors ? x_cache[i] : __ldcg(x4 + i);
        }
        if (with_late) issue_late();
#pragma unroll
        for (int u = 0; u < kNormFirstLoads; ++u) {
          const int64_t i = first + int64_t{u} * kThreads;
          if (!cached && i < n4 && i < kNormCacheVectors) x_cache[i] = v[u];
          sum = fmaf(v[u].x, v[u].x, sum);
          sum = fmaf(v[u].y, v[u].y, sum);
          sum = fmaf(v[u].z, v[u].z, sum);
          sum = fmaf(v[u].w, v[u].w, sum);
        }
      };
      chunk(begin, true);  // every thread, even one past the end: each must issue its late batches once
      for (int64_t first = begin + int64_t{kNormFirstLoads} * kThreads; first < n4; first += int64_t{kNormFirstLoads} * kThreads) {
        chunk(first, false);
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    __shared__ float warp_sums[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kThreads / 32; ++k) total += warp_sums[k];
    return 1.0f / sqrtf(total / static_cast<float>(a.cols) + a.norm_eps);
  }
}

// Elements 4 i .. 4 i + 3 of the product's input, the fused op applied (numerics as norm.cu / elementwise.cu).
// x (and up) were written by the previous kernel: read through L2 (programmatic_launch.cuh).
// kRmsNorm: norm_slice holds the norm weights of the block's slice (shared memory, copied before the wait),
// from element norm_first of the vector.
template <GemvInput kInput>
__device__ __forceinline__ float4 load_input4(const GemvArgs& a, int64_t i, float inv_rms, const float4* x_cache,
                                              const char* norm_slice, int64_t norm_first, uint32_t probe) {
  if constexpr (kInput == GemvInput::kRmsNorm) {
    const float4 v = i < kNormCacheVectors ? x_cache[i] : __ldcg(reinterpret_cast<const float4*>(a.x) + i);
    if (probe & kProbeNormNoWeight) return make_float4(v.x * inv_rms, v.y * inv_rms, v.z * inv_rms, v.w * inv_rms);
    const float4 w = widen4_shared(norm_slice, a.norm_type, 4 * i - norm_first);
    return make_float4(w.x * (v.x * inv_rms), w.y * (v.y * inv_rms), w.z * (v.z * inv_rms), w.w * (v.w * inv_rms));
  } else if constexpr (kInput == GemvInput::kSiluMul) {
    return silu_mul4(__ldcg(reinterpret_cast<const float4*>(a.x) + i), __ldcg(reinterpret_cast<const float4*>(a.up) + i));
  } else {
    return __ldcg(reinterpret_cast<const float4*>(a.x) + i);
  }
}

// Steps of weights whose loads are issued together; two such batches are in flight (ping-pong registers), three
// in the 8-bit vector kernel (kInFlight below).
constexpr int kBatch = 4;

// What one thread works on in one row tile (kRowsPerBlock rows of one part).
struct TileView {
  GemvPart m;
  int64_t row0;  // the tile's first row in its part
  int64_t row;   // this thread's first of 4 rows
  bool row_ok;
  const int32_t* weights;  // this thread's word of the slice's first step
};

__device__ __forceinline__ TileView tile_view(const GemvArgs& a, int tile, int64_t first_word, int warp, int quad_row,
                                              int quad_col) {
  TileView v;
  v.m = tile_part(a, tile);
  v.row0 = int64_t{tile - v.m.first_tile} * kRowsPerBlock;
  v.row = v.row0 + warp * 32 + 4 * quad_row;
  v.row_ok = v.row < v.m.rows;
  v.weights = v.m.qweight + (first_word + quad_col) * v.m.rows + v.row;
  return v;
}

// The batch kernels' end of a row tile: thread (quad_row, quad_col) holds, per n-tile t, tokens
// 8 t + 2 quad_col + (0, 1) of its 4 rows (total[t][2 r + e]: row r, token e). Without split-K they go to y
// (plus the residual); with it, to the partials, and the last block of the tile to arrive adds the slices in
// a fixed order, as finish_rows does.
template <int kTiles>
__device__ __forceinline__ void finish_tokens(const GemvArgs& a, const TileView& v, int tile, int quad_col,
                                              const float (&total)[kTiles][8]) {
  const int64_t slice_stride = int64_t{a.total_tiles} * kRowsPerBlock;  // floats per token and slice
  const int64_t slot = int64_t{tile} * kRowsPerBlock + (v.row - v.row0);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t j = 8 * t + 2 * quad_col + e;
      if (!v.row_ok || j >= a.tokens) continue;
      float4 sums = make_float4(total[t][e], total[t][2 + e], total[t][4 + e], total[t][6 + e]);
      if (a.k_splits == 1) {
        if (a.residual) {
          const float4 r = __ldcg(reinterpret_cast<const float4*>(a.residual + j * v.m.rows + v.row));
          sums = make_float4(r.x + sums.x, r.y + sums.y, r.z + sums.z, r.w + sums.w);
        }
        *reinterpret_cast<float4*>(v.m.y + j * v.m.rows + v.row) = sums;
      } else {
        __stcg(reinterpret_cast<float4*>(a.partials + (blockIdx.y * a.tokens + j) * slice_stride + slot), sums);
      }
    }
  }
  if (a.k_splits == 1 || !last_to_arrive(a, tile)) return;
  // Thread (c = threadIdx.x % 32) adds float4 column c (rows 4 c .. 4 c + 3 of the tile) of tokens
  // threadIdx.x / 32 + 4 k, each slice's loads for all its tokens in flight together, slices in a fixed order.
  constexpr int kItems = 2 * kTiles;  // 8 kTiles token rows over 4 groups of 32 threads
  const int c = threadIdx.x % 32, j0 = threadIdx.x / 32;
  const float4* column = reinterpret_cast<const float4*>(a.partials + int64_t{tile} * kRowsPerBlock) + c;
  const int64_t token_stride4 = slice_stride / 4;  // float4 between consecutive (slice, token) rows
  float4 sums[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) sums[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
  for (int s = 0; s < a.k_splits; ++s) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = j0 + 4 * k;
      if (j < a.tokens) {
        const float4 p = __ldcg(column + (s * a.tokens + j) * token_stride4);
        sums[k] = make_float4(sums[k].x + p.x, sums[k].y + p.y, sums[k].z + p.z, sums[k].w + p.w);
      }
    }
  }
  const int64_t r = v.row0 + 4 * c;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t j = j0 + 4 * k;
    if (j >= a.tokens || r >= v.m.rows) continue;  // rows % 4 == 0: the 4 rows exist together
    float4 out = sums[k];
    if (a.residual) {
      const float4 res = __ldcg(reinterpret_cast<const float4*>(a.residual + j * v.m.rows + r));
      out = make_float4(res.x + out.x, res.y + out.y, res.z + out.z, res.w + out.w);
    }
    *reinterpret_cast<float4*>(v.m.y + j * v.m.rows + r) = out;
  }
}

// kTiles == 0: the token generator's kernel, one vector x broadcast to all 8 columns of the mma's B operand.
// kTiles 1 to 4 (the batch kernels, 4-bit, plain or SiLU*up input): 8 kTiles token rows of x, token 8 t + n in
// column n of n-tile t, each step's dequantized weights multiplied with every n-tile; a block computes
// a.row_tiles row tiles one after another with the same staged x (gemv_gptq_batch in gemv_gptq.h says why).
// kTimeline (vector kernels only): thread 0 stamps the block's phases into a.timeline (timeline.h).
// kBuild (vector kernels only; launch_one says which launch gets which): kBuildDeep, three batches of weight
// loads in flight instead of two. Build flags that measured slower and were removed (session 17,
// docs/PERFORMANCE.md): the first register batches after the wait (only L2 prefetch before it) for o, -1.7%
// tg128; each batch's group change made after the previous batch's loads went out, -7% at group 128.
constexpr unsigned kBuildDeep = 1;
// kBuildLate (4-bit, RMSNorm input): GemvOptions::late_batches, the last batches in flight sent after the wait,
// behind the first reads of x (input_inv_rms); its own build, so that the other builds' code is untouched. Fewer
// bytes ahead of x let down's last adds drain sooner (q/k/v past its wait 1.2 instead of 1.5 us after down on an
// H200), but x's sum of squares then waits for the warp to issue the held-back loads (the SM's request queue is
// full): +1.5% tg128 per channel with one batch late for q/k/v and gate/up on an H200 (session 34). Launched
// capped at 120 registers (gemv_gptq_tensor_core_capped): at 128 the step lost 5-7% after ~1,000 positions.
constexpr unsigned kBuildLate = 2;
// kBuildUniformZeros (4-bit vector kernels, slices of several groups; launched with kBuildDeep): every zero of
// every part is the part's GemvPart::uniform_zero (a symmetric grid), so the dequantization biases are decoded
// once before the loop and a group change loads and converts only the scales; the general build decodes each
// group's zeros (~12 dependent instructions at the head of every batch at group 128, before its first HSUB2)
// and loads them. The same biases: bitwise the same sums. Session 35 (8B at group 128): with three batches in
// flight for every product +3.7% tg128 on an H200, 0 to +1.1% on H100s (114-118 registers under the cap of
// gemv_gptq_tensor_core_capped, 121-124 without); with two (80-96 registers) five blocks fit an SM and the step
// lost 5%; the scales copied into shared memory before the wait on top gained nothing.
constexpr unsigned kBuildUniformZeros = 4;
template <int kBits, GemvInput kInput, int kTiles, bool kTimeline, unsigned kBuild>
__device__ __forceinline__ void gemv_gptq_tensor_core_body(const GemvArgs& a) {
  constexpr bool kDeep = kBuild & kBuildDeep;
  constexpr bool kLate = kBuild & kBuildLate;
  constexpr bool kUniformZeros = kBuild & kBuildUniformZeros;
  static_assert(!kUniformZeros || (kBits == 4 && kTiles == 0 && !kLate), "kBuildUniformZeros: 4-bit vector kernels");
  static_assert(!kLate || (kBits == 4 && kInput == GemvInput::kRmsNorm && kTiles == 0), "kBuildLate: 4-bit RMSNorm vector kernels");
  constexpr bool kBatched = kTiles > 0;
  constexpr int kSets = kBatched ? kTiles : 1;  // accumulator sets (n-tiles)
  constexpr int kSums = kBatched ? 8 : 4;       // float32 sums per set: 4 rows (x 2 tokens when batched)
  static_assert(!kBatched || (kBits == 4 && kInput != GemvInput::kRmsNorm && kTiles <= 4),
                "batch kernels: 4-bit weights, plain or SiLU*up input, up to 32 tokens");
  static_assert(!(kBatched && kTimeline), "the timeline instruments the vector kernels");
  static_assert(!kBatched || kBuild == 0, "the kBuild variants are vector kernels");
  uint64_t stamps[kTimelineStamps] = {};
  auto stamp = [&](int i) {
    if constexpr (kTimeline) {
      if (threadIdx.x == 0) stamps[i] = timeline_now();
    }
  };
  stamp(0);
  allow_dependent_launch();
  const int row_tiles = kBatched ? a.row_tiles : 1;
  const int first_tile = static_cast<int>(blockIdx.x) * row_tiles;
  const Slice slice = block_slice(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  TileView v = tile_view(a, first_tile, slice.first_word, warp, quad_row, quad_col);
  // Steps in which this thread's word exists (the matrix's last step may have fewer than 4 words).
  const int64_t thread_words = a.words - slice.first_word - quad_col;
  const int thread_steps = static_cast<int>(
      min(int64_t{slice.steps}, thread_words > 0 ? (thread_words + kWordsPerStep - 1) / kWordsPerStep : 0));
  extern __shared__ uint4 shared_words[];
  char* const shared_bytes = reinterpret_cast<char*>(shared_words);
  const GemvSharedLayout layout =
      gemv_shared_layout(kBits, a.steps_per_split, kInput == GemvInput::kRmsNorm ? weight_type_bytes(a.norm_type) : 0);
  // kRmsNorm: the slice's norm weights into shared memory, the first group of copies (they depend on nothing
  // earlier): staging reads them right after the wait, where an L2 or HBM round trip would sit on every
  // block's critical path (the timeline measured ~1 us a RMSNorm kernel with them read from global memory).
  const char* const norm_slice = shared_bytes + layout.norm;
  const int64_t norm_first = slice.first_word * (32 / kBits);  // the slice's first element
  if constexpr (kInput == GemvInput::kRmsNorm) {
    const int elem = weight_type_bytes(a.norm_type);
    const int64_t words = min(int64_t{slice.steps} * kWordsPerStep, a.words - slice.first_word);
    const char* from = static_cast<const char*>(a.norm_weight) + norm_first * elem;
    // A slice starts on a step (4 words, 32 or 16 weights): 16-byte aligned. Its bytes are a multiple of 8.
    const int64_t bytes = words * (32 / kBits) * elem;
    for (int64_t off = int64_t{threadIdx.x} * 16; off < bytes; off += kThreads * 16) {
      if (off + 16 <= bytes) cp_async16(shared_bytes + layout.norm + off, from + off);
      else cp_async8(shared_bytes + layout.norm + off, from + off);
    }
    cp_async_commit();
  }
  auto load_batch = [&](const TileView& tv, uint4 (&batch)[kBatch], int first) {
    const int64_t step_stride = kWordsPerStep * tv.m.rows;
    if (tv.row_ok && first + kBatch <= thread_steps) {  // the common case: no per-load predicate
#pragma unroll
      for (int u = 0; u < kBatch; ++u) batch[u] = load_streaming(tv.weights + (first + u) * step_stride);
      return;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = first + u;
      batch[u] = tv.row_ok && s < thread_steps ? load_streaming(tv.weights + s * step_stride) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first batches go out before anything else: they depend on nothing, not even the previous kernel.
  // Batches in flight: three for the 8-bit vector kernel (the LM head: 525 MB for Llama-3.1-8B in ~2 waves of
  // blocks that stream 256 steps each; with two batches it reached 3.6 TB/s, with three 4.16, the H200's copy
  // bandwidth, 146 -> 126 us a token: session 15) and the kDeep builds (launch_one), two for the others (three
  // cost the 4-bit token generator's layers 1.1% when every product had them, and group 128 ~1% even for the
  // RMSNorm products alone: session 16). 8-bit at three: 120-127 registers, 4-bit 119; still 4 blocks an SM.
  constexpr int kInFlight = (kBits == 8 || kDeep) && !kBatched ? 3 : 2;
  // GemvOptions::late_batches: the last `late` of them go out after the wait, behind the block's reads of x
  // (input_inv_rms' issue_late), so that x does not queue behind them; the first always goes out here.
  const int late = kLate ? min(a.late_batches, kInFlight - 1) : 0;
  uint4 ping[kBatch], pong[kBatch], pang[kBatch];
  load_batch(v, ping, 0);
  if (late < kInFlight - 1) load_batch(v, pong, kBatch);
  if constexpr (kInFlight == 3) {
    if (late < 1) load_batch(v, pang, 2 * kBatch);
  }
  auto issue_late = [&] {
    if (late >= kInFlight - 1) load_batch(v, pong, kBatch);
    if constexpr (kInFlight == 3) {
      if (late >= 1) load_batch(v, pang, 2 * kBatch);
    }
  };

  // This group's scales and zeros, and the next group's, loaded while this one is computed; the pointers step
  // one group (a row of scales, a row of zeros) at a time.
  const int64_t first_step = slice.first_word / kWordsPerStep;
  int steps_to_group = 0;
  const uint16_t* scales_at = nullptr;
  const int32_t* zeros_at = nullptr;
  int64_t zeros_stride = 0;  // int32 words of zeros per group
  uint2 raw_scales, next_scales;
  uint32_t raw_zeros, next_zeros;
  auto start_tile_params = [&](const TileView& tv) {
    const int64_t group = first_step / a.group_steps;  // group_steps > 0
    steps_to_group = static_cast<int>(a.group_steps - first_step % a.group_steps);  // to the next group start
    zeros_stride = tv.m.rows * kBits / 32;
    scales_at = tv.m.scales + group * tv.m.rows + tv.row;
    zeros_at = tv.m.qzeros + group * zeros_stride + tv.row * kBits / 32;
    if constexpr (kUniformZeros) {
      raw_scales = load_raw_scales(scales_at, tv.row_ok);
      scales_at += tv.m.rows;
      next_scales = load_raw_scales(scales_at, tv.row_ok && steps_to_group < slice.steps);
      return;
    }
    load_raw_params(scales_at, zeros_at, tv.row_ok, raw_scales, raw_zeros);
    scales_at += tv.m.rows;
    zeros_at += zeros_stride;
    load_raw_params(scales_at, zeros_at, tv.row_ok && steps_to_group < slice.steps, next_scales, next_zeros);
  };
  start_tile_params(v);

  // The rest of the block's first l2_prefetch_steps steps into L2: one 128-row line run (512 bytes at 4 bytes
  // a row) per packed word.
  {
    const int prefetch_words = min(slice.steps, a.l2_prefetch_steps) * kWordsPerStep;
    const uint32_t run_bytes = static_cast<uint32_t>(min(int64_t{kRowsPerBlock}, v.m.rows - v.row0)) * 4;
    for (int i = kInFlight * kBatch * kWordsPerStep + threadIdx.x; i < prefetch_words; i += kThreads) {
      const int64_t word = slice.first_word + i;
      if (word < a.words) prefetch_l2(v.m.qweight + word * v.m.rows + v.row0, run_bytes);
    }
  }

  const uint32_t probe = kTimeline ? a.timeline.probe : 0u;
  if constexpr (kTimeline) {
    if (probe & kProbeTouchArgs) {  // the parameters read after the wait, read before it (into no register kept)
      asm volatile("" ::"l"(a.x), "l"(a.up), "l"(a.norm_weight), "f"(a.norm_eps), "l"(a.residual), "l"(a.partials),
                   "l"(a.counters), "l"(a.cols), "l"(a.words), "r"(a.k_splits), "r"(a.atomic_reduce), "l"(a.clear[0]),
                   "l"(a.clear[1]), "l"(a.clear_vectors[0]), "l"(a.clear_vectors[1]), "l"(a.tokens), "r"(a.total_tiles),
                   "l"(v.m.y), "r"(a.cluster_reduce), "r"(a.n_parts));
    }
  }

  // Everything above reads only weights; x is the previous kernel's output.
  stamp(5);  // every load, prefetch and copy above issued
  wait_for_previous_kernel();
  stamp(1);
  if constexpr (kTimeline && kBits == 4 && kInput == GemvInput::kPlain) {  // diagnostic (timeline.h): o's chain left out
    if (probe & kProbePlainGemvStopAfterWait) {
      if (threadIdx.x == 0) {
        timeline_append(a.timeline, a.parts[0].qweight, 0x10u * kBits + static_cast<uint32_t>(kInput),
                        static_cast<uint32_t>(slice.steps), stamps);
      }
      return;
    }
  }
  float4* x_cache = nullptr;
  if constexpr (kInput == GemvInput::kRmsNorm) {
    __shared__ float4 norm_cache[kNormCacheVectors];
    x_cache = norm_cache;
  }
  // This thread's copies of the norm weights done; the block's barrier in input_inv_rms makes all visible.
  if constexpr (kInput == GemvInput::kRmsNorm) cp_async_wait<0>();
  const int64_t slice_begin4 = slice.first_word * (32 / kBits) / 4;
  const float inv_rms = input_inv_rms<kInput, kLate>(
      a, x_cache, probe, slice_begin4,
      min(a.cols / 4, slice_begin4 + int64_t{slice.steps} * kWordsPerStep * (32 / kBits) / 4), issue_late);
  if constexpr (kInput == GemvInput::kRmsNorm) stamp(4);

  // x of this slice in fp16, per word in fragment order: 4-bit {x0,x4},{x1,x5},{x2,x6},{x3,x7}; 8-bit
  // {x0,x2},{x1,x3}. Zero past the last word, where the weights read as zero codes (code - zero != 0), and
  // for the batch kernels' token rows past a.tokens.
  constexpr int kRegsPerWord = kBits == 4 ? 4 : 2;
  uint32_t* x_staged = reinterpret_cast<uint32_t*>(shared_words);
  if constexpr (kBatched) {
    // Up to 32 token rows: each thread's loads for kStageUnroll fragments go out together (one at a time, the
    // L2 latency of each would be paid in turn, tens of microseconds for a large slice).
    constexpr int kStageUnroll = kInput == GemvInput::kSiluMul ? 4 : 8;  // 64 registers of loads either way
    const int slice_words = slice.steps * kWordsPerStep;
    const int n = 8 * kTiles * slice_words;
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const float4* up4 = reinterpret_cast<const float4*>(a.up);
    const int64_t token_vectors = a.cols / 4;  // float4 per token row of x
    for (int base = threadIdx.x; base < n; base += kThreads * kStageUnroll) {
      float4 lo[kStageUnroll], hi[kStageUnroll], up_lo[kStageUnroll], up_hi[kStageUnroll];
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u) {
        const int i = base + u * kThreads, t = i / slice_words;
        const int64_t word = slice.first_word + i % slice_words;
        const bool ok = i < n && t < a.tokens && word < a.words;
        const int64_t at = t * token_vectors + 2 * word;
        const float4 zero = make_float4(0, 0, 0, 0);
        lo[u] = ok ? __ldcg(x4 + at) : zero;
        hi[u] = ok ? __ldcg(x4 + at + 1) : zero;
        if constexpr (kInput == GemvInput::kSiluMul) {
          up_lo[u] = ok ? __ldcg(up4 + at) : zero;
          up_hi[u] = ok ? __ldcg(up4 + at + 1) : zero;
        }
      }
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i >= n) break;
        if constexpr (kInput == GemvInput::kSiluMul) {  // SiLU(0) * 0 = 0 where the row or word is past the end
          lo[u] = silu_mul4(lo[u], up_lo[u]);
          hi[u] = silu_mul4(hi[u], up_hi[u]);
        }
        const uint4 frag = make_uint4(pack_half2(lo[u].x, hi[u].x), pack_half2(lo[u].y, hi[u].y),
                                      pack_half2(lo[u].z, hi[u].z), pack_half2(lo[u].w, hi[u].w));
        *reinterpret_cast<uint4*>(reinterpret_cast<char*>(x_staged) + (i / slice_words) * a.x_stride_bytes +
                                  (i % slice_words) * 16) = frag;
      }
    }
  } else {
    for (int i = threadIdx.x; i < slice.steps * kWordsPerStep; i += kThreads) {
      const int64_t word = slice.first_word + i;
      if constexpr (kBits == 4) {
        uint4 frag = make_uint4(0, 0, 0, 0);
        if (word < a.words) {
          const float4 lo = load_input4<kInput>(a, 2 * word, inv_rms, x_cache, norm_slice, norm_first, probe),
                       hi = load_input4<kInput>(a, 2 * word + 1, inv_rms, x_cache, norm_slice, norm_first, probe);
          frag = make_uint4(pack_half2(lo.x, hi.x), pack_half2(lo.y, hi.y), pack_half2(lo.z, hi.z),
                            pack_half2(lo.w, hi.w));
        }
        reinterpret_cast<uint4*>(x_staged)[i] = frag;
      } else {
        uint2 frag = make_uint2(0, 0);
        if (word < a.words) {
          const float4 x4 = load_input4<kInput>(a, word, inv_rms, x_cache, norm_slice, norm_first, probe);
          frag = make_uint2(pack_half2(x4.x, x4.z), pack_half2(x4.y, x4.w));
        }
        reinterpret_cast<uint2*>(x_staged)[i] = frag;
      }
    }
  }
  __syncthreads();
  stamp(2);
  // The batch kernels' B fragments: token row quad_row of each n-tile, word quad_col of each step.
  const char* x_thread = reinterpret_cast<const char*>(x_staged) + (kBatched ? quad_row * a.x_stride_bytes : 0) + quad_col * 16;
  const int tile_stride_bytes = kBatched ? 8 * a.x_stride_bytes : 0;

  // D rows (row, row + 1) and (row + 2, row + 3): columns 2 quad_col, 2 quad_col + 1 of each n-tile.
  float acc01[kSets][4], acc23[kSets][4];
  float total[kSets][kSums];
  float scale[4] = {0, 0, 0, 0};
  uint32_t bias_low[4], bias_high[4];
  int steps_in_acc = 0;
  auto clear = [&] {
#pragma unroll
    for (int t = 0; t < kSets; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc01[t][i] = acc23[t][i] = 0.0f;
#pragma unroll
      for (int i = 0; i < kSums; ++i) total[t][i] = 0.0f;
    }
    steps_in_acc = 0;
  };
  clear();
  auto promote = [&] {  // the tensor cores' float32 accumulation truncates: keep its sums short
#pragma unroll
    for (int t = 0; t < kSets; ++t) {
      if constexpr (kBatched) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          total[t][0 + e] += scale[0] * acc01[t][e];
          total[t][2 + e] += scale[1] * acc01[t][2 + e];
          total[t][4 + e] += scale[2] * acc23[t][e];
          total[t][6 + e] += scale[3] * acc23[t][2 + e];
        }
      } else {  // every column holds the same sums: one of them
        total[t][0] += scale[0] * acc01[t][0];
        total[t][1] += scale[1] * acc01[t][2];
        total[t][2] += scale[2] * acc23[t][0];
        total[t][3] += scale[3] * acc23[t][2];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc01[t][i] = acc23[t][i] = 0.0f;
    }
    steps_in_acc = 0;
  };
  if constexpr (kUniformZeros) {  // once: every group's zeros are the same
    zero_biases<kBits>(static_cast<uint32_t>(v.m.uniform_zero) * 0x11111111u, zero_bias_bases(v.m.zero_offset), bias_low,
                       bias_high);
  }
  auto decode_params = [&] {
    if constexpr (!kUniformZeros) {
      const int zero_shift = kBits == 4 ? 4 * static_cast<int>(v.row % 8) : 0;  // 4-bit zeros pack 8 rows a word
      zero_biases<kBits>(raw_zeros >> zero_shift, zero_bias_bases(v.m.zero_offset), bias_low, bias_high);
    }
    decode_scales(raw_scales, scale);
  };
  decode_params();

  auto next_group = [&](int s) {  // step s starts a new group (uniform: steps never straddle groups)
    promote();
    raw_scales = next_scales;
    if constexpr (!kUniformZeros) raw_zeros = next_zeros;
    decode_params();
    steps_to_group = a.group_steps;
    scales_at += v.m.rows;
    if constexpr (kUniformZeros) {
      next_scales = load_raw_scales(scales_at, v.row_ok && s + steps_to_group < slice.steps);
      return;
    }
    zeros_at += zeros_stride;
    load_raw_params(scales_at, zeros_at, v.row_ok && s + steps_to_group < slice.steps, next_scales, next_zeros);
  };
  auto compute_step = [&](const uint4& w, int s) {
    if constexpr (kBatched) {
      uint32_t v0[4], v1[4], v2[4], v3[4];
      dequant_word4(w.x, bias_low[0], bias_high[0], v0);
      dequant_word4(w.y, bias_low[1], bias_high[1], v1);
      dequant_word4(w.z, bias_low[2], bias_high[2], v2);
      dequant_word4(w.w, bias_low[3], bias_high[3], v3);
      const char* xs = x_thread + s * (kWordsPerStep * 16);
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const uint4 xf = *reinterpret_cast<const uint4*>(xs + t * tile_stride_bytes);
        mma_m16n8k16(acc01[t], v0[0], v1[0], v0[1], v1[1], xf.x, xf.y);
        mma_m16n8k16(acc01[t], v0[2], v1[2], v0[3], v1[3], xf.z, xf.w);
        mma_m16n8k16(acc23[t], v2[0], v3[0], v2[1], v3[1], xf.x, xf.y);
        mma_m16n8k16(acc23[t], v2[2], v3[2], v2[3], v3[3], xf.z, xf.w);
      }
    } else {
      const uint32_t* xs = x_staged + (s * kWordsPerStep + quad_col) * kRegsPerWord;
      if constexpr (kBits == 4) {
        const uint4 xf = *reinterpret_cast<const uint4*>(xs);
        uint32_t v0[4], v1[4], v2[4], v3[4];
        dequant_word4(w.x, bias_low[0], bias_high[0], v0);
        dequant_word4(w.y, bias_low[1], bias_high[1], v1);
        dequant_word4(w.z, bias_low[2], bias_high[2], v2);
        dequant_word4(w.w, bias_low[3], bias_high[3], v3);
        mma_m16n8k16(acc01[0], v0[0], v1[0], v0[1], v1[1], xf.x, xf.y);
        mma_m16n8k16(acc01[0], v0[2], v1[2], v0[3], v1[3], xf.z, xf.w);
        mma_m16n8k16(acc23[0], v2[0], v3[0], v2[1], v3[1], xf.x, xf.y);
        mma_m16n8k16(acc23[0], v2[2], v3[2], v2[3], v3[3], xf.z, xf.w);
      } else {
        const uint2 xf = *reinterpret_cast<const uint2*>(xs);
        uint32_t v0[2], v1[2], v2[2], v3[2];
        dequant_word8(w.x, bias_low[0], v0);
        dequant_word8(w.y, bias_low[1], v1);
        dequant_word8(w.z, bias_low[2], v2);
        dequant_word8(w.w, bias_low[3], v3);
        mma_m16n8k16(acc01[0], v0[0], v1[0], v0[1], v1[1], xf.x, xf.y);
        mma_m16n8k16(acc23[0], v2[0], v3[0], v2[1], v3[1], xf.x, xf.y);
      }
    }
  };
  auto compute_batch = [&](const uint4 (&batch)[kBatch], int first) {
    // The common case, decided once per batch (uniform across the block): kBatch steps inside the slice, a
    // group change at most before the first. At ~41 instructions a step of arithmetic, per-step checks cost
    // a large share of the loop.
    if (first + kBatch <= slice.steps &&
        (steps_to_group >= kBatch || (steps_to_group == 0 && a.group_steps >= kBatch))) {
      if (steps_to_group == 0) {
        next_group(first);
      } else if (steps_in_acc + kBatch > kPromoteSteps) {
        promote();
      }
      steps_to_group -= kBatch;
      steps_in_acc += kBatch;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) compute_step(batch[u], first + u);
      return;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = first + u;
      if (s >= slice.steps) break;  // uniform across the block
      if (s > 0 && steps_to_group == 0) {
        next_group(s);
      } else if (steps_in_acc == kPromoteSteps) {
        promote();
      }
      --steps_to_group;
      ++steps_in_acc;
      compute_step(batch[u], s);
    }
  };

  for (int r = 0;; ++r) {
    // kInFlight batches in flight: while one is computed, the others' loads are outstanding; each batch's next
    // loads go out as soon as it is computed.
    constexpr int kRound = kInFlight * kBatch;  // steps a round of the loop computes
    for (int first = 0; first < slice.steps; first += kRound) {
      compute_batch(ping, first);
      if (first + kRound < slice.steps) load_batch(v, ping, first + kRound);
      if (first + kBatch < slice.steps) compute_batch(pong, first + kBatch);
      if (first + kBatch + kRound < slice.steps) load_batch(v, pong, first + kBatch + kRound);
      if constexpr (kInFlight == 3) {
        if (first + 2 * kBatch < slice.steps) compute_batch(pang, first + 2 * kBatch);
        if (first + 2 * kBatch + kRound < slice.steps) load_batch(v, pang, first + 2 * kBatch + kRound);
      }
    }
    promote();
    const int tile = first_tile + r;
    if constexpr (kBatched) {
      // The next row tile's first loads and parameters go out before this one's epilogue.
      const bool more = r + 1 < row_tiles && tile + 1 < a.total_tiles;
      TileView next = v;
      if (more) {
        next = tile_view(a, tile + 1, slice.first_word, warp, quad_row, quad_col);
        load_batch(next, ping, 0);
        load_batch(next, pong, kBatch);
      }
      finish_tokens<kTiles>(a, v, tile, quad_col, total);
      if (!more) break;
      v = next;
      start_tile_params(v);
      decode_params();
      clear();
    } else {
      // Every thread of a quad holds the same sums (all D columns are equal); the first writes them.
      stamp(3);
      GemvPart out = v.m;
      const float4 row_sums = make_float4(total[0][0], total[0][1], total[0][2], total[0][3]);
      const bool writer = v.row_ok && quad_col == 0;
      bool finished = false;
      if constexpr (kTimeline && kInput == GemvInput::kSiluMul) {  // probes of down's split-K adds (timeline.h)
        if (probe & kProbeSiluAddsElsewhere) out.y = a.partials;  // into scratch, x untouched
        if ((probe & kProbeSiluStores) && a.atomic_reduce && a.k_splits > 1) {
          if (writer) *reinterpret_cast<float4*>(out.y + v.row) = row_sums;  // stores, not adds: wrong sums
          finished = true;
        }
      }
      if (!finished) finish_rows(a, out, tile, v.row0, v.row, row_sums, writer);
      if constexpr (kTimeline && kInput == GemvInput::kSiluMul) {
        if (probe & kProbeSiluFence) __threadfence();  // the block's adds performed before it ends
      }
      // GemvFusion::clear: after the wait (above), with the hot loop's registers free.
      const int64_t blocks = int64_t{gridDim.x} * gridDim.y;
      const int64_t b = int64_t{blockIdx.y} * gridDim.x + blockIdx.x;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        for (int64_t i = b * kThreads + threadIdx.x; i < a.clear_vectors[c]; i += blocks * kThreads) {
          __stcg(reinterpret_cast<float4*>(a.clear[c]) + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
      }
      stamp(kTimelineStamps - 1);
      if constexpr (kTimeline) {
        if (threadIdx.x == 0) {
          timeline_append(a.timeline, a.parts[0].qweight, 0x10u * kBits + static_cast<uint32_t>(kInput),
                          static_cast<uint32_t>(slice.steps), stamps);
        }
      }
      break;
    }
  }
}

template <int kBits, GemvInput kInput, int kTiles, bool kTimeline = false, unsigned kBuild = 0>
__global__ void __launch_bounds__(kThreads) gemv_gptq_tensor_core(const GemvArgs a) {
  gemv_gptq_tensor_core_body<kBits, kInput, kTiles, kTimeline, kBuild>(a);
}

// The kBuildUniformZeros and kBuildLate builds at most 120 registers. Unbounded they take 121-128, which the
// allocation rounds to 128 a thread; then the step lost 4% after 1,000 positions at group 128 on an H200 (uniform
// zeros, session 35) and 5-7% per channel on H100s and an H200 (late batches, session 34), and neither loses
// there capped (session 35, H100). The arithmetic of the register file: q/k/v's 384 blocks leave most SMs three
// (3 x 128 x 120 = 46,080 registers), and the attention kernel's block that starts beside them to stage its KV
// chunks before its wait (4 slots x 32 threads x 152 = 19,456) fits the 65,536 exactly; at 128 (49,152) it
// waits for a q/k/v block to leave, which matters once attention has many blocks (long contexts). The cap costs
// the three-batch late build 12 bytes of spills (ptxas -v, sm_90a), the others none. Keep every decode build
// that runs beside attention at 120 or less.
constexpr int kCappedRegisters = 120;
template <int kBits, GemvInput kInput, bool kTimeline, unsigned kBuild>
__global__ void __maxnreg__(kCappedRegisters) gemv_gptq_tensor_core_capped(const GemvArgs a) {
  gemv_gptq_tensor_core_body<kBits, kInput, 0, kTimeline, kBuild>(a);
}

// The baseline: lane l of every warp owns rows 4l .. 4l + 3 of the block's 128; warp k takes word k of each
// step; float32 x, one FMA per weight, the zero folded into the magic-number conversion:
// float(0x4B000000 | code) - (2^23 + zero) = code - zero exactly. One matrix, plain input, no overlap.
template <int kBits>
__global__ void __launch_bounds__(kThreads) gemv_gptq_cuda_core(const GemvArgs a) {
  constexpr int kCodes = 32 / kBits;
  constexpr int kVectorsPerWord = kCodes / 4;  // float4 of x per word
  extern __shared__ float4 x_shared[];
  const GemvPart& m = a.parts[0];
  const Slice slice = block_slice(a);
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  for (int64_t i = threadIdx.x; i < slice.steps * kWordsPerStep * kVectorsPerWord; i += kThreads) {
    const int64_t word = slice.first_word + i / kVectorsPerWord;
    x_shared[i] = word < a.words ? __ldg(x4 + slice.first_word * kVectorsPerWord + i) : make_float4(0, 0, 0, 0);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t block_row0 = int64_t{blockIdx.x} * kRowsPerBlock;
  const int64_t row = block_row0 + 4 * lane;
  const bool row_ok = row < m.rows;
  const int32_t* weights = m.qweight + (slice.first_word + warp) * m.rows + row;
  const int64_t step_stride = kWordsPerStep * m.rows;
  constexpr uint32_t kMask = (1u << kBits) - 1;

  float acc[4] = {0, 0, 0, 0}, total[4] = {0, 0, 0, 0};
  RowGroupParams params{};
  float bias[4];
  int64_t group = -1;
  for (int64_t s0 = 0; s0 < slice.steps; s0 += kUnroll) {
    uint4 w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool ok = row_ok && s0 + u < slice.steps && slice.first_word + (s0 + u) * kWordsPerStep + warp < a.words;
      w[u] = ok ? load_streaming(weights + (s0 + u) * step_stride) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t s = s0 + u;
      if (s >= slice.steps) break;
      const int64_t step_group = (slice.first_word + s * kWordsPerStep) / a.group_words;
      if (step_group != group) {
        if (group >= 0) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            total[r] += params.scale[r] * acc[r];
            acc[r] = 0.0f;
          }
        }
        params = load_group_params<kBits>(m, step_group, row, row_ok);
#pragma unroll
        for (int r = 0; r < 4; ++r) bias[r] = 8388608.0f + static_cast<float>(params.zero[r]);
        group = step_group;
      }
      const float4* xs = x_shared + (s * kWordsPerStep + warp) * kVectorsPerWord;
      const uint32_t words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
#pragma unroll
      for (int v = 0; v < kVectorsPerWord; ++v) {
        const float4 xv = xs[v];
        const float xj[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int shift = kBits * (4 * v + j);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float code = __uint_as_float(0x4B000000u | ((words[r] >> shift) & kMask)) - bias[r];
            acc[r] = fmaf(code, xj[j], acc[r]);
          }
        }
      }
    }
  }
  if (group >= 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) total[r] += params.scale[r] * acc[r];
  }
  // Sum the 4 warps' slices of each row (in warp order), then finish as the tensor-core kernel does.
  __shared__ float4 warp_sums[4][32];
  warp_sums[warp][lane] = make_float4(total[0], total[1], total[2], total[3]);
  __syncthreads();
  float4 sums = warp_sums[0][lane];
  for (int k = 1; k < 4; ++k) {
    const float4 o = warp_sums[k][lane];
    sums = make_float4(sums.x + o.x, sums.y + o.y, sums.z + o.z, sums.w + o.w);
  }
  finish_rows(a, m, static_cast<int>(blockIdx.x), block_row0, row, sums, row_ok && warp == 0);
}

// Dynamic shared memory up to which no kernel needs the opt-in: 48 KB less the RMSNorm kernels' static 16.5 KB
// (16,928 bytes: the x cache and the warp sums). At 32 KB, a slice of exactly 32 KB of x and norm weights (an
// 8-bit LM head of 8,192 inputs with bf16 norm weights, one split: a Llama-3.1-70B shape) did not get the opt-in and
// failed to launch, as session 28's first tail build did at exactly 32 KB.
constexpr size_t kSharedWithoutOptIn = 31 * 1024;

template <auto Kernel>
cudaError_t launch_built(dim3 grid, size_t shared, cudaStream_t stream, bool overlap, const GemvArgs& args) {
  if (shared > kSharedWithoutOptIn) {  // a batch's staged x (plan_gemv_gptq_batch bounds it), or x and norm weights
    const cudaError_t e = raise_shared_limit_once<Kernel>(static_cast<int>(GemvPlan::kMaxBatchSharedBytes));
    if (e != cudaSuccess) return e;
  }
  if (args.cluster_reduce) {
    return launch_kernel_in_clusters(Kernel, grid, dim3(kThreads), dim3(1, grid.y, 1), shared, stream, overlap, args);
  }
  return launch_kernel(Kernel, grid, dim3(kThreads), shared, stream, overlap, args);
}

// Launches build kBuild of the kernel (the uniform-zeros and late builds as gemv_gptq_tensor_core_capped), or its
// diagnostic twin (timeline.h) while a timeline is installed.
template <int kBits, GemvInput kInput, int kTiles, unsigned kBuild = 0>
cudaError_t launch_build(dim3 grid, size_t shared, cudaStream_t stream, bool overlap, const GemvArgs& args) {
  if constexpr (kTiles == 0 && (kBuild & (kBuildUniformZeros | kBuildLate)) != 0) {
    if (args.timeline.records) {
      return launch_built<gemv_gptq_tensor_core_capped<kBits, kInput, true, kBuild>>(grid, shared, stream, overlap, args);
    }
    return launch_built<gemv_gptq_tensor_core_capped<kBits, kInput, false, kBuild>>(grid, shared, stream, overlap, args);
  } else {
    if constexpr (kTiles == 0) {
      if (args.timeline.records) {
        return launch_built<gemv_gptq_tensor_core<kBits, kInput, 0, true, kBuild>>(grid, shared, stream, overlap, args);
      }
    }
    return launch_built<gemv_gptq_tensor_core<kBits, kInput, kTiles, false, kBuild>>(grid, shared, stream, overlap, args);
  }
}

// The build for a launch (the 4-bit vector kernels; the others have one). kBuildUniformZeros | kBuildDeep where
// the slices span groups and every part's zeros are one value (GemvOptions::uniform_zeros). kBuildDeep for the RMSNorm products
// (the token generator's q/k/v and gate/up) whose slices lie in one group (per channel): 8B on an H200 (session
// 16, docs/PERFORMANCE.md), tg128 per channel 584.2 -> 591.2 tok/s (medians of 4); at group 128 the same build
// lost ~1% (not understood: it lost also with a probe that took the scales' and zeros' latency out; with the
// zeros decoded once, kBuildUniformZeros, three batches gain there: session 35), and three
// batches for the SiLU*up product (down) too gained less (+0.7%). GemvOptions::deep_batches off (args.shallow)
// keeps two: on H100s +0.3 to +1.0% per channel (sessions 33-34, 10 pairs), on an H200 -1.5% (session 34).
template <int kBits, GemvInput kInput, int kTiles>
cudaError_t launch_one(dim3 grid, size_t shared, cudaStream_t stream, bool overlap, const GemvArgs& args) {
  if constexpr (kTiles == 0 && kBits == 4) {
    const bool one_group = args.group_steps >= args.steps_per_split;  // groups at least a slice long: per channel
    if constexpr (kInput == GemvInput::kRmsNorm) {
      const bool deep = one_group && !args.shallow;
      if (args.late_batches > 0 && one_group) {
        return deep ? launch_build<kBits, kInput, 0, kBuildDeep | kBuildLate>(grid, shared, stream, overlap, args)
                    : launch_build<kBits, kInput, 0, kBuildLate>(grid, shared, stream, overlap, args);
      }
      if (deep) return launch_build<kBits, kInput, 0, kBuildDeep>(grid, shared, stream, overlap, args);
    }
    if (!one_group && args.uniform_zeros) {
      return launch_build<kBits, kInput, 0, kBuildUniformZeros | kBuildDeep>(grid, shared, stream, overlap, args);
    }
  }
  return launch_build<kBits, kInput, kTiles>(grid, shared, stream, overlap, args);
}

template <int kBits, int kTiles>
cudaError_t launch_tensor_core(GemvInput input, dim3 grid, size_t shared, cudaStream_t stream, bool overlap,
                               const GemvArgs& args) {
  if constexpr (kTiles > 0) {  // batch kernels: 4-bit, plain or SiLU*up input (gemv_gptq_batch checks)
    if (input == GemvInput::kSiluMul) return launch_one<4, GemvInput::kSiluMul, kTiles>(grid, shared, stream, overlap, args);
    return launch_one<4, GemvInput::kPlain, kTiles>(grid, shared, stream, overlap, args);
  } else {
    switch (input) {
      case GemvInput::kRmsNorm:
        return launch_one<kBits, GemvInput::kRmsNorm, 0>(grid, shared, stream, overlap, args);
      case GemvInput::kSiluMul:
        return launch_one<kBits, GemvInput::kSiluMul, 0>(grid, shared, stream, overlap, args);
      case GemvInput::kPlain:
        break;
    }
    return launch_one<kBits, GemvInput::kPlain, 0>(grid, shared, stream, overlap, args);
  }
}

// Whether the current device can launch thread-block clusters (compute capability 9.0 and later).
bool device_has_clusters() {
  int device = 0, supported = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  return cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device) == cudaSuccess && supported != 0;
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// tokens: 0 for the vector kernels, 1 to kMaxGemvTokens for the batch kernels (plan from plan_gemv_gptq_batch).
Status launch_gemv(std::span<const GemvGroupMember> members, const GemvPlan& plan, const float* x, int64_t tokens,
                   GemvWorkspace& workspace, Stream stream, const GemvOptions& options, const GemvFusion& fusion) {
  const DeviceGptqMatrix& first = *members[0].w;
  const std::string what = "gemv_gptq (" + std::to_string(first.bits) + "-bit, " + std::to_string(members.size()) +
                           (members.size() == 1 ? " matrix [" : " matrices, the first [") + std::to_string(first.rows) +
                           ", " + std::to_string(first.cols) + "])";
  if (!x) return invalid_argument(what + ": null input");
  if (address(x) % 16 != 0) return invalid_argument(what + ": x must be 16-byte aligned");
  for (const GemvGroupMember& member : members) {
    const DeviceGptqMatrix& w = *member.w;
    if (!w.qweight || !w.scales || !w.qzeros || !member.y) return invalid_argument(what + ": null device pointer");
    if ((address(w.qweight) | address(member.y)) % 16 != 0 || address(w.scales) % 8 != 0) {
      return invalid_argument(what + ": qweight, x and y must be 16-byte aligned and scales 8-byte aligned");
    }
  }
  const bool tensor_core = options.algorithm == GemvAlgorithm::kTensorCore;
  const bool fused = fusion.input != GemvInput::kPlain || fusion.residual;
  if (!tensor_core && (fused || members.size() > 1)) {
    return unsupported(what + ": fused inputs, residuals and grouped matrices need the tensor-core kernel");
  }
  if (fusion.residual && members.size() > 1) return invalid_argument(what + ": a residual needs a single matrix");
  if (fusion.residual && address(fusion.residual) % 16 != 0) return invalid_argument(what + ": residual must be 16-byte aligned");
  WeightType norm_type = WeightType::kF32;
  if (fusion.input == GemvInput::kRmsNorm) {
    PETREL_ASSIGN_OR_RETURN(norm_type, weight_type(fusion.norm_weight.dtype, "gemv_gptq RMSNorm weight"));
    if (address(fusion.norm_weight.data) % 16 != 0) return invalid_argument(what + ": the RMSNorm weight must be 16-byte aligned");
    if (!fusion.norm_weight.data || fusion.norm_weight.size != first.cols) {
      return invalid_argument(what + ": the RMSNorm weight must have cols (" + std::to_string(first.cols) +
                              ") elements, it has " + std::to_string(fusion.norm_weight.size));
    }
  }
  for (const GemvFusion::Clear& c : fusion.clear) {
    if (!c.data) continue;
    if (address(c.data) % 16 != 0 || c.count % 4 != 0 || c.count < 0) {
      return invalid_argument(what + ": a buffer to clear must be 16-byte aligned and a multiple of 4 floats");
    }
    if (!tensor_core) return unsupported(what + ": clearing a buffer needs the tensor-core kernel");
  }
  if (options.atomic_reduce && fusion.residual && fusion.residual != members[0].y) {
    return invalid_argument(what + ": atomic split-K adds into y: the residual must be y itself (in place)");
  }
  if (fusion.input == GemvInput::kSiluMul && (!fusion.up || address(fusion.up) % 16 != 0)) {
    return invalid_argument(what + ": SiLU*up needs a 16-byte aligned up vector");
  }
  if (plan.k_splits > 1 && plan.row_tiles_total > workspace.counter_capacity()) {
    return out_of_range("gemv_gptq: " + std::to_string(plan.row_tiles_total) + " row blocks exceed the workspace's " +
                        std::to_string(workspace.counter_capacity()) + " counters");
  }
  GemvArgs args{};
  int block = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const DeviceGptqMatrix& w = *members[i].w;
    args.parts[i] = GemvPart{w.qweight, w.scales, w.qzeros, members[i].y, w.rows, w.zero_offset, block, w.uniform_zero};
    block += static_cast<int>((w.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  }
  args.n_parts = static_cast<int>(members.size());
  args.x = x;
  args.up = fusion.up;
  args.norm_weight = fusion.norm_weight.data;
  args.norm_type = norm_type;
  args.norm_eps = fusion.norm_eps;
  args.residual = fusion.residual;
  args.partials = workspace.partials();
  args.counters = workspace.counters();
  args.cols = first.cols;
  args.words = first.cols / (32 / first.bits);
  args.group_words = first.group_size / (32 / first.bits);
  args.group_steps = static_cast<int>(first.group_size == first.cols ? int64_t{1} << 30
                                                                     : first.group_size / (32 / first.bits) / kWordsPerStep);
  args.k_splits = plan.k_splits;
  args.steps_per_split = static_cast<int>(plan.steps_per_split);
  args.l2_prefetch_steps = options.l2_prefetch_steps > 0 ? options.l2_prefetch_steps : 0;
  args.cluster_reduce = tensor_core && options.cluster_reduce && plan.k_splits > 1 &&
                        plan.k_splits <= kMaxClusterSplits && device_has_clusters();
  args.tokens = tokens > 0 ? tokens : 1;
  args.row_tiles = static_cast<int>(plan.row_tiles);
  args.total_tiles = static_cast<int>(plan.row_tiles_total);
  args.x_stride_bytes = static_cast<int>(plan.x_stride_bytes);
  if (tokens > 0) args.cluster_reduce = 0;
  args.atomic_reduce = tensor_core && tokens == 0 && options.atomic_reduce && !args.cluster_reduce && plan.k_splits > 1;
  args.shallow = !options.deep_batches;
  args.late_batches = tokens == 0 && options.late_batches > 0 ? options.late_batches : 0;
  args.uniform_zeros = tokens == 0 && options.uniform_zeros;
  for (const GemvGroupMember& member : members) {
    if (member.w->uniform_zero < 0) args.uniform_zeros = 0;
  }
  for (int c = 0; c < 2; ++c) {
    args.clear[c] = tokens == 0 ? fusion.clear[c].data : nullptr;
    args.clear_vectors[c] = tokens == 0 && fusion.clear[c].data ? fusion.clear[c].count / 4 : 0;
  }
  if (const TimelineRing* ring = active_timeline(); ring && tokens == 0) args.timeline = *ring;
  const dim3 grid(static_cast<unsigned>(plan.row_blocks), static_cast<unsigned>(plan.k_splits));
  // The vector kernels' shared memory: the staged x, then the RMSNorm weights (gemv_shared_layout).
  const size_t shared = static_cast<size_t>(
      tokens > 0 || !tensor_core
          ? plan.shared_bytes
          : gemv_shared_layout(first.bits, plan.steps_per_split,
                               fusion.input == GemvInput::kRmsNorm ? weight_type_bytes(norm_type) : 0).total);
  if (shared > static_cast<size_t>(GemvPlan::kMaxBatchSharedBytes)) {
    return unsupported(what + ": a slice of " + std::to_string(plan.steps_per_split) + " steps with its RMSNorm weights needs " +
                       std::to_string(shared) + " bytes of shared memory, more than " +
                       std::to_string(GemvPlan::kMaxBatchSharedBytes) + " (more input splits: GemvOptions::k_splits)");
  }
  cudaError_t error = cudaSuccess;
  if (tensor_core) {
    const bool overlap = options.overlap_previous;
    if (tokens > 0) {
      switch ((tokens + 7) / 8) {
        case 1: error = launch_tensor_core<4, 1>(fusion.input, grid, shared, stream, overlap, args); break;
        case 2: error = launch_tensor_core<4, 2>(fusion.input, grid, shared, stream, overlap, args); break;
        case 3: error = launch_tensor_core<4, 3>(fusion.input, grid, shared, stream, overlap, args); break;
        default: error = launch_tensor_core<4, 4>(fusion.input, grid, shared, stream, overlap, args); break;
      }
    } else {
      error = first.bits == 4 ? launch_tensor_core<4, 0>(fusion.input, grid, shared, stream, overlap, args)
                              : launch_tensor_core<8, 0>(fusion.input, grid, shared, stream, overlap, args);
    }
  } else {
    // The baseline never waits for a previous kernel, so it is never launched to overlap one.
    if (first.bits == 4) gemv_gptq_cuda_core<4><<<grid, kThreads, shared, stream>>>(args);
    else gemv_gptq_cuda_core<8><<<grid, kThreads, shared, stream>>>(args);
    error = cudaGetLastError();
  }
  return cuda_status(error, what + " launch");
}

}  // namespace

Status gemv_gptq(const DeviceGptqMatrix& w, const float* x, float* y, GemvWorkspace& workspace, Stream stream,
                 const GemvOptions& options, const GemvFusion& fusion) {
  PETREL_ASSIGN_OR_RETURN(GemvPlan plan,
                          plan_gemv_gptq(w, workspace.multiprocessors(), workspace.partial_capacity(), options));
  const GemvGroupMember member{&w, y};
  return launch_gemv(std::span<const GemvGroupMember>(&member, 1), plan, x, 0, workspace, stream, options, fusion);
}

Status gemv_gptq_grouped(std::span<const GemvGroupMember> members, const float* x, GemvWorkspace& workspace,
                         Stream stream, const GemvOptions& options, const GemvFusion& fusion) {
  PETREL_ASSIGN_OR_RETURN(GemvPlan plan, plan_gemv_gptq_grouped(members, workspace.multiprocessors(),
                                                                 workspace.partial_capacity(), options));
  return launch_gemv(members, plan, x, 0, workspace, stream, options, fusion);
}

Status gemv_gptq_batch(std::span<const GemvGroupMember> members, const float* x, int64_t tokens,
                       GemvWorkspace& workspace, Stream stream, const GemvOptions& options, const GemvFusion& fusion) {
  PETREL_ASSIGN_OR_RETURN(GemvPlan plan, plan_gemv_gptq_batch(members, tokens, workspace.multiprocessors(),
                                                               workspace.partial_capacity(), options));
  if (fusion.input == GemvInput::kRmsNorm) {
    return unsupported("gemv_gptq_batch: RMSNorm is not fused into the batch kernels (norm.h's rms_norm first)");
  }
  if (fusion.residual && members.size() > 1) return invalid_argument("gemv_gptq_batch: a residual needs a single matrix");
  return launch_gemv(members, plan, x, tokens, workspace, stream, options, fusion);
}

}  // namespace petrel::cuda
