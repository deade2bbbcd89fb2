// kernels/cuda: the token generator's chain of GEMVs between two attention calls (o, gate/up, down, the next
// layer's q/k/v) as ONE launch of resident blocks. Host API and guarantees in resident_gemv.h; the plan and
// the measurements that led here in docs/RESIDENT_STEP.md.
//
// Why. The fused step launches one kernel per product; each call pays a fixed ~6.6 to ~9 us (launch, the first
// loads' latency, the split-K tail) besides its bytes, and the products of a layer are only 2 to 7 us of
// transfer each (gemv_gptq.cu). Here the grid (4 blocks of 128 threads per SM, all resident) takes the chain's
// work units in one global order and never stops streaming: while a block waits for the product before (its
// input), its ring keeps filling with the next weights, which depend on nothing.
//
// Work. A unit is one row tile (128 output rows of one member matrix) times one input slice of one product,
// exactly gemv_gptq's blocks under plan_gemv_gptq_grouped's plan; the chain's units are numbered product by
// product (slices outermost by default: ResidentGemvOptions::slices_outermost) and each block takes the next
// unhanded unit (an atomic counter) whenever its ring needs one, so units are taken in the global order and
// only by blocks that run.
//
// Weights. Warp 0 keeps kStages stages requested ahead of the one being computed, across units and products:
// a stage is up to 4 steps (16 packed words) of a unit's 128-row tile, one tensor copy (cp.async.bulk.tensor.2d,
// a box of 16 words x 128 rows = 8 KB of qweight seen as a [words, rows] int32 tensor; rows past the matrix
// read as zeros) completing on the stage's mbarrier. One copy per stage matters: the probe streams 8 KB copies
// at 93% of the copy bandwidth with the GEMV's arithmetic, 2 KB copies at 82%, and the 16 one-dimensional 512-byte
// copies (a packed word's run) of this kernel's first version at 54% (bench/persistent_probe.cu, 2026-12-03).
// The box lands densely (512 bytes a word), so the 8 lanes of a 16-byte shared-load phase meet 4-way bank
// conflicts: shared memory has bandwidth to spare at 32 GB/s an SM. Scales and zeros are read from global
// memory, a group ahead, as gemv_gptq does.
//
// Arithmetic. Per stage, what gemv_gptq's compute_batch does with a batch of 4 steps it loaded into registers
// (the same fragment mapping, promotion schedule, group changes and epilogue), so every output has the same
// bits: x staged per unit as fp16 fragments, dequantization by the magic-number trick into mma.sync.m16n8k16,
// float32 sums promoted every 8 steps or group, split-K partials added by the last slice of a tile to arrive.
//
// Waits. A unit of product p > 0 first waits until every tile of product p - 1 is final (a counter per
// product, bumped by the block that finishes a tile): the RMSNorms need all of x, and down, whose slices read
// every gate/up tile, is not split finer yet. The first product waits for the previous kernel
// (griddepcontrol.wait; programmatic dependent launch). Deadlock freedom: units are taken in the global order
// by running blocks, each block computes its units in that order, and a unit only waits for units before it,
// so the earliest unfinished unit has been taken by a running block and its inputs are final: it runs. This
// holds whether or not every block of the grid is resident. (The first version dealt unit b + k G to block b
// and relied on all 4 x 132 blocks being resident at once: in the decode step, where attention kernels with
// another shared-memory configuration run beside the tails of these launches, a block could be left out
// and the grid hung on its tile.) The last block to leave resets the counters.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/bulk_copy.cuh"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/resident_gemv.h"

namespace petrel::cuda {

namespace {

using namespace ptx;

constexpr int kThreads = 128;
constexpr int kRows = 128;                 // rows of a tile: 4 warps x 32
constexpr int kWordsPerStep = 4;           // a warp step: 4 packed words of 32 rows
constexpr int kStageSteps = 4;             // gemv_gptq's batch
constexpr int kStageWords = kStageSteps * kWordsPerStep;
constexpr int kWordPitch = kRows * 4;      // bytes from one word's 128-row run to the next in a stage
constexpr int kStageBytes = kStageWords * kWordPitch;
constexpr int kStages = 5;                 // 40 KB a block: the probe's 5 x 8 KB streamed at 95% of copy
constexpr int kPromoteSteps = 8;           // as gemv_gptq.cu
constexpr int kMaxSliceWords = 256;        // staged x: 4 KB
constexpr int kMaxBlocksPerSm = 4;
constexpr int kBarrierBytes = 64;          // kStages mbarriers, padded
constexpr size_t kSharedBytes = size_t{kStages} * kStageBytes + kBarrierBytes + size_t{kMaxSliceWords} * 16;
static_assert(kThreads == kRows, "a thread per row in the split-K reduction");

struct Part {
  const int32_t* qweight;
  const int32_t* tiled;  // ResidentGemvOptions::tiled_copy: [row tiles][word stages][16 words][128 rows], or null
  const uint16_t* scales;
  const int32_t* qzeros;
  float* y;
  int64_t rows;
  int zero_offset;
  int first_tile;
};

struct Phase {
  Part parts[kMaxGemvGroupMembers];
  int n_parts;
  int input;  // GemvInput
  const float* x;
  const float* up;
  const void* norm_weight;
  WeightType norm_type;
  float norm_eps;
  const float* residual;
  float* partials;           // [k_splits, total_tiles * kRows]
  uint32_t* tile_counters;   // [total_tiles], zero between launches
  uint32_t* done;            // tiles of this product whose rows are final
  int64_t cols;
  int group_steps;  // 2^30 per channel
  int k_splits;
  int steps_per_split;
  int total_steps;
  int total_tiles;
  int first_unit;
  int slices_outermost;  // ResidentGemvOptions::slices_outermost
  int word_stages;       // stages of 16 words in a tile of the tiled copy: ceil(cols / 8 / 16)
};

struct ChainArgs {
  CUtensorMap maps[kMaxResidentPhases][kMaxGemvGroupMembers];  // each member's qweight as [words, rows] int32
  Phase phases[kMaxResidentPhases];
  int n_phases;
  int total_units;
  uint32_t* next_unit;     // units handed out so far (a block takes the next one when its ring needs it)
  uint32_t* exit_counter;
  int probe;  // ResidentGemvChains::Probe bits (benchmark only)
};

// One unit: row tile `tile` (of member `part`, rows row0 ..) times input slice `split` (words first_word ..,
// `steps` steps). Block-uniform.
struct Unit {
  int phase, tile, split, part;
  int64_t row0;
  int first_word, steps;
};

__device__ __forceinline__ Unit unit_at(const ChainArgs& a, int g) {
  Unit u;
  u.phase = 0;
#pragma unroll
  for (int i = 1; i < kMaxResidentPhases; ++i) {
    if (i < a.n_phases && g >= a.phases[i].first_unit) u.phase = i;
  }
  const Phase& ph = a.phases[u.phase];
  const int local = g - ph.first_unit;
  u.tile = ph.slices_outermost ? local % ph.total_tiles : local / ph.k_splits;
  u.split = ph.slices_outermost ? local / ph.total_tiles : local % ph.k_splits;
  u.part = 0;
#pragma unroll
  for (int i = 1; i < kMaxGemvGroupMembers; ++i) {
    if (i < ph.n_parts && u.tile >= ph.parts[i].first_tile) u.part = i;
  }
  u.row0 = int64_t{u.tile - ph.parts[u.part].first_tile} * kRows;
  const int first_step = u.split * ph.steps_per_split;
  u.first_word = first_step * kWordsPerStep;
  u.steps = min(ph.steps_per_split, ph.total_steps - first_step);
  return u;
}

__device__ __forceinline__ unsigned load_acquire(const uint32_t* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A wait that has not ended after kWaitLimitCycles (~5 s) is a bug (a broken residency or counting
// assumption): the block says what it waited for and traps, so the launch fails instead of hanging.
constexpr long long kWaitLimitCycles = 10'000'000'000LL;

__device__ __noinline__ void report_stuck(const char* what, int a, int b, int c) {
  printf("resident_gemv: block %d stuck waiting for %s (%d, %d, %d)\n", static_cast<int>(blockIdx.x), what, a, b, c);
  __trap();
}

// mbarrier_wait with the limit above.
__device__ __forceinline__ void wait_stage(uint64_t* bar, uint32_t parity, int64_t stage) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const long long start = clock64();
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
    if (done) return;
    if (clock64() - start > kWaitLimitCycles) report_stuck("a ring stage", static_cast<int>(stage), static_cast<int>(parity), 0);
  }
#endif
}

constexpr int kQueue = 8;  // units a block may hold: the one computed and those of the kStages stages ahead

// Warp 0's state: unit g (of the block's, -1 when there are no more; u is unit_at(g), computed once a unit, not
// once a stage: warp 0's refill is on every stage's critical path), its stage `stage` is the next to request,
// into ring slot `slot`.
struct Requests {
  int g, stage;
  int slot;
  int taken;  // units taken, the last in queue[(taken - 1) % kQueue]
  Unit u;
};

// Warp 0: takes the chain's next unit (in the global order) for this block and queues it for the consumers;
// -1 when every unit is taken.
__device__ __forceinline__ void take_unit(const ChainArgs& a, Requests& r, int* queue, int lane) {
  int g = 0;
  if (lane == 0) g = static_cast<int>(atomicAdd(a.next_unit, 1u));
  g = __shfl_sync(0xFFFFFFFFu, g, 0);
  r.g = g < a.total_units ? g : -1;
  r.stage = 0;
  if (r.g >= 0) r.u = unit_at(a, r.g);
  if (lane == 0) queue[r.taken % kQueue] = r.g;
  ++r.taken;
}

// Warp 0: asks the copy engine for the next stage into ring slot r.slot.
__device__ __forceinline__ void request_stage(const ChainArgs& a, Requests& r, uint8_t* ring, uint64_t* full, int* queue,
                                              int lane) {
  if (r.g < 0) return;
  const Unit& u = r.u;
  const int step0 = r.stage * kStageSteps;
  const int slot = r.slot;
  if (lane == 0) {
    // The whole box always lands (past the slice: words the consumers skip; past the matrix: zeros).
    mbarrier_arrive_expect_tx(full + slot, kStageBytes);
    const Phase& ph = a.phases[u.phase];
    const Part& m = ph.parts[u.part];
    if (m.tiled) {  // the stage is 8 KB in a row of the tiled copy (its first word is a multiple of 16)
      const int64_t stage =
          int64_t{u.tile - m.first_tile} * ph.word_stages + (u.first_word + step0 * kWordsPerStep) / kStageWords;
      bulk_copy_to_shared(ring + slot * kStageBytes, m.tiled + stage * (kStageBytes / 4), kStageBytes, full + slot);
    } else {
      tensor_copy_to_shared(ring + slot * kStageBytes, &a.maps[u.phase][u.part], static_cast<int>(u.row0),
                            u.first_word + step0 * kWordsPerStep, full + slot);
    }
  }
  r.slot = slot + 1 == kStages ? 0 : slot + 1;
  if (++r.stage * kStageSteps >= u.steps) take_unit(a, r, queue, lane);
}

// 1 / sqrt(mean(x^2) + eps) over the whole input, in gemv_gptq.cu's input_inv_rms order (same bits).
__device__ __forceinline__ float input_inv_rms(const Phase& ph) {
  const float4* x4 = reinterpret_cast<const float4*>(ph.x);
  const int64_t n4 = ph.cols / 4;
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
    const float4 v = __ldcg(x4 + i);
    sum = fmaf(v.x, v.x, sum);
    sum = fmaf(v.y, v.y, sum);
    sum = fmaf(v.z, v.z, sum);
    sum = fmaf(v.w, v.w, sum);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  __syncthreads();  // warp_sums of an earlier call have been read
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) total += warp_sums[k];
  return 1.0f / sqrtf(total / static_cast<float>(ph.cols) + ph.norm_eps);
}

// Elements 4 i .. 4 i + 3 of the product's input (gemv_gptq.cu's load_input4).
__device__ __forceinline__ float4 load_input4(const Phase& ph, int64_t i, float inv_rms) {
  if (ph.input == static_cast<int>(GemvInput::kRmsNorm)) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(ph.x) + i);
    const float w0 = load_widened(ph.norm_weight, ph.norm_type, 4 * i),
                w1 = load_widened(ph.norm_weight, ph.norm_type, 4 * i + 1),
                w2 = load_widened(ph.norm_weight, ph.norm_type, 4 * i + 2),
                w3 = load_widened(ph.norm_weight, ph.norm_type, 4 * i + 3);
    return make_float4(w0 * (v.x * inv_rms), w1 * (v.y * inv_rms), w2 * (v.z * inv_rms), w3 * (v.w * inv_rms));
  }
  if (ph.input == static_cast<int>(GemvInput::kSiluMul)) {
    return silu_mul4(__ldcg(reinterpret_cast<const float4*>(ph.x) + i), __ldcg(reinterpret_cast<const float4*>(ph.up) + i));
  }
  return __ldcg(reinterpret_cast<const float4*>(ph.x) + i);
}

// gemv_gptq.cu's last_to_arrive for a tile's counter.
__device__ __forceinline__ bool last_to_arrive(uint32_t* counter, int k_splits) {
  __shared__ bool is_last_block;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(counter, 1u);
    is_last_block = arrived == static_cast<uint32_t>(k_splits - 1);
    if (is_last_block) *counter = 0;
  }
  __syncthreads();
  if (!is_last_block) return false;
  __threadfence();
  return true;
}

__global__ void __launch_bounds__(kThreads, kMaxBlocksPerSm) resident_gemv_chain(const __grid_constant__ ChainArgs a) {
  extern __shared__ __align__(1024) uint8_t shared[];
  uint8_t* ring = shared;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * kStageBytes);
  uint4* x_staged = reinterpret_cast<uint4*>(shared + kStages * kStageBytes + kBarrierBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(full + s, 1);
    fence_barrier_init();
  }
  __syncthreads();
  allow_dependent_launch();
  // Units are taken in the global order as the ring needs them (not dealt out by block index): a block that
  // is not resident yet takes none, so no unit waits for a block that cannot run, whatever else shares the
  // SMs. Taking one touches the chain's counter, which the previous launch of the same chain may still use
  // (programmatic launches can overlap), so it waits for the previous kernel, which completes only after
  // every launch before it. Before that wait, the weights this block most likely takes first (unit
  // blockIdx.x: blocks tend to start in order) are asked into L2, which is all a wrong guess costs.
  if (warp == 0 && static_cast<int>(blockIdx.x) < a.total_units) {
    const Unit u = unit_at(a, static_cast<int>(blockIdx.x));
    const Phase& ph = a.phases[u.phase];
    const Part& m = ph.parts[u.part];
    if (m.tiled) {
      const int64_t stage = int64_t{u.tile - m.first_tile} * ph.word_stages + u.first_word / kStageWords;
      const int n = min((u.steps + kStageSteps - 1) / kStageSteps, kStages);
      if (lane < n) prefetch_l2(m.tiled + (stage + lane) * (kStageBytes / 4), kStageBytes);
    } else {
      const uint32_t run = static_cast<uint32_t>(min(int64_t{kRows}, m.rows - u.row0)) * 4;
      for (int i = lane; i < min(u.steps, kStages * kStageSteps) * kWordsPerStep; i += 32) {
        prefetch_l2(m.qweight + int64_t{u.first_word + i} * m.rows + u.row0, run);
      }
    }
  }
  wait_for_previous_kernel();
  __shared__ int queue[kQueue];
  Requests requests{-1, 0, 0, 0, Unit{}};
  if (warp == 0) {
    take_unit(a, requests, queue, lane);
    for (int s = 0; s < kStages; ++s) request_stage(a, requests, ring, full, queue, lane);
  }
  __syncthreads();  // the queue's first entries

  int current_phase = -1;
  float inv_rms = 1.0f;
  int64_t consumed = 0;
  // queue[k] was written before the block barrier that ended the stage kStages stages before unit k's first
  // (or the one above), and is rewritten kQueue units later.
  for (int k = 0;; ++k) {
    const int g = queue[k % kQueue];
    if (g < 0) break;
    const Unit u = unit_at(a, g);
    const Phase& ph = a.phases[u.phase];
    const Part& m = ph.parts[u.part];
    const int64_t row = u.row0 + warp * 32 + 4 * quad_row;
    const bool row_ok = row < m.rows;

    // This unit's first group's scales and zeros, and the next group's (gemv_gptq's start_tile_params).
    const int64_t first_step = u.first_word / kWordsPerStep;
    int steps_to_group = static_cast<int>(ph.group_steps - first_step % ph.group_steps);
    const int64_t zeros_stride = m.rows / 8;
    const int64_t group = first_step / ph.group_steps;
    const uint16_t* scales_at = m.scales + group * m.rows + row;
    const int32_t* zeros_at = m.qzeros + group * zeros_stride + row / 8;
    uint2 raw_scales, next_scales;
    uint32_t raw_zeros, next_zeros;
    const bool params = !(a.probe & ResidentGemvChains::kSkipParams);
    load_raw_params(scales_at, zeros_at, row_ok && params, raw_scales, raw_zeros);
    scales_at += m.rows;
    zeros_at += zeros_stride;
    load_raw_params(scales_at, zeros_at, row_ok && params && steps_to_group < u.steps, next_scales, next_zeros);

    if (u.phase != current_phase) {
      if (u.phase > 0 && !(a.probe & ResidentGemvChains::kSkipWaits)) {  // every tile of the product before is final
        const Phase& before = a.phases[u.phase - 1];
        if (threadIdx.x == 0) {
          const long long start = clock64();
          unsigned done = 0;
          while ((done = load_acquire(before.done)) < static_cast<unsigned>(before.total_tiles)) {
            if (clock64() - start > kWaitLimitCycles) report_stuck("a product", u.phase - 1, static_cast<int>(done), g);
          }
        }
        __syncthreads();
      }
      inv_rms = ph.input == static_cast<int>(GemvInput::kRmsNorm) ? input_inv_rms(ph) : 1.0f;
      current_phase = u.phase;
    }

    // x of this slice in fp16 fragment order (gemv_gptq.cu): 4-bit {x0,x4},{x1,x5},{x2,x6},{x3,x7} per word.
    for (int i = threadIdx.x; i < (a.probe & ResidentGemvChains::kSkipStaging ? 0 : u.steps * kWordsPerStep); i += kThreads) {
      const int64_t word = u.first_word + i;
      const float4 lo = load_input4(ph, 2 * word, inv_rms), hi = load_input4(ph, 2 * word + 1, inv_rms);
      x_staged[i] = make_uint4(pack_half2(lo.x, hi.x), pack_half2(lo.y, hi.y), pack_half2(lo.z, hi.z),
                               pack_half2(lo.w, hi.w));
    }
    __syncthreads();

    float acc01[4] = {0, 0, 0, 0}, acc23[4] = {0, 0, 0, 0}, total[4] = {0, 0, 0, 0};
    float scale[4] = {0, 0, 0, 0};
    uint32_t bias_low[4], bias_high[4];
    int steps_in_acc = 0;
    auto promote = [&] {
      promote4(total, scale, acc01, acc23);
      steps_in_acc = 0;
    };
    auto decode_params = [&] {
      zero_biases<4>(raw_zeros >> (4 * static_cast<int>(row % 8)), zero_bias_bases(m.zero_offset), bias_low, bias_high);
      decode_scales(raw_scales, scale);
    };
    decode_params();
    auto next_group = [&](int s) {
      promote();
      raw_scales = next_scales;
      raw_zeros = next_zeros;
      decode_params();
      steps_to_group = ph.group_steps;
      scales_at += m.rows;
      zeros_at += zeros_stride;
      load_raw_params(scales_at, zeros_at, row_ok && params && s + steps_to_group < u.steps, next_scales, next_zeros);
    };
    auto compute_step = [&](const uint4& w, int s) {
      mma_step4(acc01, acc23, w, x_staged[s * kWordsPerStep + quad_col], bias_low, bias_high);
    };

    // This lane's 16 bytes (rows row .. row + 3 of word quad_col of each step) in a stage. In the tiled copy the
    // 16-byte chunks of a word's run are swizzled (tile_qweight) so that the 8 lanes of a quarter warp, which
    // read 4 words x 2 row groups, meet 8 different bank groups instead of 2 (4 wavefronts a load, not 16).
    const int chunk = warp * 8 + quad_row;
    const int lane_offset = quad_col * kWordPitch + (m.tiled ? chunk ^ (2 * quad_col) : chunk) * 16;
    const int n_stages = (u.steps + kStageSteps - 1) / kStageSteps;
    for (int j = 0; j < n_stages; ++j, ++consumed) {
      const int slot = static_cast<int>(consumed % kStages);
      wait_stage(full + slot, static_cast<uint32_t>((consumed / kStages) & 1), consumed);
      const uint8_t* words = ring + slot * kStageBytes + lane_offset;
      // Unpredicated: a stage always lands whole (rows past the matrix as zeros, whose sums are never written;
      // steps past the slice are not computed), and predicates cost ~10 instructions a stage (ncu, session 12).
      uint4 batch[kStageSteps];
#pragma unroll
      for (int k = 0; k < kStageSteps; ++k) {
        batch[k] = *reinterpret_cast<const uint4*>(words + k * kWordsPerStep * kWordPitch);
      }
      // gemv_gptq.cu's compute_batch, for the batch of steps first .. first + 3.
      const int first = j * kStageSteps;
      if (a.probe & ResidentGemvChains::kSkipMath) {
        acc01[0] += __uint_as_float(batch[0].x ^ batch[1].y ^ batch[2].z ^ batch[3].w) * 0.0f;
      } else if (first + kStageSteps <= u.steps &&
          (steps_to_group >= kStageSteps || (steps_to_group == 0 && ph.group_steps >= kStageSteps))) {
        if (steps_to_group == 0) {
          next_group(first);
        } else if (steps_in_acc + kStageSteps > kPromoteSteps) {
          promote();
        }
        steps_to_group -= kStageSteps;
        steps_in_acc += kStageSteps;
#pragma unroll
        for (int k = 0; k < kStageSteps; ++k) compute_step(batch[k], first + k);
      } else {
#pragma unroll
        for (int k = 0; k < kStageSteps; ++k) {
          const int s = first + k;
          if (s >= u.steps) break;
          if (s > 0 && steps_to_group == 0) {
            next_group(s);
          } else if (steps_in_acc == kPromoteSteps) {
            promote();
          }
          --steps_to_group;
          ++steps_in_acc;
          compute_step(batch[k], s);
        }
      }
      __syncthreads();  // every thread has read the slot: the copy engine may refill it
      if (warp == 0) {
        fence_proxy_async_shared();
        request_stage(a, requests, ring, full, queue, lane);
      }
    }
    promote();

    if (a.probe & ResidentGemvChains::kSkipEpilogue) {  // nothing written, nothing counted (kSkipWaits with it)
      continue;
    }
    // gemv_gptq.cu's finish_rows (the L2 path), then, when this block made the tile final, the product's count.
    const float4 sums = make_float4(total[0], total[1], total[2], total[3]);
    const bool writer = row_ok && quad_col == 0;
    bool final_here = true;
    if (ph.k_splits == 1) {
      if (writer) {
        float4 out = sums;
        if (ph.residual) {
          const float4 r = __ldcg(reinterpret_cast<const float4*>(ph.residual + row));
          out = make_float4(r.x + sums.x, r.y + sums.y, r.z + sums.z, r.w + sums.w);
        }
        *reinterpret_cast<float4*>(m.y + row) = out;
      }
    } else {
      const int64_t slice_stride = int64_t{ph.total_tiles} * kRows;
      const int64_t slot = int64_t{u.tile} * kRows;
      if (writer) __stcg(reinterpret_cast<float4*>(ph.partials + u.split * slice_stride + slot + (row - u.row0)), sums);
      final_here = last_to_arrive(ph.tile_counters + u.tile, ph.k_splits);
      if (final_here) {
        const int64_t r = u.row0 + threadIdx.x;
        if (r < m.rows) {
          float sum = 0.0f;
          for (int s = 0; s < ph.k_splits; ++s) sum += __ldcg(ph.partials + s * slice_stride + slot + threadIdx.x);
          if (ph.residual) sum = __ldcg(ph.residual + r) + sum;
          m.y[r] = sum;
        }
      }
    }
    if (final_here) {
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(ph.done, 1u);
    }
  }

  // The last block out resets the products' counters for the next launch (which waits for this one).
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.exit_counter, 1u) == gridDim.x - 1) {
      for (int p = 0; p < a.n_phases; ++p) *a.phases[p].done = 0;
      *a.next_unit = 0;
      *a.exit_counter = 0;
      __threadfence();
    }
  }
}

// ResidentGemvOptions::tiled_copy: qweight [words, rows] -> [row tiles][word stages][16 words][128 rows], zeros
// past the matrix, with the 16-byte chunks (4 rows) of word w's run at chunk ^ (2 (w % 4)): the consumers'
// conflict-free order (resident_gemv_chain's lane_offset). One thread a destination word.
__global__ void tile_qweight(const int32_t* __restrict__ qweight, int64_t words, int64_t rows, int32_t* __restrict__ tiled,
                             int64_t total) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t word_stages = (words + kStageWords - 1) / kStageWords;
  const int64_t r = i % kRows, w_in = i / kRows % kStageWords, stage = i / (kRows * kStageWords) % word_stages,
                tile = i / (int64_t{kRows} * kStageWords * word_stages);
  const int64_t stored_chunk = r / 4, chunk = stored_chunk ^ (2 * (w_in % 4));
  const int64_t row = tile * kRows + chunk * 4 + r % 4, word = stage * kStageWords + w_in;
  tiled[i] = row < rows && word < words ? qweight[word * rows + row] : 0;
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// qweight [words, rows] int32 as the 2D tensor the stage copies read: boxes of 16 words x 128 rows.
Status encode_weight_map(const DeviceGptqMatrix& w, CUtensorMap& map) {
  return encode_int32_tensor_map_2d(map, w.qweight, w.rows, w.cols / 8, kRows, kStageWords, CU_TENSOR_MAP_SWIZZLE_NONE,
                                    "resident_gemv");
}

std::string describe(const ResidentGemv& gemv) {
  const DeviceGptqMatrix& w = *gemv.members[0].w;
  return std::to_string(gemv.members.size()) + (gemv.members.size() == 1 ? " matrix [" : " matrices, the first [") +
         std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]";
}

// The input slices of a product of `steps` steps under options.min_unit_steps (0: the GEMV planner's).
int resident_splits(int64_t steps, const ResidentGemvOptions& options) {
  if (options.min_unit_steps <= 0) return 0;
  int64_t splits = 1;
  while (steps / (2 * splits) >= options.min_unit_steps) splits *= 2;
  while ((steps + splits - 1) / splits * kWordsPerStep > kMaxSliceWords) splits *= 2;
  return static_cast<int>(splits);
}

// Checks one product and fills its device descriptor (all but the buffers, first_unit and first_tile).
Status describe_phase(const ResidentGemv& gemv, int multiprocessors, int64_t partial_capacity,
                      const ResidentGemvOptions& options, Phase& ph, GemvPlan& plan) {
  if (gemv.members.empty() || gemv.members.size() > static_cast<size_t>(kMaxGemvGroupMembers)) {
    return invalid_argument("resident_gemv: a product of " + std::to_string(gemv.members.size()) + " matrices (1 to " +
                            std::to_string(kMaxGemvGroupMembers) + ")");
  }
  for (const GemvGroupMember& m : gemv.members) {
    if (!m.w) return invalid_argument("resident_gemv: a member without a matrix");
  }
  const std::string what = "resident_gemv (" + describe(gemv) + ")";
  GemvOptions gemv_options;
  gemv_options.k_splits = resident_splits(gemv.members[0].w->cols / 8 / kWordsPerStep, options);
  PETREL_ASSIGN_OR_RETURN(plan, plan_gemv_gptq_grouped(gemv.members, multiprocessors, partial_capacity, gemv_options));
  const DeviceGptqMatrix& first = *gemv.members[0].w;
  if (first.bits != 4) return unsupported(what + ": only 4-bit weights");
  if (first.cols % 32 != 0) return unsupported(what + ": cols must be a multiple of 32");
  if (plan.steps_per_split * kWordsPerStep > kMaxSliceWords) {
    return unsupported(what + ": an input slice of " + std::to_string(plan.steps_per_split * kWordsPerStep) +
                       " packed words (at most " + std::to_string(kMaxSliceWords) + ")");
  }
  if (options.tiled_copy && plan.steps_per_split % kStageSteps != 0) {
    return unsupported(what + ": tiled_copy needs input slices of whole 16-word stages (" +
                       std::to_string(plan.steps_per_split * kWordsPerStep) + " words)");
  }
  if (!gemv.x || address(gemv.x) % 16 != 0) return invalid_argument(what + ": x must be a 16-byte aligned device pointer");
  const GemvFusion& f = gemv.fusion;
  if (f.residual && gemv.members.size() > 1) return invalid_argument(what + ": a residual needs a single matrix");
  if (f.residual && address(f.residual) % 16 != 0) return invalid_argument(what + ": residual must be 16-byte aligned");
  WeightType norm_type = WeightType::kF32;
  if (f.input == GemvInput::kRmsNorm) {
    PETREL_ASSIGN_OR_RETURN(norm_type, weight_type(f.norm_weight.dtype, "resident_gemv RMSNorm weight"));
    if (!f.norm_weight.data || f.norm_weight.size != first.cols) {
      return invalid_argument(what + ": the RMSNorm weight must have cols (" + std::to_string(first.cols) + ") elements");
    }
  }
  if (f.input == GemvInput::kSiluMul && (!f.up || address(f.up) % 16 != 0)) {
    return invalid_argument(what + ": SiLU*up needs a 16-byte aligned up vector");
  }
  ph = Phase{};
  int tile = 0;
  for (size_t i = 0; i < gemv.members.size(); ++i) {
    const DeviceGptqMatrix& w = *gemv.members[i].w;
    if (!w.qweight || !w.scales || !w.qzeros || !gemv.members[i].y) return invalid_argument(what + ": null device pointer");
    if ((address(w.qweight) | address(gemv.members[i].y)) % 16 != 0 || address(w.scales) % 8 != 0) {
      return invalid_argument(what + ": qweight and y must be 16-byte aligned and scales 8-byte aligned");
    }
    ph.parts[i] = Part{w.qweight, nullptr, w.scales, w.qzeros, gemv.members[i].y, w.rows, w.zero_offset, tile};
    tile += static_cast<int>((w.rows + kRows - 1) / kRows);
  }
  ph.n_parts = static_cast<int>(gemv.members.size());
  ph.input = static_cast<int>(f.input);
  ph.x = gemv.x;
  ph.up = f.up;
  ph.norm_weight = f.norm_weight.data;
  ph.norm_type = norm_type;
  ph.norm_eps = f.norm_eps;
  ph.residual = f.residual;
  ph.cols = first.cols;
  ph.group_steps = static_cast<int>(first.group_size == first.cols ? int64_t{1} << 30 : first.group_size / 8 / kWordsPerStep);
  ph.k_splits = plan.k_splits;
  ph.steps_per_split = static_cast<int>(plan.steps_per_split);
  ph.total_steps = static_cast<int>(first.cols / 8 / kWordsPerStep);
  ph.total_tiles = static_cast<int>(plan.row_tiles_total);
  ph.slices_outermost = options.slices_outermost ? 1 : 0;
  ph.word_stages = static_cast<int>((first.cols / 8 + kStageWords - 1) / kStageWords);
  return ok_status();
}

}  // namespace

Status resident_gemv_supports(std::span<const ResidentGemv> chain, int multiprocessors, int64_t partial_capacity,
                              const ResidentGemvOptions& options) {
  if (chain.empty() || chain.size() > static_cast<size_t>(kMaxResidentPhases)) {
    return invalid_argument("resident_gemv: a chain of " + std::to_string(chain.size()) + " products (1 to " +
                            std::to_string(kMaxResidentPhases) + ")");
  }
  for (const ResidentGemv& gemv : chain) {
    Phase ph;
    GemvPlan plan;
    PETREL_RETURN_IF_ERROR(describe_phase(gemv, multiprocessors, partial_capacity, options, ph, plan));
  }
  return ok_status();
}

struct ResidentGemvChains::Impl {
  std::vector<ChainArgs> chains;
  std::vector<int64_t> bytes;
  DeviceBuffer counters, partials;
  std::vector<DeviceBuffer> tiled;  // ResidentGemvOptions::tiled_copy
  int grid = 0;
};

ResidentGemvChains::ResidentGemvChains(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ResidentGemvChains::ResidentGemvChains() = default;
ResidentGemvChains::ResidentGemvChains(ResidentGemvChains&&) noexcept = default;
ResidentGemvChains& ResidentGemvChains::operator=(ResidentGemvChains&&) noexcept = default;
ResidentGemvChains::~ResidentGemvChains() = default;

Result<ResidentGemvChains> ResidentGemvChains::create(std::span<const std::vector<ResidentGemv>> chains,
                                                      int64_t partial_capacity, const ResidentGemvOptions& options) {
  PETREL_ASSIGN_OR_RETURN(int device, current_device());
  PETREL_ASSIGN_OR_RETURN(DeviceInfo info, device_info(device));
  if (info.compute_major < 9) {
    return unsupported("resident_gemv: needs the bulk copy engine of compute capability 9.0 or later (" + info.name +
                       " has " + std::to_string(info.compute_major) + "." + std::to_string(info.compute_minor) + ")");
  }
  auto impl = std::make_unique<Impl>();
  // Counters: per product its tiles' arrival counters and its done count; per chain an exit count. Partial
  // sums: one region per position in a chain, reused by every chain (chains run one after another).
  int64_t counter_words = 0;
  std::vector<int64_t> slot_floats(kMaxResidentPhases, 0);
  std::vector<std::vector<GemvPlan>> plans(chains.size());
  impl->chains.resize(chains.size());
  impl->bytes.assign(chains.size(), 0);
  for (size_t c = 0; c < chains.size(); ++c) {
    const std::vector<ResidentGemv>& chain = chains[c];
    if (chain.empty() || chain.size() > static_cast<size_t>(kMaxResidentPhases)) {
      return invalid_argument("resident_gemv: a chain of " + std::to_string(chain.size()) + " products (1 to " +
                              std::to_string(kMaxResidentPhases) + ")");
    }
    ChainArgs& args = impl->chains[c];
    args = ChainArgs{};
    args.n_phases = static_cast<int>(chain.size());
    plans[c].resize(chain.size());
    int units = 0;
    for (size_t p = 0; p < chain.size(); ++p) {
      Phase& ph = args.phases[p];
      PETREL_RETURN_IF_ERROR(describe_phase(chain[p], info.multiprocessors, partial_capacity, options, ph, plans[c][p]));
      for (size_t i = 0; i < chain[p].members.size(); ++i) {
        const DeviceGptqMatrix& w = *chain[p].members[i].w;
        PETREL_RETURN_IF_ERROR(encode_weight_map(w, args.maps[p][i]));
        if (options.tiled_copy) {
          const int64_t total = (w.rows + kRows - 1) / kRows * kRows * ph.word_stages * kStageWords;
          PETREL_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(static_cast<size_t>(total) * 4));
          tile_qweight<<<static_cast<unsigned>((total + 255) / 256), 256>>>(w.qweight, w.cols / 8, w.rows,
                                                                            buffer.as<int32_t>(), total);
          PETREL_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "resident_gemv tiled copy");
          ph.parts[i].tiled = buffer.as<int32_t>();
          impl->tiled.push_back(std::move(buffer));
        }
      }
      ph.first_unit = units;
      units += ph.total_tiles * ph.k_splits;
      counter_words += ph.total_tiles + 1;
      slot_floats[p] = std::max<int64_t>(slot_floats[p], int64_t{ph.k_splits} * ph.total_tiles * kRows);
      for (const GemvGroupMember& m : chain[p].members) impl->bytes[c] += m.w->weight_bytes();
    }
    args.total_units = units;
    counter_words += 2;
  }
  if (options.tiled_copy) PETREL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "resident_gemv tiled copies");
  PETREL_ASSIGN_OR_RETURN(impl->counters, DeviceBuffer::allocate(static_cast<size_t>(counter_words) * 4));
  PETREL_RETURN_IF_ERROR(impl->counters.fill_bytes(0));
  int64_t total_floats = 0;
  for (int64_t f : slot_floats) total_floats += f;
  PETREL_ASSIGN_OR_RETURN(impl->partials, DeviceBuffer::allocate(static_cast<size_t>(std::max<int64_t>(total_floats, 4)) * 4));
  uint32_t* counter = impl->counters.as<uint32_t>();
  for (ChainArgs& args : impl->chains) {
    float* partials = impl->partials.as<float>();
    for (int p = 0; p < args.n_phases; ++p) {
      Phase& ph = args.phases[p];
      ph.tile_counters = counter;
      counter += ph.total_tiles;
      ph.done = counter++;
      ph.partials = partials;
      partials += slot_floats[p];
    }
    args.next_unit = counter++;
    args.exit_counter = counter++;
  }
  // All shared memory to the blocks' rings wherever an SM is configured for this kernel.
  PETREL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(resident_gemv_chain, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   cudaSharedmemCarveoutMaxShared),
                              "resident_gemv shared-memory carveout");
  int per_sm = 0;
  PETREL_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, resident_gemv_chain, kThreads, kSharedBytes),
      "resident_gemv occupancy");
  if (per_sm < 1) return unsupported("resident_gemv: a block does not fit a multiprocessor");
  const int limit = options.max_blocks_per_sm > 0 ? std::min(options.max_blocks_per_sm, kMaxBlocksPerSm) : kMaxBlocksPerSm;
  impl->grid = info.multiprocessors * std::min(per_sm, limit);
  return ResidentGemvChains(std::move(impl));
}

int ResidentGemvChains::k_splits(int chain, int product) const {
  if (chain < 0 || chain >= size()) return 0;
  const ChainArgs& args = impl_->chains[static_cast<size_t>(chain)];
  return product >= 0 && product < args.n_phases ? args.phases[product].k_splits : 0;
}

void ResidentGemvChains::set_probe(int flags) {
  if (impl_) {
    for (ChainArgs& args : impl_->chains) args.probe = flags;
  }
}

int ResidentGemvChains::size() const { return impl_ ? static_cast<int>(impl_->chains.size()) : 0; }
int ResidentGemvChains::grid_blocks() const { return impl_ ? impl_->grid : 0; }
int64_t ResidentGemvChains::weight_bytes(int index) const {
  return impl_ && index >= 0 && index < size() ? impl_->bytes[static_cast<size_t>(index)] : 0;
}

Status ResidentGemvChains::enqueue(int index, Stream stream, bool overlap_previous) const {
  if (index < 0 || index >= size()) {
    return invalid_argument("resident_gemv: chain " + std::to_string(index) + " of " + std::to_string(size()));
  }
  return cuda_status(launch_kernel(resident_gemv_chain, dim3(static_cast<unsigned>(impl_->grid)), dim3(kThreads),
                                   kSharedBytes, stream, overlap_previous, impl_->chains[static_cast<size_t>(index)]),
                     "resident_gemv launch");
}

}  // namespace petrel::cuda
