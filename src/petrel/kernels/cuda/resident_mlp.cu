// kernels/cuda: the decode step's MLP in one launch (resident_mlp.h says why).
//
// Work: G = SMs x blocks_per_sm blocks of 4 warps, all resident. Phase A is gate/up: its row tiles of 128 rows
// (gate's, then up's) times hidden / 256 stages each, numbered tile-major; block b takes the run [b NA / G,
// (b + 1) NA / G) of those NA tile-stages. Phase B is down the same way (NB = its tiles x intermediate / 256).
// Warp w of a block computes rows 32 w .. 32 w + 31 of each tile its run touches. A run may cross a tile: the
// warp adds its sums into the output (float4 atomics, as gemv_tma) at every tile change and at the end.
//
// Weights: each warp's ring of `stages` 4 KB stages (gemv_tma.cu's stage: 32 rows x 8 steps of qweight, one
// tensor copy with the 128-byte swizzle) is filled from one sequence, the block's A stages then its B stages;
// lane 0 refills a slot as soon as its words are in registers, so the B stages are in flight while the block
// waits at the barrier between the phases. The first `stages` go out before the wait for the previous kernel.
//
// Inputs: A's input, RMSNorm(residual) * norm weight, is staged whole by every block (hidden / 8 fp16 words of 8
// inputs, the sum of squares read from the same loads, held in registers: hidden <= 4096). B's input, SiLU(gate) *
// up, is staged for the block's B stages only (256 inputs each), after the barrier: a counter every block adds 1
// to after its A sums (with a fence), which every block with B work waits to see at G. The last block to leave
// resets both counters, so each launch finds them at zero (the next launch reads them only after its wait).
//
// Arithmetic as gemv_tma's per-channel build: per stage 8 mma steps, then the partial sums promoted with the rows'
// scales. Rows' scales and zeros of the next tile are loaded while the current one runs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/bulk_copy.cuh"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gemv_tma.h"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/programmatic_launch.cuh"
#include "petrel/kernels/cuda/resident_mlp.h"

namespace petrel::cuda {

namespace {

using namespace ptx;

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 32;
constexpr int kRows = kWarps * kRowsPerWarp;
constexpr int kWordsPerStep = 4;
constexpr int kStageSteps = 8;
constexpr int kStageWords = kStageSteps * kWordsPerStep;
constexpr int kStageBytes = kStageWords * kRowsPerWarp * 4;  // 4 KB
constexpr int kStageInputs = kStageWords * 8;                // 256
constexpr int kSwizzleAlign = 1024;
constexpr int kMaxHidden = 4096;
constexpr int kMaxPairs = kMaxHidden / 8 / kThreads;  // 8-input words of A's input a thread stages

struct MlpPart {
  float* y;
  const uint16_t* scales;
  const int32_t* qzeros;
  int64_t rows;
  int zero_offset;
};

struct MlpArgs {
  MlpPart part[3];  // gate, up, down
  int gate_tiles;   // A's tiles: gate's [0, gate_tiles), then up's
  int a_tiles, a_stages;  // A: tiles, stages a tile (hidden / 256)
  int b_tiles, b_stages;  // B: tiles, stages a tile (intermediate / 256)
  int b_max_run;          // the longest B run of a block (stages): x_b's size
  int hidden;
  float* residual;
  const float* gate_out;
  const float* up_out;
  const void* norm_weight;
  WeightType norm_type;
  float norm_eps;
  float* clear[3];
  int64_t clear_vectors[3];
  uint32_t* counters;
  int stages;
};

struct MlpMaps {
  CUtensorMap map[3];  // gate, up, down qweight as [words, rows] int32, boxes of 32 x 32
};

struct MlpLayout {
  size_t rings, x_a, x_b, bars, bytes;
};
__host__ __device__ inline MlpLayout mlp_layout(int stages, int hidden, int b_max_run) {
  MlpLayout l;
  l.rings = 0;
  l.x_a = size_t{kWarps} * stages * kStageBytes;
  l.x_b = l.x_a + static_cast<size_t>(hidden) / 8 * 16;
  l.bars = l.x_b + static_cast<size_t>(b_max_run) * kStageInputs * 2;
  l.bytes = l.bars + size_t{kWarps} * stages * 8 + kSwizzleAlign;
  return l;
}

// This thread's 16 bytes of each of a landed stage's 8 steps (gemv_tma.cu's swizzled layout).
__device__ __forceinline__ void read_stage(const uint8_t* stage, int quad_row, int quad_col, uint4 (&w)[kStageSteps]) {
#pragma unroll
  for (int j = 0; j < kStageSteps; ++j) {
    const int r = j * kWordsPerStep + quad_col;
    w[j] = *reinterpret_cast<const uint4*>(stage + r * 128 + ((quad_row ^ (r % 8)) << 4));
  }
}

__device__ __forceinline__ float4 widen4_global(const void* data, WeightType type, int64_t j) {
  if (type == WeightType::kF32) return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(data) + j));
  const uint2 bits = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(data) + j));
  if (type == WeightType::kF16) {
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&bits.x)),
                 hi = __half22float2(*reinterpret_cast<const __half2*>(&bits.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xFFFF0000u), __uint_as_float(bits.y << 16),
                     __uint_as_float(bits.y & 0xFFFF0000u));
}

__device__ __forceinline__ uint4 pack8(float4 lo, float4 hi) {
  return make_uint4(pack_half2(lo.x, hi.x), pack_half2(lo.y, hi.y), pack_half2(lo.z, hi.z), pack_half2(lo.w, hi.w));
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Where flat stage k of a block lies: its key (A tile t -> t, B tile t -> a_tiles + t), stage within the tile.
struct StagePlace {
  int key, stage;
};

__global__ void __launch_bounds__(kThreads) resident_mlp_kernel(const __grid_constant__ MlpMaps maps, const MlpArgs a) {
  allow_dependent_launch();  // every block has started once the next kernel's blocks may: all of them are resident
  extern __shared__ uint8_t shared_raw[];
  uint8_t* const base = shared_raw + (kSwizzleAlign - shared_address(shared_raw) % kSwizzleAlign) % kSwizzleAlign;
  const MlpLayout layout = mlp_layout(a.stages, a.hidden, a.b_max_run);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  uint8_t* const ring = base + layout.rings + warp * a.stages * kStageBytes;
  uint4* const x_a = reinterpret_cast<uint4*>(base + layout.x_a);
  uint4* const x_b = reinterpret_cast<uint4*>(base + layout.x_b);
  uint64_t* const bars = reinterpret_cast<uint64_t*>(base + layout.bars) + warp * a.stages;

  const int grid = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int na_total = a.a_tiles * a.a_stages, nb_total = a.b_tiles * a.b_stages;  // < 2^31 (checked on the host)
  const int lo_a = static_cast<int>(int64_t{b} * na_total / grid), lo_b = static_cast<int>(int64_t{b} * nb_total / grid);
  const int na = static_cast<int>(int64_t{b + 1} * na_total / grid) - lo_a;
  const int nb = static_cast<int>(int64_t{b + 1} * nb_total / grid) - lo_b;
  const int total = na + nb;
  auto place = [&](int k) -> StagePlace {
    if (k < na) return {(lo_a + k) / a.a_stages, (lo_a + k) % a.a_stages};
    const int i = lo_b + (k - na);
    return {a.a_tiles + i / a.b_stages, i % a.b_stages};
  };
  // A key's member and first row of this warp.
  auto member_of = [&](int key, int& m, int& row0) {
    if (key < a.gate_tiles) {
      m = 0;
      row0 = key * kRows;
    } else if (key < a.a_tiles) {
      m = 1;
      row0 = (key - a.gate_tiles) * kRows;
    } else {
      m = 2;
      row0 = (key - a.a_tiles) * kRows;
    }
    row0 += warp * kRowsPerWarp;
  };
  auto refill = [&](int k) {  // lane 0: flat stage k into its slot
    const StagePlace p = place(k);
    int m, row0;
    member_of(p.key, m, row0);
    uint64_t* bar = bars + k % a.stages;
    mbarrier_arrive_expect_tx(bar, kStageBytes);
    tensor_copy_to_shared(ring + (k % a.stages) * kStageBytes, &maps.map[m], row0, p.stage * kStageWords, bar);
  };
  // The first stage of the run after the one flat stage k is in (total if none).
  auto next_run_start = [&](int k) {
    const StagePlace p = place(k);
    const int per_tile = k < na ? a.a_stages : a.b_stages;
    const int end = k < na ? na : total;
    return min(end, k + (per_tile - p.stage));
  };
  // This thread's rows' raw scales and zeros for the run holding flat stage k.
  auto load_params = [&](int k, uint2& scales, uint32_t& zeros, bool& row_ok, int64_t& row, int& m) {
    int row0;
    member_of(place(k).key, m, row0);
    const MlpPart& part = a.part[m];
    row = row0 + 4 * quad_row;
    row_ok = row < part.rows;
    load_raw_params(part.scales + row, part.qzeros + row / 8, row_ok, scales, zeros);
  };

  if (lane == 0) {
    for (int i = 0; i < a.stages; ++i) mbarrier_init(bars + i, 1);
    fence_barrier_init();
    for (int k = 0; k < min(a.stages, total); ++k) refill(k);
  }
  uint2 next_scales = make_uint2(0, 0);
  uint32_t next_zeros = 0;
  bool next_ok = false;
  int64_t next_row = 0;
  int next_m = 0;
  if (total > 0) load_params(0, next_scales, next_zeros, next_ok, next_row, next_m);

  wait_for_previous_kernel();
  // The clears (outputs of later products, last read by earlier ones).
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = int64_t{b} * kThreads + threadIdx.x; i < a.clear_vectors[c]; i += int64_t{grid} * kThreads) {
      __stcg(reinterpret_cast<float4*>(a.clear[c]) + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
  }
  // A's input: RMSNorm of the residual, all of it (8-input words w = threadIdx.x + 128 j).
  {
    const float4* x4 = reinterpret_cast<const float4*>(a.residual);
    const int words = a.hidden / 8;
    float4 lo[kMaxPairs], hi[kMaxPairs];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
      const int w = threadIdx.x + kThreads * j;
      lo[j] = hi[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (w < words) {
        lo[j] = __ldcg(x4 + 2 * w);
        hi[j] = __ldcg(x4 + 2 * w + 1);
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
      sum = fmaf(lo[j].x, lo[j].x, sum);
      sum = fmaf(lo[j].y, lo[j].y, sum);
      sum = fmaf(lo[j].z, lo[j].z, sum);
      sum = fmaf(lo[j].w, lo[j].w, sum);
      sum = fmaf(hi[j].x, hi[j].x, sum);
      sum = fmaf(hi[j].y, hi[j].y, sum);
      sum = fmaf(hi[j].z, hi[j].z, sum);
      sum = fmaf(hi[j].w, hi[j].w, sum);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    __shared__ float warp_sums[kWarps];
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    float all = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) all += warp_sums[k];
    const float inv_rms = 1.0f / sqrtf(all / static_cast<float>(a.hidden) + a.norm_eps);
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
      const int w = threadIdx.x + kThreads * j;
      if (w < words) {
        const float4 g0 = widen4_global(a.norm_weight, a.norm_type, 8 * w), g1 = widen4_global(a.norm_weight, a.norm_type, 8 * w + 4);
        const float4 l = lo[j], h = hi[j];
        x_a[w] = pack8(make_float4(g0.x * (l.x * inv_rms), g0.y * (l.y * inv_rms), g0.z * (l.z * inv_rms), g0.w * (l.w * inv_rms)),
                       make_float4(g1.x * (h.x * inv_rms), g1.y * (h.y * inv_rms), g1.z * (h.z * inv_rms), g1.w * (h.w * inv_rms)));
      }
    }
  }
  __syncthreads();

  float acc01[4] = {0, 0, 0, 0}, acc23[4] = {0, 0, 0, 0}, total4[4] = {0, 0, 0, 0};
  float scale[4] = {0, 0, 0, 0};
  uint32_t bias_low[4] = {0, 0, 0, 0}, bias_high[4] = {0, 0, 0, 0};
  bool row_ok = false;
  int64_t row = 0;
  int m = 0;
  int run_end = 0;      // the flat stage where the current run ends
  int run_offset = 0;   // the current run's stage within its tile minus its first flat stage
  auto flush = [&] {
    if (quad_col == 0 && row_ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(a.part[m].y + row), make_float4(total4[0], total4[1], total4[2], total4[3]));
#else
      for (int r = 0; r < 4; ++r) atomicAdd(a.part[m].y + row + r, total4[r]);
#endif
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) total4[r] = 0.0f;
  };
  // Between the phases: every block's A sums added (counter 0 at G), then B's input staged.
  auto phase_barrier = [&] {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicAdd(a.counters, 1u);
      if (nb > 0) {
        const long long start = clock64();
        while (load_acquire(a.counters) < static_cast<uint32_t>(grid)) {
          __nanosleep(64);  // G threads polling one line: leave the arrivals' atomics room
          if (clock64() - start > (10LL << 30)) {  // ~5 s: a block that never came (not all resident)
            printf("resident_mlp: block %d waited ~5 s for the gate/up sums of %d blocks\n", b, grid);
            __trap();
          }
        }
      }
    }
    __syncthreads();
    if (nb > 0) {
      const float4* g4 = reinterpret_cast<const float4*>(a.gate_out);
      const float4* u4 = reinterpret_cast<const float4*>(a.up_out);
      for (int i = threadIdx.x; i < nb * (kStageInputs / 8); i += kThreads) {
        const int k = i / (kStageInputs / 8), word = i % (kStageInputs / 8);
        const int64_t first = int64_t{place(na + k).stage} * kStageInputs + 8 * word;
        x_b[i] = pack8(silu_mul4(__ldcg(g4 + first / 4), __ldcg(u4 + first / 4)),
                       silu_mul4(__ldcg(g4 + first / 4 + 1), __ldcg(u4 + first / 4 + 1)));
      }
    }
    __syncthreads();
  };

  if (na == 0) phase_barrier();
  for (int k = 0; k < total; ++k) {
    if (k == run_end) {  // a new run: its rows' parameters (loaded a run ahead), the next run's asked for
      if (k > 0) flush();
      if (k == na && k > 0) phase_barrier();
      m = next_m;
      row = next_row;
      row_ok = next_ok;
      const uint2 raw_scales = next_scales;
      zero_biases<4>(next_zeros >> (4 * static_cast<int>(row % 8)), zero_bias_bases(a.part[m].zero_offset), bias_low, bias_high);
      decode_scales(raw_scales, scale);
      run_end = next_run_start(k);
      run_offset = place(k).stage - k;
      if (run_end < total) load_params(run_end, next_scales, next_zeros, next_ok, next_row, next_m);
    }
    const int slot = k % a.stages;
    mbarrier_wait(bars + slot, static_cast<uint32_t>(k / a.stages) & 1u);
    uint4 w[kStageSteps];
    read_stage(ring + slot * kStageBytes, quad_row, quad_col, w);
    __syncwarp();
    if (lane == 0 && k + a.stages < total) {
      fence_proxy_async_shared();
      refill(k + a.stages);
    }
    const uint4* xs = k < na ? x_a + (run_offset + k) * kStageWords : x_b + (k - na) * kStageWords;
#pragma unroll
    for (int j = 0; j < kStageSteps; ++j) mma_step4(acc01, acc23, w[j], xs[j * kWordsPerStep + quad_col], bias_low, bias_high);
    promote4(total4, scale, acc01, acc23);
  }
  if (total > 0) flush();
  if (nb == 0 && na > 0) phase_barrier();  // its arrival still counts
  // The last block out resets the counters for the next launch.
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(a.counters + 1, 1u) == static_cast<uint32_t>(grid - 1)) {
    a.counters[0] = 0;
    a.counters[1] = 0;
    __threadfence();
  }
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

Status resident_mlp_supports(const DeviceGptqMatrix& gate, const DeviceGptqMatrix& up, const DeviceGptqMatrix& down) {
  for (const DeviceGptqMatrix* w : {&gate, &up, &down}) {
    PETREL_RETURN_IF_ERROR(gemv_gptq_tma_supports(*w));
    if (w->group_size != w->cols) return unsupported("resident_mlp: per-channel weights only");
  }
  if (gate.rows != up.rows || gate.cols != up.cols || down.cols != gate.rows || down.rows != gate.cols) {
    return invalid_argument("resident_mlp: gate and up must be [intermediate, hidden] and down [hidden, intermediate]");
  }
  if (gate.cols % kStageInputs != 0 || gate.cols > kMaxHidden || down.cols % kStageInputs != 0) {
    return unsupported("resident_mlp: hidden a multiple of 256 up to 4096 and intermediate a multiple of 256 only, got " +
                       std::to_string(gate.cols) + " and " + std::to_string(gate.rows));
  }
  return ok_status();
}

Status resident_mlp(const DeviceGptqMatrix& gate, const DeviceGptqMatrix& up, const DeviceGptqMatrix& down,
                    float* residual, const GemvFusion& norm, float* gate_out, float* up_out, uint32_t* counters,
                    int multiprocessors, Stream stream, const ResidentMlpOptions& options, GemvFusion::Clear clear_also) {
  PETREL_RETURN_IF_ERROR(resident_mlp_supports(gate, up, down));
  if (norm.input != GemvInput::kRmsNorm) return invalid_argument("resident_mlp: the input must be an RMSNorm");
  if (options.stages < 1 || options.stages > kMaxResidentMlpStages) {
    return invalid_argument("resident_mlp: stages must be 1 to " + std::to_string(kMaxResidentMlpStages));
  }
  for (const void* p : {static_cast<const void*>(residual), static_cast<const void*>(gate_out), static_cast<const void*>(up_out)}) {
    if (!p || address(p) % 16 != 0) return invalid_argument("resident_mlp: residual, gate_out and up_out must be 16-byte aligned");
  }
  if (!counters) return invalid_argument("resident_mlp: no counters");
  PETREL_ASSIGN_OR_RETURN(const WeightType norm_type, weight_type(norm.norm_weight.dtype, "resident_mlp: the norm weight"));
  if (norm.norm_weight.size != gate.cols || address(norm.norm_weight.data) % 16 != 0) {
    return invalid_argument("resident_mlp: the norm weight must have hidden elements and be 16-byte aligned");
  }
  int device = 0, major = 0;
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "resident_mlp: cudaGetDevice");
  PETREL_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                              "resident_mlp: compute capability");
  if (major < 9) return unsupported("resident_mlp: needs tensor copies (compute capability 9.0 or later)");

  MlpArgs args{};
  MlpMaps maps{};
  const DeviceGptqMatrix* w[3] = {&gate, &up, &down};
  float* y[3] = {gate_out, up_out, residual};
  for (int i = 0; i < 3; ++i) {
    PETREL_RETURN_IF_ERROR(encode_int32_tensor_map_2d(maps.map[i], w[i]->qweight, w[i]->rows, w[i]->cols / 8, kRowsPerWarp,
                                                      kStageWords, CU_TENSOR_MAP_SWIZZLE_128B, "resident_mlp"));
    args.part[i] = {y[i], w[i]->scales, w[i]->qzeros, w[i]->rows, w[i]->zero_offset};
  }
  args.gate_tiles = static_cast<int>((gate.rows + kRows - 1) / kRows);
  args.a_tiles = 2 * args.gate_tiles;
  args.a_stages = static_cast<int>(gate.cols / kStageInputs);
  args.b_tiles = static_cast<int>((down.rows + kRows - 1) / kRows);
  args.b_stages = static_cast<int>(down.cols / kStageInputs);
  args.hidden = static_cast<int>(gate.cols);
  args.residual = residual;
  args.gate_out = gate_out;
  args.up_out = up_out;
  args.norm_weight = norm.norm_weight.data;
  args.norm_type = norm_type;
  args.norm_eps = norm.norm_eps;
  const GemvFusion::Clear clears[3] = {norm.clear[0], norm.clear[1], clear_also};
  for (int k = 0; k < 3; ++k) {
    if (clears[k].count % 4 != 0 || address(clears[k].data) % 16 != 0) {
      return invalid_argument("resident_mlp: a vector to clear must be 16-byte aligned and a multiple of 4 floats");
    }
    args.clear[k] = clears[k].data;
    args.clear_vectors[k] = clears[k].data ? clears[k].count / 4 : 0;
  }
  args.counters = counters;
  args.stages = options.stages;

  // Blocks: as many an SM as fit (at most options.blocks_per_sm) in the shared memory of the launch's carveout (the
  // thread's overlapped-launch carveout, device.h, else all of it), each resident at once: the barrier between the
  // phases waits for every block, so a block that cannot start would hang the launch (it traps after ~5 s).
  if (int64_t{args.a_tiles} * args.a_stages >= (int64_t{1} << 31) || int64_t{args.b_tiles} * args.b_stages >= (int64_t{1} << 31)) {
    return invalid_argument("resident_mlp: too large");
  }
  int per_sm = 0, reserved = 0;
  PETREL_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
                              "resident_mlp: shared memory per SM");
  PETREL_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device),
                              "resident_mlp: reserved shared memory");
  const int carveout = options.overlap_previous && overlapped_launch_carveout() >= 0 ? overlapped_launch_carveout() : 100;
  // The carveouts an SM can be set to (KB; Hopper): the largest within the asked percentage.
  int64_t budget = 0;
  for (const int kb : {0, 8, 16, 32, 64, 100, 132, 164, 196, 228}) {
    if (int64_t{kb} * 1024 * 100 <= int64_t{per_sm} * carveout) budget = int64_t{kb} * 1024;
  }
  budget = std::min<int64_t>(budget, per_sm);
  PETREL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(resident_mlp_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
                              "resident_mlp: carveout");
  int blocks_per_sm = std::max(1, options.blocks_per_sm);
  const int64_t nb_total = int64_t{args.b_tiles} * args.b_stages;
  size_t shared = 0;
  for (;; --blocks_per_sm) {
    if (blocks_per_sm == 0) {
      return unsupported("resident_mlp: a block (" + std::to_string(shared) + " bytes of shared memory) does not fit an SM at a " +
                         std::to_string(carveout) + "% carveout");
    }
    const int64_t grid = int64_t{multiprocessors} * blocks_per_sm;
    args.b_max_run = static_cast<int>((nb_total + grid - 1) / grid);
    shared = mlp_layout(options.stages, args.hidden, args.b_max_run).bytes;
    if (int64_t{blocks_per_sm} * static_cast<int64_t>(shared + reserved) > budget) continue;
    PETREL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(resident_mlp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(shared)),
                                "resident_mlp: " + std::to_string(shared) + " bytes of shared memory");
    int fit = 0;
    PETREL_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, resident_mlp_kernel, kThreads, shared),
                                "resident_mlp: occupancy");
    if (fit >= blocks_per_sm) break;
  }
  const dim3 grid(static_cast<unsigned>(multiprocessors * blocks_per_sm));
  PETREL_CUDA_RETURN_IF_ERROR(launch_kernel(resident_mlp_kernel, grid, dim3(kThreads), shared, stream, options.overlap_previous, maps, args),
                              "resident_mlp: launch");
  return ok_status();
}

}  // namespace petrel::cuda
