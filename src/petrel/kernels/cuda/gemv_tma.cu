// kernels/cuda: the 4-bit GEMV fed by tensor copies (gemv_tma.h says why it exists). Same arithmetic as
// gemv_gptq.cu's tensor-core vector kernel (its fragment mapping, dequantization and mma; promotion every 8
// steps per channel, at every group of 128 inputs otherwise); what differs is how the weights arrive.
// Groups (the kGrouped build, session 40): a multiple of 128 inputs whose zeros are one value (a symmetric grid,
// decoded once, as gemv_gptq's uniform-zeros build); slices start at multiples of 4 steps, so each half stage
// lies in one group and is promoted with that group's scales, which each thread loads a stage ahead (8 bytes a
// half), as the stage's weights are asked for.
//
// Work: block (row tile of 128 rows, input slice) as gemv_gptq's plan, 4 warps of 32 rows. Each warp owns a
// ring of `stages` buffers of 4 KB in shared memory: one stage is 8 steps of its 32 rows, 32 packed words x 32
// rows of qweight (GPTQ layout [words, rows], read as is), which ONE tensor copy (cp.async.bulk.tensor.2d,
// box 32 rows x 32 words, completing on the stage's mbarrier) brings in. Lane 0 of the warp asks for the
// first stages before the wait for the previous kernel (GemvTmaOptions::prewait_stages of them, the others once x
// is staged; no registers held: the ring's bytes in flight are bounded by shared memory, not by the register
// file, which bounds gemv_gptq's at ~24 KB a block), and refills a stage as soon as its 8 steps are in registers.
// No block barrier after x is staged: each warp waits on its own mbarriers only.
//
// Measured (docs/PERFORMANCE.md, session 37; H100s, where both kernels are memory-bound): alone a tie with the
// register kernel (gate/up 23.9-24.2 against 23.7 us), one stage streaming as well as three; in the decode step a
// tie where every block fits an SM (q/k/v and gate/up through it, -0.3%), -7 to -12% where stages cost blocks an
// SM at the step's 60% carveout; down (SiLU * up input, session 38) -5.7% in the step. On an H200 (session 40),
// whose register loop runs below its copy bandwidth: alone faster (gate/up 19.5 against 20.9 us, q/k/v 6.8 against
// 7.3), one stage best (two 20.5, three 21.9); in the step q/k/v and gate/up through it +1.8 to +2.4% per channel.
// A balanced grid (every warp an equal range of 32-row x 8-step units, each block staging all of x) lost 12% in
// the step and 17-62% alone (session 38, H100; branch experiment/tma-balanced): its per-block staging and per-warp
// row changes cost more than the uneven SMs.
//
// Shared-memory layout of a stage: the copy writes word row r (128 bytes: rows 0..31 of the warp, 4 bytes
// each) with the 128-byte swizzle (16-byte chunk c of row r lands at chunk c ^ (r % 8); the buffer is 1024-byte
// aligned). Thread (quad_row, quad_col) reads, for step j of the stage, word row 4 j + quad_col, chunk quad_row
// (its 4 rows 4 quad_row .. + 3): the 8 threads of each quarter-warp phase (quad_row two values, quad_col four)
// then hit 8 different chunks mod 8 only up to a 2-way conflict (quad_row ^ (r % 8) repeats once), where the
// unswizzled layout conflicts 4 ways.
//
// The epilogue adds each row's sum into y with one float4 atomic (GemvOptions::atomic_reduce's way), so there is
// no split-K second pass. Out-of-range rows and words: the copies zero-fill them; rows past the end are not
// written.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/async_copy.cuh"
#include "petrel/kernels/cuda/bulk_copy.cuh"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gemv_tma.h"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/timeline.cuh"

namespace petrel::cuda {

namespace {

using namespace ptx;

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 32;
constexpr int kRows = kWarps * kRowsPerWarp;
constexpr int kWordsPerStep = 4;
constexpr int kStageSteps = 8;  // also the promotion interval (gemv_gptq.cu's kPromoteSteps)
constexpr int kStageWords = kStageSteps * kWordsPerStep;
constexpr int kStageBytes = kStageWords * kRowsPerWarp * 4;  // 4 KB
constexpr int kSwizzleAlign = 1024;

struct TmaPart {
  float* y;
  const uint16_t* scales;
  const int32_t* qzeros;
  int64_t rows;
  int first_tile;  // the grid's first row tile of this member
  int zero_offset;
  int uniform_zero;  // DeviceGptqMatrix::uniform_zero (the grouped build: every group's zeros this value)
};

struct TmaArgs {
  TmaPart parts[kMaxGemvGroupMembers];
  int n_parts;
  const float* x;
  int64_t cols;
  // kNorm: y = W (norm_weight * (x / sqrt(mean(x^2) + norm_eps))), as gemv_gptq's GemvInput::kRmsNorm.
  const void* norm_weight;
  WeightType norm_type;
  float norm_eps;
  const float* up;  // kSiluMul: y = W (SiLU(x) * up), as gemv_gptq's GemvInput::kSiluMul
  float* clear[2];  // zeroed after the wait (GemvFusion::clear)
  int64_t clear_vectors[2];
  int steps_per_split, total_steps, stages, prewait_stages;
  int group_steps;  // the grouped build: steps a group (a multiple of 4; slices start at multiples of 4 steps)
  int late_dependents;  // GemvTmaOptions::late_dependents
  const void* tag;       // the first member's qweight: the timeline's tag of this launch (as gemv_gptq's)
  TimelineRing timeline;  // read only by the kTimeline instantiations (timeline.h)
};

struct TmaMaps {
  CUtensorMap map[kMaxGemvGroupMembers];  // each member's qweight as [words, rows] int32, boxes of 32 x 32
};

// Dynamic shared memory: the warps' rings (1024-byte aligned), the staged x (fp16 fragments), the mbarriers,
// and with kNorm the slice's norm weights and x (float32).
struct TmaSharedLayout {
  size_t rings, x_staged, bars, norm, x_slice, bytes;
};
__host__ __device__ inline TmaSharedLayout tma_shared_layout(int stages, int steps_per_split, int norm_bytes) {
  TmaSharedLayout l;
  l.rings = 0;
  l.x_staged = size_t{kWarps} * stages * kStageBytes;
  l.bars = l.x_staged + static_cast<size_t>(steps_per_split) * kWordsPerStep * 16;
  l.norm = l.bars + size_t{kWarps} * stages * 8;
  const size_t inputs = static_cast<size_t>(steps_per_split) * kWordsPerStep * 8;
  l.x_slice = l.norm + (norm_bytes > 0 ? (inputs * norm_bytes + 15) / 16 * 16 : 0);
  l.bytes = l.x_slice + (norm_bytes > 0 ? inputs * 4 : 0) + kSwizzleAlign;  // + the alignment's slack
  return l;
}

// This thread's 16 bytes of each of a landed stage's 8 steps (the swizzled layout above).
__device__ __forceinline__ void read_stage(const uint8_t* stage, int quad_row, int quad_col, uint4 (&w)[kStageSteps]) {
#pragma unroll
  for (int j = 0; j < kStageSteps; ++j) {
    const int r = j * kWordsPerStep + quad_col;
    w[j] = *reinterpret_cast<const uint4*>(stage + r * 128 + ((quad_row ^ (r % 8)) << 4));
  }
}

// Steps first + kFrom .. first + kFrom + kCount - 1 of a stage (those below `steps`) times x (x_staged: fp16
// fragments, 4 words a step) into the accumulators.
template <int kFrom, int kCount>
__device__ __forceinline__ void stage_steps(const uint4 (&w)[kStageSteps], const uint4* x_staged, int first, int steps,
                                            int quad_col, const uint32_t (&bias_low)[4], const uint32_t (&bias_high)[4],
                                            float (&acc01)[4], float (&acc23)[4]) {
  if (first + kFrom + kCount <= steps) {
#pragma unroll
    for (int j = kFrom; j < kFrom + kCount; ++j) {
      mma_step4(acc01, acc23, w[j], x_staged[(first + j) * kWordsPerStep + quad_col], bias_low, bias_high);
    }
  } else {
#pragma unroll
    for (int j = kFrom; j < kFrom + kCount; ++j) {
      if (first + j < steps) mma_step4(acc01, acc23, w[j], x_staged[(first + j) * kWordsPerStep + quad_col], bias_low, bias_high);
    }
  }
}

// A stage's 8 steps into the accumulators, then promoted into `total` (every stage: 8 steps, gemv_gptq's
// kPromoteSteps; per-channel scales).
__device__ __forceinline__ void compute_stage(const uint4 (&w)[kStageSteps], const uint4* x_staged, int first, int steps,
                                              int quad_col, const uint32_t (&bias_low)[4], const uint32_t (&bias_high)[4],
                                              const float (&scale)[4], float (&acc01)[4], float (&acc23)[4], float (&total)[4]) {
  stage_steps<0, kStageSteps>(w, x_staged, first, steps, quad_col, bias_low, bias_high, acc01, acc23);
  promote4(total, scale, acc01, acc23);
}

// The grouped build's stage: each half (4 steps, within one group: groups are multiples of 4 steps and slices
// start at multiples of 4) promoted with its group's scales (raw[0], raw[1]), as gemv_gptq promotes at every
// group change.
__device__ __forceinline__ void compute_stage_grouped(const uint4 (&w)[kStageSteps], const uint4* x_staged, int first, int steps,
                                                      int quad_col, const uint32_t (&bias_low)[4], const uint32_t (&bias_high)[4],
                                                      const uint2 (&raw)[2], float (&acc01)[4], float (&acc23)[4],
                                                      float (&total)[4]) {
  float scale[4];
  stage_steps<0, 4>(w, x_staged, first, steps, quad_col, bias_low, bias_high, acc01, acc23);
  decode_scales(raw[0], scale);
  promote4(total, scale, acc01, acc23);
  stage_steps<4, 4>(w, x_staged, first, steps, quad_col, bias_low, bias_high, acc01, acc23);
  decode_scales(raw[1], scale);
  promote4(total, scale, acc01, acc23);
}

// The grouped build: the 4 rows' scales of both halves of stage `chunk` (the groups of its first and fifth steps;
// halves past the slice's steps, or rows past the matrix, load nothing).
__device__ __forceinline__ void load_stage_scales(const uint16_t* row_scales, int64_t rows, bool row_ok, int first_step,
                                                  int chunk, int steps, int group_steps, uint2 (&raw)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int step = chunk * kStageSteps + 4 * h;  // within the slice
    raw[h] = load_raw_scales(row_scales + (first_step + step) / group_steps * rows, row_ok && step < steps);
  }
}

// 1 / sqrt(mean(x^2) + eps) from each thread's partial sum of squares (the warp's shuffles, then the warps in
// order), after this thread's cp.async copies (the norm weights) have landed and every thread has passed.
__device__ __forceinline__ float inv_rms_after_copies(float sum, const TmaArgs& a) {
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  __shared__ float warp_sums[kWarps];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  cp_async_wait<0>();
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kWarps; ++k) total += warp_sums[k];
  return 1.0f / sqrtf(total / static_cast<float>(a.cols) + a.norm_eps);
}

// GemvFusion::clear after the wait: block b of `blocks` zeroes its share of the two vectors.
__device__ __forceinline__ void clear_vectors(const TmaArgs& a, int64_t b, int64_t blocks) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    for (int64_t i = b * kThreads + threadIdx.x; i < a.clear_vectors[k]; i += blocks * kThreads) {
      __stcg(reinterpret_cast<float4*>(a.clear[k]) + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
  }
}

// kGrouped: weights in groups of a multiple of 128 inputs whose zeros are all one value (TmaPart::uniform_zero);
// otherwise per channel. kTimeline: thread 0 stamps the block's phases into a.timeline (timeline.h; the same
// points and record kind as gemv_gptq's vector kernels, so timeline_report.py reads both: t5 the stages asked
// for before the wait, t1 past the wait, t4 the sum of squares, t2 x staged, t3 out of the loop, t8 the end).
template <GemvInput kInput, bool kGrouped, bool kTimeline>
__global__ void __launch_bounds__(kThreads) gemv_tma_kernel(const __grid_constant__ TmaMaps maps, const TmaArgs a) {
  constexpr bool kNorm = kInput == GemvInput::kRmsNorm;
  uint64_t stamps[kTimelineStamps] = {};
  auto stamp = [&](int i) {
    if constexpr (kTimeline) {
      if (threadIdx.x == 0) stamps[i] = timeline_now();
    }
  };
  stamp(0);
  if (!a.late_dependents) allow_dependent_launch();
  extern __shared__ uint8_t shared_raw[];
  uint8_t* const base = shared_raw + (kSwizzleAlign - shared_address(shared_raw) % kSwizzleAlign) % kSwizzleAlign;
  const TmaSharedLayout layout = tma_shared_layout(a.stages, a.steps_per_split, kNorm ? weight_type_bytes(a.norm_type) : 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  uint8_t* const ring = base + layout.rings + warp * a.stages * kStageBytes;
  uint4* const x_staged = reinterpret_cast<uint4*>(base + layout.x_staged);
  uint64_t* const bars = reinterpret_cast<uint64_t*>(base + layout.bars) + warp * a.stages;

  // The block's member: selected with constant indices (no local-memory copy of the table).
  const int tile = static_cast<int>(blockIdx.x);
  TmaPart part = a.parts[0];
  const CUtensorMap* map = &maps.map[0];
#pragma unroll
  for (int i = 1; i < kMaxGemvGroupMembers; ++i) {
    if (i < a.n_parts && tile >= a.parts[i].first_tile) {
      part = a.parts[i];
      map = &maps.map[i];
    }
  }
  const int first_step = static_cast<int>(blockIdx.y) * a.steps_per_split;
  const int steps = min(a.steps_per_split, a.total_steps - first_step);
  const int first_word = first_step * kWordsPerStep;
  const int chunks = (steps + kStageSteps - 1) / kStageSteps;
  const int warp_row0 = (tile - part.first_tile) * kRows + warp * kRowsPerWarp;
  auto refill = [&](int slot, int chunk) {  // lane 0
    mbarrier_arrive_expect_tx(bars + slot, kStageBytes);
    tensor_copy_to_shared(ring + slot * kStageBytes, map, warp_row0, first_word + chunk * kStageWords, bars + slot);
  };
  if (lane == 0) {
    for (int i = 0; i < a.stages; ++i) mbarrier_init(bars + i, 1);
    fence_barrier_init();
    for (int c = 0; c < min(a.prewait_stages, chunks); ++c) refill(c, c);
  }
  const int64_t row = warp_row0 + 4 * quad_row;
  const bool row_ok = row < part.rows;
  uint2 raw_scales;
  uint32_t raw_zeros;
  uint2 stage_scales[2];  // kGrouped: the next stage's scales, loaded a stage ahead (as its weights are)
  if constexpr (kGrouped) {
    raw_zeros = static_cast<uint32_t>(part.uniform_zero) * 0x11111111u;  // every row's zero, 8 rows a word
    load_stage_scales(part.scales + row, part.rows, row_ok, first_step, 0, steps, a.group_steps, stage_scales);
  } else {
    load_raw_params(part.scales + row, part.qzeros + row / 8, row_ok, raw_scales, raw_zeros);
  }
  const int inputs = steps * kWordsPerStep * 8;  // the slice's inputs (cols % 32 == 0: whole steps)
  const int64_t first_input = int64_t{first_word} * 8;
  char* const norm_slice = reinterpret_cast<char*>(base + layout.norm);
  float* const x_slice = reinterpret_cast<float*>(base + layout.x_slice);
  if constexpr (kNorm) {  // the slice's norm weights, before the wait (they depend on nothing earlier)
    const int elem = weight_type_bytes(a.norm_type);
    const char* from = static_cast<const char*>(a.norm_weight) + first_input * elem;
    for (int off = threadIdx.x * 16; off < inputs * elem; off += kThreads * 16) cp_async16(norm_slice + off, from + off);
    cp_async_commit();
  }

  stamp(5);
  wait_for_previous_kernel();
  stamp(1);
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  float inv_rms = 1.0f;
  if constexpr (kNorm) {
    // 1 / sqrt(mean(x^2) + eps) over all of x, every block (as gemv_gptq's input_inv_rms: per thread in element
    // order, then the warp's shuffles, then the warps in order); the slice's elements kept in shared memory.
    const int64_t n4 = a.cols / 4, slice_begin4 = first_input / 4, slice_end4 = slice_begin4 + inputs / 4;
    float sum = 0.0f;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
      const float4 v = __ldcg(x4 + i);
      if (i >= slice_begin4 && i < slice_end4) reinterpret_cast<float4*>(x_slice)[i - slice_begin4] = v;
      sum = fmaf(v.x, v.x, sum);
      sum = fmaf(v.y, v.y, sum);
      sum = fmaf(v.z, v.z, sum);
      sum = fmaf(v.w, v.w, sum);
    }
    inv_rms = inv_rms_after_copies(sum, a);
    stamp(4);
  }
  // x of the slice in fp16, per word in fragment order {x0,x4},{x1,x5},{x2,x6},{x3,x7} (as gemv_gptq.cu).
  auto input4 = [&](int64_t j) {  // elements 4 j .. 4 j + 3 of the slice, the fused op applied
    if constexpr (kNorm) {
      const float4 v = reinterpret_cast<const float4*>(x_slice)[j];
      const float4 w = widen4_shared(norm_slice, a.norm_type, 4 * j);
      return make_float4(w.x * (v.x * inv_rms), w.y * (v.y * inv_rms), w.z * (v.z * inv_rms), w.w * (v.w * inv_rms));
    } else if constexpr (kInput == GemvInput::kSiluMul) {
      return silu_mul4(__ldcg(x4 + first_input / 4 + j), __ldcg(reinterpret_cast<const float4*>(a.up) + first_input / 4 + j));
    } else {
      return __ldcg(x4 + first_input / 4 + j);
    }
  };
  for (int i = threadIdx.x; i < steps * kWordsPerStep; i += kThreads) {
    const float4 lo = input4(2 * i), hi = input4(2 * i + 1);
    x_staged[i] = make_uint4(pack_half2(lo.x, hi.x), pack_half2(lo.y, hi.y), pack_half2(lo.z, hi.z), pack_half2(lo.w, hi.w));
  }
  if (lane == 0) {  // the stages not asked for before the wait
    for (int c = a.prewait_stages; c < min(a.stages, chunks); ++c) refill(c, c);
  }
  __syncthreads();
  stamp(2);

  uint32_t bias_low[4], bias_high[4];
  zero_biases<4>(raw_zeros >> (4 * static_cast<int>(row % 8)), zero_bias_bases(part.zero_offset), bias_low, bias_high);
  float scale[4];
  if constexpr (!kGrouped) decode_scales(raw_scales, scale);

  float acc01[4] = {0, 0, 0, 0}, acc23[4] = {0, 0, 0, 0}, total[4] = {0, 0, 0, 0};
  for (int c = 0; c < chunks; ++c) {
    const int slot = c % a.stages;
    mbarrier_wait(bars + slot, static_cast<uint32_t>(c / a.stages) & 1u);
    uint4 w[kStageSteps];
    read_stage(ring + slot * kStageBytes, quad_row, quad_col, w);
    // The stage's words are in registers: it may be refilled (the copy engine's writes ordered after this
    // warp's reads of it).
    __syncwarp();
    if (lane == 0 && c + a.stages < chunks) {
      fence_proxy_async_shared();
      refill(slot, c + a.stages);
    }
    if constexpr (kGrouped) {
      const uint2 raw[2] = {stage_scales[0], stage_scales[1]};
      if (c + 1 < chunks) load_stage_scales(part.scales + row, part.rows, row_ok, first_step, c + 1, steps, a.group_steps, stage_scales);
      compute_stage_grouped(w, x_staged, c * kStageSteps, steps, quad_col, bias_low, bias_high, raw, acc01, acc23, total);
    } else {
      compute_stage(w, x_staged, c * kStageSteps, steps, quad_col, bias_low, bias_high, scale, acc01, acc23, total);
    }
  }
  stamp(3);
  if (a.late_dependents) allow_dependent_launch();
  if (quad_col == 0 && row_ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(part.y + row), make_float4(total[0], total[1], total[2], total[3]));
#else
    for (int r = 0; r < 4; ++r) atomicAdd(part.y + row + r, total[r]);
#endif
  }
  clear_vectors(a, int64_t{blockIdx.y} * gridDim.x + blockIdx.x, int64_t{gridDim.x} * gridDim.y);
  if constexpr (kTimeline) {
    stamp(kTimelineStamps - 1);
    if (threadIdx.x == 0) timeline_append(a.timeline, a.tag, 0x40u + static_cast<uint32_t>(kInput), static_cast<uint32_t>(steps), stamps);
  }
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

Status gemv_gptq_tma_supports(const DeviceGptqMatrix& w) {
  auto shape = [&] {  // built piecewise: GCC 12's -Wrestrict misfires on "[" + std::to_string(..) + ..
    std::string text = "[";
    text += std::to_string(w.rows);
    text += ", ";
    text += std::to_string(w.cols);
    text += "]";
    return text;
  };
  if (w.bits != 4) return unsupported("gemv_gptq_tma: 4-bit weights only, not " + std::to_string(w.bits) + "-bit");
  if (w.group_size != w.cols &&
      (w.group_size <= 0 || w.group_size % 128 != 0 || w.cols % w.group_size != 0 || w.uniform_zero < 0)) {
    return unsupported("gemv_gptq_tma: per-channel weights, or groups of a multiple of 128 inputs that divides cols with "
                       "one zero for all (a symmetric grid) only; group size " + std::to_string(w.group_size) +
                       (w.uniform_zero < 0 ? ", zeros varying" : ""));
  }
  if (w.rows <= 0 || w.rows % 4 != 0) return invalid_argument("gemv_gptq_tma: rows must be a positive multiple of 4, got " + shape());
  if (w.cols <= 0 || w.cols % 32 != 0) return invalid_argument("gemv_gptq_tma: cols must be a positive multiple of 32, got " + shape());
  if (w.rows > (int64_t{1} << 30) || w.cols > (int64_t{1} << 30)) return invalid_argument("gemv_gptq_tma: " + shape() + " is too large");
  if (address(w.qweight) % 16 != 0) return invalid_argument("gemv_gptq_tma: qweight must be 16-byte aligned");
  return ok_status();
}

Status gemv_gptq_tma_grouped(std::span<const GemvGroupMember> members, const float* x, int multiprocessors, Stream stream,
                             const GemvTmaOptions& options, const GemvFusion& fusion) {
  if (members.empty() || members.size() > static_cast<size_t>(kMaxGemvGroupMembers)) {
    return invalid_argument("gemv_gptq_tma: 1 to " + std::to_string(kMaxGemvGroupMembers) + " members, got " +
                            std::to_string(members.size()));
  }
  const DeviceGptqMatrix& w0 = *members[0].w;
  for (const GemvGroupMember& m : members) {
    if (!m.w || !m.y) return invalid_argument("gemv_gptq_tma: a member without a matrix or an output");
    PETREL_RETURN_IF_ERROR(gemv_gptq_tma_supports(*m.w));
    if (m.w->cols != w0.cols) return invalid_argument("gemv_gptq_tma: the members' cols differ");
    if (m.w->group_size != w0.group_size) return invalid_argument("gemv_gptq_tma: the members' group sizes differ");
    if (address(m.y) % 16 != 0) return invalid_argument("gemv_gptq_tma: y must be 16-byte aligned");
  }
  if (address(x) % 16 != 0) return invalid_argument("gemv_gptq_tma: x must be 16-byte aligned");
  if (fusion.residual) return unsupported("gemv_gptq_tma: no residual (y accumulates: pass the residual as y)");
  if (fusion.input == GemvInput::kSiluMul && (!fusion.up || address(fusion.up) % 16 != 0)) {
    return invalid_argument("gemv_gptq_tma: SiLU * up needs a 16-byte aligned up");
  }
  if (options.stages < 1 || options.stages > kMaxGemvTmaStages) {
    return invalid_argument("gemv_gptq_tma: stages must be 1 to " + std::to_string(kMaxGemvTmaStages) + ", got " +
                            std::to_string(options.stages));
  }
  const bool norm = fusion.input == GemvInput::kRmsNorm;
  WeightType norm_type = WeightType::kF32;
  if (norm) {
    PETREL_ASSIGN_OR_RETURN(norm_type, weight_type(fusion.norm_weight.dtype, "gemv_gptq_tma: the norm weight"));
    if (fusion.norm_weight.size != w0.cols || address(fusion.norm_weight.data) % 16 != 0) {
      return invalid_argument("gemv_gptq_tma: the norm weight must have cols elements and be 16-byte aligned");
    }
  }
  TmaArgs args{};
  for (int k = 0; k < 2; ++k) {
    if (fusion.clear[k].count % 4 != 0 || address(fusion.clear[k].data) % 16 != 0) {
      return invalid_argument("gemv_gptq_tma: a vector to clear must be 16-byte aligned and a multiple of 4 floats");
    }
    args.clear[k] = fusion.clear[k].data;
    args.clear_vectors[k] = fusion.clear[k].data ? fusion.clear[k].count / 4 : 0;
  }
  int device = 0, major = 0;
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "gemv_gptq_tma: cudaGetDevice");
  PETREL_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                              "gemv_gptq_tma: compute capability");
  if (major < 9) return unsupported("gemv_gptq_tma: needs tensor copies (compute capability 9.0 or later)");
  int k_splits = options.k_splits;
  if (k_splits <= 0) {
    PETREL_ASSIGN_OR_RETURN(const GemvPlan plan, plan_gemv_gptq_grouped(members, multiprocessors, int64_t{1} << 40));
    k_splits = plan.k_splits;
  }
  const int total_steps = static_cast<int>(w0.cols / 32);
  const bool grouped = w0.group_size != w0.cols;
  int steps_per_split = (total_steps + k_splits - 1) / std::min(k_splits, total_steps);
  if (grouped) steps_per_split = (steps_per_split + 3) / 4 * 4;  // slices start at multiples of 4 steps (128 inputs)
  k_splits = (total_steps + steps_per_split - 1) / steps_per_split;

  TmaMaps maps{};
  int tiles = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const DeviceGptqMatrix& w = *members[i].w;
    PETREL_RETURN_IF_ERROR(encode_int32_tensor_map_2d(maps.map[i], w.qweight, w.rows, w.cols / 8, kRowsPerWarp, kStageWords,
                                                      CU_TENSOR_MAP_SWIZZLE_128B, "gemv_gptq_tma"));
    args.parts[i] = {members[i].y, w.scales, w.qzeros, w.rows, tiles, w.zero_offset, w.uniform_zero};
    tiles += static_cast<int>((w.rows + kRows - 1) / kRows);
  }
  args.n_parts = static_cast<int>(members.size());
  args.x = x;
  args.cols = w0.cols;
  args.norm_weight = fusion.norm_weight.data;
  args.norm_type = norm_type;
  args.norm_eps = fusion.norm_eps;
  args.up = fusion.up;
  args.steps_per_split = steps_per_split;
  args.total_steps = total_steps;
  args.group_steps = grouped ? static_cast<int>(w0.group_size / 32) : 0;
  args.stages = options.stages;
  args.late_dependents = options.late_dependents ? 1 : 0;
  args.tag = w0.qweight;
  const TimelineRing* timeline = active_timeline();
  if (timeline) args.timeline = *timeline;
  args.prewait_stages = options.prewait_stages < 0 ? options.stages : std::min(options.prewait_stages, options.stages);
  const size_t shared = tma_shared_layout(options.stages, steps_per_split, norm ? weight_type_bytes(norm_type) : 0).bytes;
  auto pick = [&](auto grouped_build, auto timeline_build) {
    constexpr bool kGrouped = decltype(grouped_build)::value, kTimeline = decltype(timeline_build)::value;
    return norm                                  ? gemv_tma_kernel<GemvInput::kRmsNorm, kGrouped, kTimeline>
           : fusion.input == GemvInput::kSiluMul ? gemv_tma_kernel<GemvInput::kSiluMul, kGrouped, kTimeline>
                                                 : gemv_tma_kernel<GemvInput::kPlain, kGrouped, kTimeline>;
  };
  // The diagnostic twin (timeline.h) while a timeline is installed; the product's kernels carry none of it.
  auto pick_timeline = [&](auto grouped_build) {
    return timeline ? pick(grouped_build, std::true_type{}) : pick(grouped_build, std::false_type{});
  };
  auto kernel = grouped ? pick_timeline(std::true_type{}) : pick_timeline(std::false_type{});
  PETREL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
                              "gemv_gptq_tma: " + std::to_string(shared) + " bytes of shared memory");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(k_splits));
  PETREL_CUDA_RETURN_IF_ERROR(launch_kernel(kernel, grid, dim3(kThreads), shared, stream, options.overlap_previous, maps, args),
                              "gemv_gptq_tma: launch");
  return ok_status();
}

Status gemv_gptq_tma(const DeviceGptqMatrix& w, const float* x, float* y, int multiprocessors, Stream stream,
                     const GemvTmaOptions& options) {
  const GemvGroupMember member{&w, y};
  return gemv_gptq_tma_grouped({&member, 1}, x, multiprocessors, stream, options);
}

}  // namespace petrel::cuda
