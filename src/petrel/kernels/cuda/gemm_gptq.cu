// kernels/cuda: the W4A16 (and W8A16 LM head) matrix-matrix product Y = X dequant(W)^T of the prompt
// processor, reading GPTQ tensors in place. Host-side checks and launch plans are in gemm.cc.
//
// Layout: ref::GptqMatrix's (kernels/ref/ops.h), as gemv_gptq.cu describes it: qweight int32
// [cols * bits / 32, rows] (codes packed along the input), scales fp16 [n_groups, rows], qzeros int32
// [n_groups, rows * bits / 32] (packed along the output); weight (r, c) = scale * (code - (stored zero +
// zero_offset)). Preconditions (gemm_gptq_supports): gemv_gptq's, and rows % 8 == 0 at 4 bits.
//
// Floors (Llama-3.1-8B). A layer's 7 linears (q, o 4096x4096; k, v 1024x4096; gate, up 14336x4096; down
// 4096x14336) hold 218M weights: 109 MB at 4 bits per channel (113 MB at group 128), ~30 us of reading at the
// ~3.6 TB/s a read kernel reaches on the H200. A product of m tokens is 2 * 218e6 * m FLOP per layer: at
// m = 512, 223 GFLOP (7.1 TFLOP for 32 layers); the H200's dense fp16/bf16 ceiling measured through cuBLAS on
// large square products is ~790 TFLOP/s (0.28 ms per layer; this bench: 749 TFLOP/s at 8192^3, 641 at
// 4096x4096 x 512 tokens), and mma.sync, which the fused kernel uses, reaches less than Hopper's wgmma. The
// prompt processor's target is >= 20,000 tok/s for 512 tokens, i.e. the 7 linears of a layer in <= ~0.7 ms
// at m = 512 (>= ~330 TFLOP/s including dequantization), and m = 29 (a chat turn: time to first token) close
// to the weight-read time. Reading the weights (30 us) and multiplying at ~600 TFLOP/s (2 * 218e6 * m FLOP)
// take equal time at m ~ 40.
//
// Two algorithms (GemmAlgorithm):
//
// kDequantCublas. W is dequantized to fp16 [slice_rows, cols] in the workspace (a slice of rows at a time
// when it does not fit; Llama-3.1-8B's largest linear, 14336x4096, is 117 MB and fits the default 256 MB
// with x), x is converted to fp16 once, and cublasGemmEx (fp16 in, float32 out, float32 compute) multiplies
// them. Extra traffic: the fp16 W written and read back (4x the 4-bit weights), ~4.5 bytes per weight per
// call, which is what the fused kernel saves at small m; at large m cuBLAS's wgmma kernels are the faster
// multiplier. The dequantization kernel transposes 32-word x 64-row tiles through shared memory so that both
// its loads and its stores are contiguous: 14336x4096 in ~55 us (2.6 TB/s of 146 MB moved); the first version
// (one thread per row, 32-byte stores 8 KB apart) took 330 us.
//
// kTensorCore (the fused kernel) generalizes gemv_gptq's tensor-core kernel from one vector to tiles of
// tokens. mma.sync.m16n8k16 takes the dequantized weights as the A operand (16 output rows x 16 inputs) and
// x as B (16 inputs x 8 tokens): each thread's A registers are exactly what the 0x6400 magic-number
// dequantization of its 16 bytes of weights yields (fragment mapping: gemv_gptq.cu), and B's 8 columns are
// now 8 real tokens. A warp owns 32 output rows; a step is 4 packed words (32 inputs at 4 bits) of those rows,
// 16 bytes per thread, dequantized once and multiplied with every 8-token n-tile of the block's token tile
// (8, 16, 32 or 64 tokens): 4 mma per n-tile and step at 4 bits, 2 at 8 bits.
// - x is staged once per call by a small kernel into the workspace as fp16 in fragment order ({x0,x4},
//   {x1,x5},{x2,x6},{x3,x7} per 4-bit word, {x0,x2},{x1,x3} per 8-bit word), rows padded with zeros to whole
//   chunks, so that a thread's B registers for one n-tile and step are one 16-byte shared-memory load.
//   gemm_gptq_group stages once for several products of the same x (q/k/v, gate and up) and applies the prompt
//   processor's element-wise step on the way: RMSNorm with its residual add (one block per token, rms_row.cuh's
//   pass shared with norm.cu, so the staged values are rms_norm's bit for bit) or SiLU(gate) * up; and it runs
//   the members as ONE product launch (FusedArgs::parts: each row block finds its matrix) planned as one matrix
//   of all their rows, which at small m gives the grid enough blocks without splitting K as finely. A layer of
//   a 29-token chunk: 4 launches for the linears' inputs and products of q/k/v and the MLP instead of 10, and
//   5.37 -> 4.83 ms for the 8B prompt (docs/PERFORMANCE.md, session 7; the one launch is what paid, not the
//   fewer element-wise launches, which measured the same alone).
// - The block streams chunks of 8 steps (x of its tokens and the packed words of its rows) through shared
//   memory with cp.async, 2 or 3 chunks in flight (GemmPlan::stages); rows of both are padded so that the
//   lanes of one shared-memory phase hit distinct banks (GemmPlan::token_stride_bytes, weight_stride_bytes).
//   Tokens past m read a copy of the last token (finite values in columns that are never written).
//   The first version loaded weights straight into registers (two batches of 4 steps in flight, as in the
//   GEMV); prefetching them a chunk or two ahead through shared memory instead changed little (gate/up on a
//   stream, per channel: m = 32 32.5 -> 37.1 us, m = 512 270 -> 262 us).
// - With overlap (programmatic dependent launch) a block requests its first chunks' weights before it waits for
//   the previous kernel (the x staging), and their x after: the weights' DRAM latency then overlaps the
//   staging kernel's run. The 29-token 8B prompt: 4.81 -> 4.62 ms per channel (H200, 2026-12-03).
// - Blocks sharing the same rows (the token tiles, blockIdx.x) are launched next to each other, so the
//   weights' second and later reads come from L2.
// - Per-channel matrices keep the weights exact ((code - zero) in fp16) and apply the float32 scale to the
//   sums at the end; grouped matrices fold the scale into the fp16 weights (one mul.f16x2 per pair), which
//   rounds them as kDequantCublas does and needs no per-group float32 accumulators (with 64 tokens those
//   would double the kernel's 64 accumulator registers).
// - Split-K (blockIdx.z) when rows x token tiles give too few blocks for the SMs (small m): partial sums in
//   the workspace, the last block of a tile to arrive adds the slices in a fixed order (deterministic), as in
//   gemv_gptq.
//
// Measured on an H200 (bench/README.md, petrel_bench_gemm_cuda --sweep; GPU time from CUDA graph replay; the
// tile, warps, stages and splits the planner now picks are the fastest or within ~10% of the fastest of the
// sweep). The fused kernel runs at ~100 TFLOP/s at m = 32 and ~230-265 TFLOP/s at m = 512 (64-token tiles),
// against cuBLAS's ~600 on fp16 weights: it is bound by instruction issue and latency (dequantization, one
// shared-memory load per 4 mma, 8-16 warps an SM), not by bytes (at m = 8 it already reads gate/up at only
// 1.2 TB/s). Layer of 7 linears, per channel (group 128 ~5-10% slower):
//   m = 29: fused ~149 us (q/o 16.3, k/v 11.7, gate/up 30.0, down 32.5), 5x the weight-read floor;
//           dequant + cuBLAS 354 us; cuBLAS alone on fp16 weights 146 us.
//   m = 128: fused for q/o, gate/up, down and dequant + cuBLAS for k/v ~294 us (13,600 tok/s over 32 layers).
//   m = 512: dequant + cuBLAS 588 us (27,200 tok/s over 32 layers; 380 TFLOP/s), fused 944 us.
// Hence kAuto (auto_gemm_algorithm): the fused kernel up to m = 160 (m = 48 for matrices under 16M weights),
// dequant + cuBLAS beyond.
//
// Known losses, not yet fixed: tokens past m are staged as copies of the last token, so a partial tile has
// every block read that one row over and over (an L2 hot spot): gate/up at m = 1 takes 30 us against 24 us at
// m = 8. Zero-filling those rows (cp.async with a source size of 0) should remove it. A fused kernel that
// competes with cuBLAS at large m needs wgmma with the dequantized weights staged in shared memory.

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/blas_check.h"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/async_copy.cuh"
#include "petrel/kernels/cuda/gemm.h"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/rms_row.cuh"

namespace petrel::cuda {

namespace {

using namespace ptx;  // gptq_ptx.cuh: fp16x2 arithmetic, mma, dequantization

constexpr int kWordsPerStep = GemmPlan::kWordsPerStep;
constexpr int kChunkSteps = GemmPlan::kChunkSteps;
// GemmPlan's geometry as compile-time constants for device code.
template <int kBits>
constexpr int kFragmentBytes = GemmPlan::fragment_bytes(kBits);
template <int kBits>
constexpr int kTokenStrideBytes = GemmPlan::token_stride_bytes(kBits);
template <int kWarps>
constexpr int kWeightStrideBytes = GemmPlan::weight_stride_bytes(kWarps);
template <int kBits, int kTiles, int kWarps>
constexpr int kStageBytesOf = GemmPlan::stage_bytes(kBits, 8 * kTiles, kWarps);

// ---- PTX helpers beyond gptq_ptx.cuh's (shared with gemv_gptq.cu).

__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// ---- Staging x for the fused kernel.

// out[t, w] = the fp16 fragment of packed word w of token t (zero for w >= words), [m, words_padded]; of
// ref::silu_mul(x, up) instead of x when up is not null (elementwise.cu's numerics).
template <int kBits>
__global__ void __launch_bounds__(256) stage_x_fragments(const float* x, const float* up, int64_t m, int64_t cols,
                                                         int64_t words, int64_t words_padded, void* out) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  const int64_t total = m * words_padded;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const float4* up4 = reinterpret_cast<const float4*>(up);
  // Four inputs, SiLU(x) * up applied when there is an up; activations of the previous kernel, read through L2.
  auto load4 = [&](int64_t i) {
    const float4 v = __ldcg(x4 + i);
    if (!up) return v;
    return silu_mul4(v, __ldcg(up4 + i));
  };
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / words_padded, w = i % words_padded;
    if constexpr (kBits == 4) {
      uint4 frag = make_uint4(0, 0, 0, 0);
      if (w < words) {
        const float4 lo = load4(t * cols / 4 + 2 * w), hi = load4(t * cols / 4 + 2 * w + 1);
        frag = make_uint4(pack_half2(lo.x, hi.x), pack_half2(lo.y, hi.y), pack_half2(lo.z, hi.z), pack_half2(lo.w, hi.w));
      }
      static_cast<uint4*>(out)[i] = frag;
    } else {
      uint2 frag = make_uint2(0, 0);
      if (w < words) {
        const float4 v = load4(t * cols / 4 + w);
        frag = make_uint2(pack_half2(v.x, v.z), pack_half2(v.y, v.w));
      }
      static_cast<uint2*>(out)[i] = frag;
    }
  }
}

// The same fragments of cuda::rms_norm's output (x += residual first when residual is not null, into
// residual_sum), one block per token with rms_norm's block size and rms_row.cuh's first pass, so the values
// are rms_norm's bit for bit. Each thread writes its elements' halves where the fragment order puts them:
// input p of a word (8 at 4 bits, 4 at 8) is half (p % h) * 2 + p / h of its fragment, h = inputs / 2.
template <int kBits>
__global__ void __launch_bounds__(kRmsRowMaxThreads)
    stage_x_fragments_rms_norm(const float* x, const float* residual, float* residual_sum, int64_t cols,
                               const void* weight, WeightType weight_type, float eps, int64_t words_padded, void* out) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  constexpr int kInputs = 32 / kBits, kHalf = kInputs / 2;
  const int64_t t = blockIdx.x;
  const float* xr = x + t * cols;
  const float* rr = residual ? residual + t * cols : nullptr;
  float* sr = residual ? residual_sum + t * cols : nullptr;
  __half* row_out = static_cast<__half*>(out) + t * words_padded * kInputs;
  auto put = [&](int64_t i, float value) {
    const int p = static_cast<int>(i % kInputs);
    row_out[i - p + (p % kHalf) * 2 + p / kHalf] = __float2half_rn(value);
  };
  float v[kRmsRowRegs], w[kRmsRowRegs];
  const bool vectorized = rms_row_vectorized(xr, rr, sr, cols, weight) && aligned16(row_out);
  const float inv_rms = rms_row_first_pass(xr, rr, sr, cols, weight, weight_type, eps, vectorized, v, w);
  const int64_t i0 = rms_row_first(threadIdx.x);
  if (vectorized) {  // 8 consecutive inputs: one 4-bit word's fragment, or two 8-bit words'; one 16-byte store
    if (i0 < cols) {
      uint32_t h[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        // Halves 2k, 2k + 1 of the 8: inputs (k, k + 4) of a 4-bit word; at 8 bits word k / 2's inputs
        // (k % 2, k % 2 + 2) shifted by 4 (k / 2).
        const int lo = kBits == 4 ? k : 4 * (k / 2) + k % 2, hi = lo + (kBits == 4 ? 4 : 2);
        h[k] = pack_half2(w[lo] * (v[lo] * inv_rms), w[hi] * (v[hi] * inv_rms));
      }
      *reinterpret_cast<uint4*>(row_out + i0) = make_uint4(h[0], h[1], h[2], h[3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kRmsRowRegs; ++j) {
      if (i0 + j < cols) put(i0 + j, w[j] * (v[j] * inv_rms));
    }
  }
  for (int64_t i = threadIdx.x + int64_t{kRmsRowRegs} * blockDim.x; i < cols; i += blockDim.x) {
    put(i, rms_row_tail_value(xr, rr, sr, i, weight, weight_type, inv_rms));
  }
  for (int64_t i = cols + threadIdx.x; i < words_padded * kInputs; i += blockDim.x) row_out[i] = __float2half_rn(0.0f);
}

// ---- The fused kernel.

// One matrix of a launch and where its product goes.
struct FusedPart {
  const int32_t* qweight;
  const uint16_t* scales;
  const int32_t* qzeros;
  float* y;         // [m, rows]
  float* partials;  // [k_splits, m, rows] when k_splits > 1
  int64_t rows;
  int zero_offset;
};

constexpr int kMaxFusedParts = kMaxGemvGroupMembers;

struct FusedArgs {
  // Row block (blockIdx.y) b computes the last part i < n_parts with first_row_block[i] <= b (gemm_gptq_group's
  // one launch for several matrices of one input: q/k/v, gate/up; first_row_block[0] is 0).
  FusedPart parts[kMaxFusedParts];
  int first_row_block[kMaxFusedParts];
  int n_parts;
  const uint8_t* x_staged;  // [m, words_padded] fragments
  uint32_t* counters;       // [row blocks * token tiles], zero between launches
  int64_t m;                // tokens of this launch
  int64_t words;         // packed words along the input
  int64_t words_padded;  // x_staged's row length, whole chunks
  int64_t group_steps;   // steps per group (grouped matrices only)
  int k_splits;
  int steps_per_split;
  int total_steps;
};

// Grid (token tiles, row blocks, k_splits); block kWarps warps; kTiles n-tiles of 8 tokens; kStages chunks of
// x and weights in flight through shared memory.
template <int kBits, int kTiles, int kWarps, int kStages, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32) gemm_gptq_tensor_core(const FusedArgs a) {
  allow_dependent_launch();  // the weights' first chunks go out before the wait below (programmatic_launch.cuh)
  constexpr int kThreads = kWarps * 32;
  constexpr int kTokens = 8 * kTiles;
  constexpr int kRows = 32 * kWarps;
  constexpr int kFragment = kFragmentBytes<kBits>;
  constexpr int kTokenStride = kTokenStrideBytes<kBits>;
  constexpr int kChunkWords = kChunkSteps * kWordsPerStep;
  constexpr int kXPieces = kChunkWords * kFragment / 16;  // 16-byte copies per token and chunk
  constexpr int kWordStride = kWeightStrideBytes<kWarps>;  // between two packed words' rows in a stage
  constexpr int kWPieces = kRows / 4;                      // 16-byte copies per packed word and chunk
  constexpr int kXBytes = kTokens * kTokenStride;
  constexpr int kStageBytes = kStageBytesOf<kBits, kTiles, kWarps>;
  extern __shared__ uint4 shared_stages[];
  uint8_t* stages = reinterpret_cast<uint8_t*>(shared_stages);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int64_t token0 = int64_t{blockIdx.x} * kTokens;
  FusedPart p = a.parts[0];  // selected with constant indices: no local-memory copy of the parameters
  int part_block = 0;
#pragma unroll
  for (int i = 1; i < kMaxFusedParts; ++i) {
    if (i < a.n_parts && static_cast<int>(blockIdx.y) >= a.first_row_block[i]) {
      p = a.parts[i];
      part_block = a.first_row_block[i];
    }
  }
  const int64_t row_base = int64_t{static_cast<int>(blockIdx.y) - part_block} * kRows;
  const int64_t row = row_base + warp * 32 + 4 * quad_row;  // this thread's 4 rows
  const bool row_ok = row < p.rows;
  const int first_step = static_cast<int>(blockIdx.z) * a.steps_per_split;
  const int n_steps = min(a.steps_per_split, a.total_steps - first_step);
  const int n_chunks = (n_steps + kChunkSteps - 1) / kChunkSteps;
  const int64_t first_word = int64_t{first_step} * kWordsPerStep;

  // Chunk c (x of the block's tokens, and packed words first_word + 32 c .. + 31 of its rows) into stage
  // c % kStages. Weights past the matrix's words or rows are zero-filled: they meet zeros of x (the staged x
  // is zero past the last word) or land in rows that are not written.
  auto stage_weights = [&](int chunk) {
    if (chunk >= n_chunks) return;
    uint8_t* dst = stages + (chunk % kStages) * kStageBytes;
    const int64_t word0 = first_word + int64_t{chunk} * kChunkWords;
#pragma unroll
    for (int k = 0; k < kChunkWords * kWPieces / kThreads; ++k) {
      const int i = threadIdx.x + k * kThreads;
      const int word = i / kWPieces, piece = i % kWPieces;
      const int64_t r = row_base + 4 * piece;
      const bool inside = word0 + word < a.words && r < p.rows;
      cp_async16_zero_fill(dst + kXBytes + word * kWordStride + piece * 16,
                           inside ? p.qweight + (word0 + word) * p.rows + r : p.qweight, inside);
    }
  };
  auto stage_x = [&](int chunk) {
    if (chunk >= n_chunks) return;
    uint8_t* dst = stages + (chunk % kStages) * kStageBytes;
    const uint8_t* src = a.x_staged + (first_word + int64_t{chunk} * kChunkWords) * kFragment;
    for (int i = threadIdx.x; i < kTokens * kXPieces; i += kThreads) {
      const int t = i / kXPieces, piece = i % kXPieces;
      const int64_t token = min(token0 + t, a.m - 1);  // tokens past m: a copy of the last (columns not written)
      cp_async16(dst + t * kTokenStride + piece * 16, src + token * a.words_padded * kFragment + piece * 16);
    }
  };
  auto stage_chunk = [&](int chunk) {
    stage_weights(chunk);
    stage_x(chunk);
    cp_async_commit();  // an empty group past the last chunk keeps the wait counts uniform
  };
  // The first chunks' weights depend on no kernel: they are requested before the wait for the previous kernel
  // (the x staging, whose own latency they overlap when launched with overlap), their x after it. The first
  // commit group then holds the weights of chunks 0 .. kStages - 2 and the x of chunk 0, group c the x of chunk
  // c: waiting for group c still covers all of chunk c.
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) stage_weights(c);

  // Scales and zeros. Grouped: this group's and the next group's, loaded while this one is computed; the
  // pointers step one group (a row of scales, a row of zeros) at a time.
  const int64_t group = kGrouped ? first_step / a.group_steps : 0;
  int steps_to_group = kGrouped ? static_cast<int>(a.group_steps - first_step % a.group_steps) : 0;
  const int64_t zeros_stride = p.rows * kBits / 32;  // int32 words of zeros per group
  const uint16_t* scales_at = p.scales + group * p.rows + row;
  const int32_t* zeros_at = p.qzeros + group * zeros_stride + row * kBits / 32;
  uint2 raw_scales, next_scales = make_uint2(0, 0);
  uint32_t raw_zeros, next_zeros = 0;
  load_raw_params(scales_at, zeros_at, row_ok, raw_scales, raw_zeros);
  if constexpr (kGrouped) {
    scales_at += p.rows;
    zeros_at += zeros_stride;
    load_raw_params(scales_at, zeros_at, row_ok && steps_to_group < n_steps, next_scales, next_zeros);
  }
  wait_for_previous_kernel();  // x_staged (and, with split-K, the partials and counters) from here on
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    stage_x(c);
    cp_async_commit();
  }
  uint32_t bias_low[4], bias_high[4], scale_pair[4];
  const int zero_shift = kBits == 4 ? 4 * static_cast<int>(row % 8) : 0;  // 4-bit zeros pack 8 rows a word
  const ZeroBiasBases bases = zero_bias_bases(p.zero_offset);
  auto decode_params = [&] {
    zero_biases<kBits>(raw_zeros >> zero_shift, bases, bias_low, bias_high);
    const uint32_t packed[2] = {raw_scales.x, raw_scales.y};
#pragma unroll
    for (int r = 0; r < 4; ++r) scale_pair[r] = broadcast_half(packed[r / 2], r % 2);  // {scale} x2
  };
  decode_params();

  float acc[kTiles][2][4];  // [n-tile][rows (row, row + 1) or (row + 2, row + 3)][mma D registers]
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][0][i] = acc[nt][1][i] = 0.0f;
  }

  // Step s of the split, step j of its chunk (in `stage`).
  auto compute_step = [&](int s, int j, const uint8_t* stage) {
    if constexpr (kGrouped) {
      if (s > 0 && steps_to_group == 0) {  // uniform: a new group (steps never straddle groups)
        raw_scales = next_scales;
        raw_zeros = next_zeros;
        decode_params();
        steps_to_group = static_cast<int>(a.group_steps);
        scales_at += p.rows;
        zeros_at += zeros_stride;
        load_raw_params(scales_at, zeros_at, row_ok && s + steps_to_group < n_steps, next_scales, next_zeros);
      }
      --steps_to_group;
    }
    // Weights: word 4 j + quad_col of rows row .. row + 3. B registers of n-tile nt: token nt * 8 + quad_row,
    // the same word.
    const uint4 w = *reinterpret_cast<const uint4*>(stage + kXBytes + (j * kWordsPerStep + quad_col) * kWordStride +
                                                    (warp * 32 + 4 * quad_row) * 4);
    const uint8_t* xs = stage + quad_row * kTokenStride + (j * kWordsPerStep + quad_col) * kFragment;
    if constexpr (kBits == 4) {
      uint32_t v0[4], v1[4], v2[4], v3[4];
      dequant_word4(w.x, bias_low[0], bias_high[0], v0);
      dequant_word4(w.y, bias_low[1], bias_high[1], v1);
      dequant_word4(w.z, bias_low[2], bias_high[2], v2);
      dequant_word4(w.w, bias_low[3], bias_high[3], v3);
      if constexpr (kGrouped) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v0[i] = mul_f16x2(v0[i], scale_pair[0]);
          v1[i] = mul_f16x2(v1[i], scale_pair[1]);
          v2[i] = mul_f16x2(v2[i], scale_pair[2]);
          v3[i] = mul_f16x2(v3[i], scale_pair[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
        const uint4 b = *reinterpret_cast<const uint4*>(xs + nt * 8 * kTokenStride);
        mma_m16n8k16(acc[nt][0], v0[0], v1[0], v0[1], v1[1], b.x, b.y);
        mma_m16n8k16(acc[nt][0], v0[2], v1[2], v0[3], v1[3], b.z, b.w);
        mma_m16n8k16(acc[nt][1], v2[0], v3[0], v2[1], v3[1], b.x, b.y);
        mma_m16n8k16(acc[nt][1], v2[2], v3[2], v2[3], v3[3], b.z, b.w);
      }
    } else {
      uint32_t v0[2], v1[2], v2[2], v3[2];
      dequant_word8(w.x, bias_low[0], v0);
      dequant_word8(w.y, bias_low[1], v1);
      dequant_word8(w.z, bias_low[2], v2);
      dequant_word8(w.w, bias_low[3], v3);
      if constexpr (kGrouped) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          v0[i] = mul_f16x2(v0[i], scale_pair[0]);
          v1[i] = mul_f16x2(v1[i], scale_pair[1]);
          v2[i] = mul_f16x2(v2[i], scale_pair[2]);
          v3[i] = mul_f16x2(v3[i], scale_pair[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
        const uint2 b = *reinterpret_cast<const uint2*>(xs + nt * 8 * kTokenStride);
        mma_m16n8k16(acc[nt][0], v0[0], v1[0], v0[1], v1[1], b.x, b.y);
        mma_m16n8k16(acc[nt][1], v2[0], v3[0], v2[1], v3[1], b.x, b.y);
      }
    }
  };

  for (int c = 0; c < n_chunks; ++c) {
    cp_async_wait<kStages - 2>();  // chunk c has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's; and every warp is done with chunk c - 1's stage
    stage_chunk(c + kStages - 1);  // into chunk c - 1's stage
    const uint8_t* stage = stages + (c % kStages) * kStageBytes;
#pragma unroll
    for (int j = 0; j < kChunkSteps; ++j) {
      if (c * kChunkSteps + j >= n_steps) break;  // uniform across the block
      compute_step(c * kChunkSteps + j, j, stage);
    }
  }
  cp_async_wait<0>();  // no copy outlives the block (only empty groups remain)

  if constexpr (!kGrouped) {  // per-channel: the float32 scale on the exact sums
    float scale[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) scale[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(scale_pair[r] & 0xFFFFu)));
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      acc[nt][0][0] *= scale[0];
      acc[nt][0][1] *= scale[0];
      acc[nt][0][2] *= scale[1];
      acc[nt][0][3] *= scale[1];
      acc[nt][1][0] *= scale[2];
      acc[nt][1][1] *= scale[2];
      acc[nt][1][2] *= scale[3];
      acc[nt][1][3] *= scale[3];
    }
  }

  // D of n-tile nt: acc[nt][p][j] (j = 0, 1) is row row + 2p, token nt * 8 + 2 quad_col + j; acc[nt][p][2 + j]
  // is row row + 2p + 1. So a thread writes 4 consecutive rows of 2 tokens, 16 bytes each.
  float* out = a.k_splits == 1 ? p.y : p.partials + int64_t{blockIdx.z} * a.m * p.rows;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t t = token0 + nt * 8 + 2 * quad_col + j;
      if (row_ok && t < a.m) {
        const float4 v = make_float4(acc[nt][0][j], acc[nt][0][2 + j], acc[nt][1][j], acc[nt][1][2 + j]);
        __stcg(reinterpret_cast<float4*>(out + t * p.rows + row), v);  // one 16-byte store
      }
    }
  }
  if (a.k_splits == 1) return;

  // Split-K: the last block of this (token tile, row block) to arrive adds the slices in a fixed order.
  __shared__ bool is_last_block;
  __threadfence();  // partials visible device-wide before this block is counted
  __syncthreads();
  const int64_t counter = int64_t{blockIdx.y} * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(a.counters + counter, 1u);
    is_last_block = arrived == static_cast<uint32_t>(a.k_splits - 1);
    if (is_last_block) a.counters[counter] = 0;  // every block of this tile has arrived: reset for the next launch
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();
  const int64_t rows_here = min(int64_t{kRows}, p.rows - row_base) / 4;  // float4 columns
  const int64_t tokens_here = min(int64_t{kTokens}, a.m - token0);
  for (int64_t i = threadIdx.x; i < rows_here * tokens_here; i += kThreads) {
    const int64_t t = token0 + i / rows_here, r = row_base + 4 * (i % rows_here);
    float4 sum = make_float4(0, 0, 0, 0);
    for (int s = 0; s < a.k_splits; ++s) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p.partials + (s * a.m + t) * p.rows + r));
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    __stcg(reinterpret_cast<float4*>(p.y + t * p.rows + r), sum);
  }
}

// ---- kDequantCublas: W rows [row0, row0 + n_rows) as fp16 [n_rows, cols].

struct DequantArgs {
  const int32_t* qweight;
  const uint16_t* scales;
  const int32_t* qzeros;
  __half* out;
  int64_t rows, cols, words, group_size;
  int64_t row0, n_rows;
  int zero_offset;
};

constexpr int kDequantRows = 64;    // rows of a block's tile
constexpr int kDequantWords = 32;   // packed words of a block's tile
constexpr int kDequantThreads = 256;

// A block transposes a tile of 32 packed words x 64 rows through shared memory: it reads each word's 64 rows
// as 256 contiguous bytes (qweight is [words, rows]) and writes each row's 32 words as 512 (4-bit) or 256
// (8-bit) contiguous bytes of fp16. (The first version, one thread per row writing 32 bytes, scattered its
// stores 8 KB apart and ran at ~320 GB/s on the H200: 363 us for 14336x4096.)
template <int kBits>
__global__ void __launch_bounds__(kDequantThreads) dequantize_rows(const DequantArgs a) {
  constexpr int kCodes = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  constexpr int kPerThread = kDequantWords * kDequantRows / kDequantThreads;
  __shared__ uint32_t tile[kDequantWords][kDequantRows + 1];  // +1: the transposed reads hit distinct banks
  const int64_t w0 = int64_t{blockIdx.x} * kDequantWords, r0 = int64_t{blockIdx.y} * kDequantRows;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * kDequantThreads;
    const int wi = i / kDequantRows, ri = i % kDequantRows;
    const bool inside = w0 + wi < a.words && r0 + ri < a.n_rows;
    tile[wi][ri] = inside ? static_cast<uint32_t>(__ldg(a.qweight + (w0 + wi) * a.rows + a.row0 + r0 + ri)) : 0u;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * kDequantThreads;
    const int ri = i / kDequantWords, wi = i % kDequantWords;  // a warp: one row, 32 consecutive words
    const int64_t w = w0 + wi, local_row = r0 + ri;
    if (w >= a.words || local_row >= a.n_rows) continue;
    const int64_t r = a.row0 + local_row;
    const int64_t g = w * kCodes / a.group_size;
    const float scale = __half2float(__ushort_as_half(__ldg(a.scales + g * a.rows + r)));
    const uint32_t zero_word = static_cast<uint32_t>(__ldg(a.qzeros + g * (a.rows * kBits / 32) + r * kBits / 32));
    const int zero = static_cast<int>((zero_word >> (kBits * (r % kCodes))) & kMask) + a.zero_offset;
    const uint32_t word = tile[wi][ri];
    __half h[kCodes];
#pragma unroll
    for (int j = 0; j < kCodes; ++j) {
      h[j] = __float2half_rn(scale * static_cast<float>(static_cast<int>((word >> (kBits * j)) & kMask) - zero));
    }
    __half* out = a.out + local_row * a.cols + w * kCodes;
    if constexpr (kBits == 4) *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(h);
    else *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(h);
  }
}

// ---- Launches.

unsigned grid_for(int64_t items, int threads, int multiprocessors) {
  const int64_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{std::max(multiprocessors, 1)} * 8));
}

std::string describe(const DeviceGptqMatrix& w, int64_t m) {
  return std::to_string(w.bits) + "-bit [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] group " +
         std::to_string(w.group_size) + ", m = " + std::to_string(m);
}

template <int kBits, int kTiles, int kWarps, int kStages, bool kGrouped>
Status launch_fused(const FusedArgs& args, int64_t token_tiles, const GemmPlan& plan, Stream stream, bool overlap) {
  auto kernel = gemm_gptq_tensor_core<kBits, kTiles, kWarps, kStages, kGrouped>;
  constexpr int kShared = kStages * kStageBytesOf<kBits, kTiles, kWarps>;
  const cudaError_t error = raise_shared_limit_once<gemm_gptq_tensor_core<kBits, kTiles, kWarps, kStages, kGrouped>>(kShared);
  if (error != cudaSuccess) {
    return cuda_status(error, "gemm_gptq: raising the shared-memory limit to " + std::to_string(kShared) + " bytes");
  }
  const dim3 grid(static_cast<unsigned>(token_tiles), static_cast<unsigned>(plan.row_blocks),
                  static_cast<unsigned>(plan.k_splits));
  return cuda_status(launch_kernel(kernel, grid, dim3(kWarps * 32), kShared, stream, overlap, args), "gemm_gptq launch");
}

template <int kBits, int kWarps, int kStages, bool kGrouped>
Status dispatch_tiles(const FusedArgs& args, int64_t token_tiles, const GemmPlan& plan, Stream stream, bool overlap) {
  switch (plan.token_tile) {
    case 8: return launch_fused<kBits, 1, kWarps, kStages, kGrouped>(args, token_tiles, plan, stream, overlap);
    case 16: return launch_fused<kBits, 2, kWarps, kStages, kGrouped>(args, token_tiles, plan, stream, overlap);
    case 32: return launch_fused<kBits, 4, kWarps, kStages, kGrouped>(args, token_tiles, plan, stream, overlap);
    case 64: return launch_fused<kBits, 8, kWarps, kStages, kGrouped>(args, token_tiles, plan, stream, overlap);
  }
  return internal_error("gemm_gptq: no kernel for a tile of " + std::to_string(plan.token_tile) + " tokens");
}

template <int kBits, bool kGrouped>
Status dispatch_fused(const FusedArgs& args, int64_t token_tiles, const GemmPlan& plan, Stream stream, bool overlap) {
  if (plan.warps == 4 && plan.stages == 2) return dispatch_tiles<kBits, 4, 2, kGrouped>(args, token_tiles, plan, stream, overlap);
  if (plan.warps == 4 && plan.stages == 3) return dispatch_tiles<kBits, 4, 3, kGrouped>(args, token_tiles, plan, stream, overlap);
  if (plan.warps == 8 && plan.stages == 2) return dispatch_tiles<kBits, 8, 2, kGrouped>(args, token_tiles, plan, stream, overlap);
  if (plan.warps == 8 && plan.stages == 3) return dispatch_tiles<kBits, 8, 3, kGrouped>(args, token_tiles, plan, stream, overlap);
  return internal_error("gemm_gptq: no kernel for " + std::to_string(plan.warps) + " warps and " +
                        std::to_string(plan.stages) + " stages");
}

// Where the fused kernel's staged x lives in the workspace's scratch (at its start; the split-K partials follow).
struct StagedX {
  int64_t words = 0;         // packed words along the input
  int64_t words_padded = 0;  // a staged row: whole chunks
  int64_t bytes = 0;         // for plan.m_chunk tokens, rounded up to 256
};

StagedX staged_x_layout(int bits, int64_t cols, int64_t m) {
  StagedX l;
  l.words = cols * bits / 32;
  const int64_t chunk_words = int64_t{kChunkSteps} * kWordsPerStep;
  l.words_padded = (l.words + chunk_words - 1) / chunk_words * chunk_words;
  l.bytes = (m * l.words_padded * GemmPlan::fragment_bytes(bits) + 255) / 256 * 256;
  return l;
}

// The staging launch for n tokens of x (op applied per `fusion`) into `out` (rows of l.words_padded words).
Status stage_x(int bits, int64_t cols, const float* x, int64_t n, const GemmInputFusion& fusion, const StagedX& l,
               void* out, int multiprocessors, Stream stream, bool overlap) {
  cudaError_t error;
  if (fusion.input == GemvInput::kRmsNorm) {
    PETREL_ASSIGN_OR_RETURN(WeightType type, weight_type(fusion.norm_weight.dtype, "the staging's RMSNorm weight"));
    error = launch_kernel(bits == 4 ? stage_x_fragments_rms_norm<4> : stage_x_fragments_rms_norm<8>,
                          dim3(static_cast<unsigned>(n)), dim3(rms_row_threads(cols)), 0, stream, overlap, x,
                          fusion.residual, fusion.residual_sum, cols, fusion.norm_weight.data, type, fusion.norm_eps,
                          l.words_padded, out);
  } else {
    const float* up = fusion.input == GemvInput::kSiluMul ? fusion.up : nullptr;
    const unsigned blocks = grid_for(n * l.words_padded, 256, multiprocessors);
    error = launch_kernel(bits == 4 ? stage_x_fragments<4> : stage_x_fragments<8>, dim3(blocks), dim3(256), 0, stream,
                          overlap, x, up, n, cols, l.words, l.words_padded, out);
  }
  return cuda_status(error, "staging x (" + std::to_string(bits) + "-bit fragments, " + std::to_string(n) + " x " +
                                std::to_string(cols) + ")");
}

// The product launch for n tokens staged in the scratch: one matrix, or several side by side in one grid (their
// row blocks one after the other; `plan` is then the plan of all as one matrix of their rows together), each
// into its member's y [n, rows].
Status launch_product(std::span<const GemvGroupMember> members, const StagedX& l, int64_t n, GemmWorkspace& workspace,
                      GemmPlan plan, Stream stream, bool overlap) {
  const DeviceGptqMatrix& w = *members[0].w;
  const int64_t steps = (l.words + kWordsPerStep - 1) / kWordsPerStep;
  uint8_t* scratch = static_cast<uint8_t*>(workspace.scratch());
  const bool grouped = w.group_size != w.cols;
  const int64_t block_rows = 32 * int64_t{plan.warps};
  FusedArgs args{};
  float* partials = reinterpret_cast<float*>(scratch + l.bytes);
  plan.row_blocks = 0;
  args.n_parts = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const DeviceGptqMatrix& m = *members[i].w;
    args.parts[i] = FusedPart{m.qweight, m.scales, m.qzeros, members[i].y, partials, m.rows, m.zero_offset};
    args.first_row_block[i] = static_cast<int>(plan.row_blocks);
    partials += int64_t{plan.k_splits} * n * m.rows;
    plan.row_blocks += (m.rows + block_rows - 1) / block_rows;
  }
  args.x_staged = scratch;
  args.counters = workspace.counters();
  args.m = n;
  args.words = l.words;
  args.words_padded = l.words_padded;
  args.group_steps = grouped ? w.group_size * w.bits / 32 / kWordsPerStep : 0;
  args.k_splits = plan.k_splits;
  args.steps_per_split = static_cast<int>(plan.steps_per_split);
  args.total_steps = static_cast<int>(steps);
  const int64_t token_tiles = (n + plan.token_tile - 1) / plan.token_tile;
  Status launched;
  if (w.bits == 4 && grouped) launched = dispatch_fused<4, true>(args, token_tiles, plan, stream, overlap);
  else if (w.bits == 4) launched = dispatch_fused<4, false>(args, token_tiles, plan, stream, overlap);
  else if (grouped) launched = dispatch_fused<8, true>(args, token_tiles, plan, stream, overlap);
  else launched = dispatch_fused<8, false>(args, token_tiles, plan, stream, overlap);
  PETREL_RETURN_IF_ERROR(launched);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return cuda_status(error, "gemm_gptq (tensor core) launch, " + describe(w, n));
  return ok_status();
}

Status run_tensor_core(const DeviceGptqMatrix& w, const float* x, int64_t m, float* y, GemmWorkspace& workspace,
                       const GemmPlan& plan, Stream stream, bool overlap) {
  const StagedX l = staged_x_layout(w.bits, w.cols, plan.m_chunk);
  for (int64_t m0 = 0; m0 < m; m0 += plan.m_chunk) {
    const int64_t n = std::min(plan.m_chunk, m - m0);
    PETREL_RETURN_IF_ERROR(stage_x(w.bits, w.cols, x + m0 * w.cols, n, GemmInputFusion{}, l, workspace.scratch(),
                                   workspace.multiprocessors(), stream, overlap));
    const GemvGroupMember member[] = {{&w, y + m0 * w.rows}};
    PETREL_RETURN_IF_ERROR(launch_product(member, l, n, workspace, plan, stream, overlap));
  }
  return ok_status();
}

Status run_dequant_cublas(const DeviceGptqMatrix& w, const float* x, int64_t m, float* y, GemmWorkspace& workspace,
                          const GemmPlan& plan, Stream stream) {
  PETREL_RETURN_IF_ERROR(workspace.bind_blas(stream));
  cublasHandle_t handle = workspace.blas().get();
  uint8_t* scratch = static_cast<uint8_t*>(workspace.scratch());
  const int64_t x_bytes = (plan.m_chunk * w.cols * 2 + 255) / 256 * 256;
  __half* x16 = reinterpret_cast<__half*>(scratch);
  __half* w16 = reinterpret_cast<__half*>(scratch + x_bytes);
  const float one = 1.0f, zero = 0.0f;
  const int64_t words = w.cols * w.bits / 32;
  for (int64_t m0 = 0; m0 < m; m0 += plan.m_chunk) {
    const int64_t n = std::min(plan.m_chunk, m - m0);
    PETREL_RETURN_IF_ERROR(convert_floats(x + m0 * w.cols, n * w.cols, DType::kF16, x16, stream));
    for (int64_t r0 = 0; r0 < w.rows; r0 += plan.slice_rows) {
      const int64_t slice = std::min(plan.slice_rows, w.rows - r0);
      const DequantArgs args{w.qweight, w.scales, w.qzeros, w16, w.rows, w.cols, words, w.group_size, r0, slice,
                             w.zero_offset};
      const dim3 grid(static_cast<unsigned>((words + kDequantWords - 1) / kDequantWords),
                      static_cast<unsigned>((slice + kDequantRows - 1) / kDequantRows));
      if (w.bits == 4) dequantize_rows<4><<<grid, kDequantThreads, 0, stream>>>(args);
      else dequantize_rows<8><<<grid, kDequantThreads, 0, stream>>>(args);
      const cudaError_t error = cudaGetLastError();
      if (error != cudaSuccess) return cuda_status(error, "gemm_gptq dequantize launch, " + describe(w, m));
      const cublasStatus_t status =
          cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(slice), static_cast<int>(n),
                       static_cast<int>(w.cols), &one, w16, CUDA_R_16F, static_cast<int>(w.cols), x16, CUDA_R_16F,
                       static_cast<int>(w.cols), &zero, y + m0 * w.rows + r0, CUDA_R_32F, static_cast<int>(w.rows),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (status != CUBLAS_STATUS_SUCCESS) return blas_status(status, "cublasGemmEx (gemm_gptq, " + describe(w, m) + ")");
    }
  }
  return ok_status();
}

}  // namespace

Status dequantize_gptq(const DeviceGptqMatrix& w, void* out, Stream stream) {
  PETREL_RETURN_IF_ERROR(gemm_gptq_supports(w));
  if (!w.qweight || !w.scales || !w.qzeros || !out) return invalid_argument("dequantize_gptq: null device pointer");
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return invalid_argument("dequantize_gptq: out must be 16-byte aligned");
  const int64_t words = w.cols * w.bits / 32;
  if ((w.rows + kDequantRows - 1) / kDequantRows > 65535) return unsupported("dequantize_gptq: " + describe(w, 0) + " has too many rows");
  const DequantArgs args{w.qweight, w.scales, w.qzeros, static_cast<__half*>(out), w.rows, w.cols, words, w.group_size,
                         0, w.rows, w.zero_offset};
  const dim3 grid(static_cast<unsigned>((words + kDequantWords - 1) / kDequantWords),
                  static_cast<unsigned>((w.rows + kDequantRows - 1) / kDequantRows));
  if (w.bits == 4) dequantize_rows<4><<<grid, kDequantThreads, 0, stream>>>(args);
  else dequantize_rows<8><<<grid, kDequantThreads, 0, stream>>>(args);
  return cuda_status(cudaGetLastError(), "dequantize_gptq launch, " + describe(w, 0));
}

namespace {

// Pointers, alignment and grid limits of one product (after plan_gemm_gptq accepted the shape).
Status check_operands(const char* what, const DeviceGptqMatrix& w, const float* x, const float* y, int64_t m,
                      const GemmPlan& plan, const GemmWorkspace& workspace) {
  const std::string name(what);
  if (!w.qweight || !w.scales || !w.qzeros || !x || !y) return invalid_argument(name + ": null device pointer");
  if (!workspace.scratch()) return invalid_argument(name + ": the workspace was not created");
  const auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  if ((address(w.qweight) | address(x) | address(y)) % 16 != 0 || address(w.scales) % 8 != 0) {
    return invalid_argument(name + ": qweight, x and y must be 16-byte aligned and scales 8-byte aligned");
  }
  if (plan.row_blocks > 65535 || (w.rows + kDequantRows - 1) / kDequantRows > 65535 || w.cols > 0x7FFFFFFF) {
    return unsupported(name + ": " + describe(w, m) + " exceeds the launch's grid or cuBLAS's int dimensions");
  }
  return ok_status();
}

// The fusion's operands for rows of `cols` inputs.
Status check_fusion(const char* what, const GemmInputFusion& fusion, int64_t cols) {
  const std::string name(what);
  switch (fusion.input) {
    case GemvInput::kPlain: break;
    case GemvInput::kRmsNorm:
      if (fusion.norm_weight.size != cols || !fusion.norm_weight.data) {
        return invalid_argument(name + ": an RMSNorm weight of " + std::to_string(fusion.norm_weight.size) + " for " +
                                std::to_string(cols) + " inputs");
      }
      if (!fusion.residual != !fusion.residual_sum) {
        return invalid_argument(name + ": the residual and where its sum goes come together");
      }
      break;
    case GemvInput::kSiluMul:
      if (!fusion.up || reinterpret_cast<uintptr_t>(fusion.up) % 16 != 0) {
        return invalid_argument(name + ": SiLU*up needs up, 16-byte aligned");
      }
      break;
  }
  return ok_status();
}

// The members' plans when gemm_gptq_group takes them, else why not.
Result<std::vector<GemmPlan>> plan_group(std::span<const GemvGroupMember> members, int64_t m,
                                         const GemmWorkspace& workspace, const GemmOptions& options) {
  if (members.empty() || members.size() > static_cast<size_t>(kMaxGemvGroupMembers)) {
    return invalid_argument("gemm_gptq_group: " + std::to_string(members.size()) + " members (1 to " +
                            std::to_string(kMaxGemvGroupMembers) + ")");
  }
  std::vector<GemmPlan> plans;
  for (const GemvGroupMember& member : members) {
    if (!member.w) return invalid_argument("gemm_gptq_group: a member without a matrix");
    const DeviceGptqMatrix& w = *member.w;
    if (w.bits != members[0].w->bits || w.cols != members[0].w->cols) {
      return invalid_argument("gemm_gptq_group: members read different inputs (" + describe(*members[0].w, m) +
                              " and " + describe(w, m) + ")");
    }
    PETREL_ASSIGN_OR_RETURN(GemmPlan plan, plan_gemm_gptq(w, m, workspace.multiprocessors(), workspace.capacity(),
                                                          workspace.counter_capacity(), options));
    if (plan.algorithm != GemmAlgorithm::kTensorCore || plan.m_chunk != m) {
      return unsupported("gemm_gptq_group: " + describe(w, m) +
                         " is not one launch of the fused kernel (its plan: dequantize + cuBLAS, or the tokens in pieces)");
    }
    plans.push_back(plan);
  }
  return plans;
}

// The plan of several members as one launch (GemmOptions::one_launch): all as one matrix of their rows
// together, when that is still one launch of the fused kernel, the members agree on the group size, and each
// but the last has whole row blocks (so the plan's row blocks split between them); nullopt otherwise.
Result<std::optional<GemmPlan>> plan_together(std::span<const GemvGroupMember> members, int64_t m,
                                              const GemmWorkspace& workspace, const GemmOptions& options) {
  DeviceGptqMatrix all = *members[0].w;
  all.rows = 0;
  for (const GemvGroupMember& member : members) {
    if (member.w->group_size != all.group_size) return std::optional<GemmPlan>();
    all.rows += member.w->rows;
  }
  PETREL_ASSIGN_OR_RETURN(GemmPlan plan, plan_gemm_gptq(all, m, workspace.multiprocessors(), workspace.capacity(),
                                                        workspace.counter_capacity(), options));
  if (plan.algorithm != GemmAlgorithm::kTensorCore || plan.m_chunk != m) return std::optional<GemmPlan>();
  const int64_t block_rows = 32 * int64_t{plan.warps};
  for (size_t i = 0; i + 1 < members.size(); ++i) {
    if (members[i].w->rows % block_rows != 0) return std::optional<GemmPlan>();
  }
  return std::optional<GemmPlan>(plan);
}

}  // namespace

bool gemm_gptq_group_applies(std::span<const GemvGroupMember> members, int64_t m, const GemmWorkspace& workspace,
                             const GemmOptions& options) {
  return plan_group(members, m, workspace, options).ok();
}

Status gemm_gptq_group(std::span<const GemvGroupMember> members, const float* x, int64_t m, GemmWorkspace& workspace,
                       Stream stream, const GemmOptions& options, const GemmInputFusion& fusion) {
  PETREL_ASSIGN_OR_RETURN(std::vector<GemmPlan> plans, plan_group(members, m, workspace, options));
  for (size_t i = 0; i < members.size(); ++i) {
    PETREL_RETURN_IF_ERROR(check_operands("gemm_gptq_group", *members[i].w, x, members[i].y, m, plans[i], workspace));
  }
  const DeviceGptqMatrix& first = *members[0].w;
  PETREL_RETURN_IF_ERROR(check_fusion("gemm_gptq_group", fusion, first.cols));
  const StagedX l = staged_x_layout(first.bits, first.cols, plans[0].m_chunk);  // every member's: same bits, cols, m
  PETREL_RETURN_IF_ERROR(stage_x(first.bits, first.cols, x, m, fusion, l, workspace.scratch(), workspace.multiprocessors(),
                                 stream, options.overlap_previous));
  if (options.one_launch && members.size() > 1) {
    PETREL_ASSIGN_OR_RETURN(std::optional<GemmPlan> together, plan_together(members, m, workspace, options));
    if (together) return launch_product(members, l, m, workspace, *together, stream, options.overlap_previous);
  }
  for (size_t i = 0; i < members.size(); ++i) {
    PETREL_RETURN_IF_ERROR(launch_product(members.subspan(i, 1), l, m, workspace, plans[i], stream, options.overlap_previous));
  }
  return ok_status();
}

Status gemm_gptq(const DeviceGptqMatrix& w, const float* x, int64_t m, float* y, GemmWorkspace& workspace,
                 Stream stream, const GemmOptions& options) {
  PETREL_ASSIGN_OR_RETURN(GemmPlan plan, plan_gemm_gptq(w, m, workspace.multiprocessors(), workspace.capacity(),
                                                        workspace.counter_capacity(), options));
  PETREL_RETURN_IF_ERROR(check_operands("gemm_gptq", w, x, y, m, plan, workspace));
  if (plan.algorithm == GemmAlgorithm::kTensorCore) {
    return run_tensor_core(w, x, m, y, workspace, plan, stream, options.overlap_previous);
  }
  return run_dequant_cublas(w, x, m, y, workspace, plan, stream);
}

}  // namespace petrel::cuda
