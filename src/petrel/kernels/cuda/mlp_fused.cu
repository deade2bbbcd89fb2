// kernels/cuda: the token generator's MLP in one launch (mlp_fused.h): x += down(SiLU(gate(n)) * up(n)),
// n = RMSNorm(x), gate, up and down 4-bit GPTQ matrices in the layout gemv_gptq.cu reads (qweight [words, rows],
// consecutive rows consecutive words).
//
// Why one launch. In the fused step (cuda_model.cc) gate/up and down are two GEMV launches: down's blocks each
// need SiLU(gate) * up over a slice of 896 inputs, i.e. the finished sums of ~28 gate/up blocks, so down waits
// for the whole gate/up grid, stages its input from L2 and pays its own ramp and tail (the phase-skip probes,
// docs/PERFORMANCE.md session 19: gate/up and down cost ~31 us a layer of the step against ~21 us of bytes).
// Here block j owns intermediate elements 32 j .. 32 j + 31: it computes their gate and up rows over the whole
// input (no split, so no other block's sums are needed), forms the 32 values of SiLU(gate) * up itself, and
// multiplies them into down's 32 matching columns (4 packed words of each of down's rows: 64 KB at 4096 rows),
// adding each row's partial sum into x with a float4 atomic. Nothing waits for another block's results; the
// one cross-block rule is that no block may add into x before every block has read x for its RMSNorm (a
// counter every block passes after staging and waits on before its first add: in practice already full, since
// all blocks stage at the start and the first adds come ~20 us later). That wait needs the whole grid resident
// at once (448 blocks of 128 threads for Llama-3.1-8B, 4 an SM): decode_mlp_fused checks the occupancy.
//
// A block's work (128 threads, 4 warps; Llama-3.1-8B: 128 KB of gate/up and 64 KB of down weights):
//   - before the wait: the RMSNorm weights into shared memory (cp.async), the first two batches of 4 steps of
//     gate/up weights into registers, the first groups' scales and zeros;
//   - RMSNorm of x (every block over all of x, as gemv_gptq's kRmsNorm staging: same order of the sum of squares,
//     same expression), staged in fp16 fragment order for all hidden inputs;
//   - gate/up: warp w takes member w % 2 (gate, up) and input half w / 2, 32 rows (the block's slice), the
//     GEMV's fragment mapping, dequantization, promotion schedule and two batches of loads in flight: each warp's
//     sums are exactly one of the fused step's two gate/up input slices;
//   - down's first two batches of loads (weights, and each step's scales and zeros: a step is 32 new rows)
//     go out, then the 4 x 32 sums meet in shared memory: gate = half 0 + half 1 (the fused step's two slices
//     added into zeros give the same), SiLU * up in float32, rounded to fp16 fragments;
//   - down: warp w takes rows w hidden / 4 .. (w + 1) hidden / 4 in steps of 32 rows, each one mma pair of the
//     block's 4 words (32 inputs), scaled in float32 and added into x by the quad's first thread.
// The fused step's clears of q, k and v (its atomic outputs, gate/up's and down's GemvFusion::clear) are done
// here after the wait.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/async_copy.cuh"
#include "petrel/kernels/cuda/bulk_copy.cuh"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gptq_ptx.cuh"
#include "petrel/kernels/cuda/mlp_fused.h"
#include "petrel/kernels/cuda/programmatic_launch.cuh"

namespace petrel::cuda {

namespace {

using namespace ptx;

constexpr int kThreads = 128;
constexpr int kSlice = 32;          // intermediate elements a block
constexpr int kWordsPerStep = 4;    // packed words of a warp step (32 inputs of 32 rows)
constexpr int kBatch = 4;           // steps whose weight loads go out together; two batches in flight
constexpr int kPromoteSteps = 8;    // gemv_gptq.cu: the tensor cores' truncating sums kept short
constexpr int kNormCacheVectors = 1024;

struct MlpArgs {
  const int32_t* gu_qweight[2];  // gate, up
  const uint16_t* gu_scales[2];
  const int32_t* gu_qzeros[2];
  int gu_zero_offset[2];
  const int32_t* down_qweight;
  const uint16_t* down_scales;
  const int32_t* down_qzeros;
  int down_zero_offset;
  float* x;
  const void* norm_weight;
  WeightType norm_type;
  float norm_eps;
  int64_t hidden, inter;
  int gu_group_steps;       // steps of 4 words per gate/up group (2^30 per channel)
  int64_t down_group_size;  // intermediate inputs per down group
  uint32_t* barrier;        // [2]: blocks past their staging, blocks past the wait for them; zero between launches
  int l2_prefetch;          // steps 8 .. 15 of the block's gate/up weights asked into L2 before the wait
  uint32_t probe;           // MlpFusedOptions::probe (diagnostic)
  float* clear[3];
  int64_t clear_vectors[3];
};

__device__ __forceinline__ uint4 load_streaming16(const int32_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Elements 4 i .. 4 i + 3 of a norm weight vector of `type` in shared memory, exactly widened.
__device__ __forceinline__ float4 widen4(const char* data, WeightType type, int64_t i) {
  if (type == WeightType::kF32) return *reinterpret_cast<const float4*>(data + 16 * i);
  const uint2 bits = *reinterpret_cast<const uint2*>(data + 8 * i);
  if (type == WeightType::kF16) {
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&bits.x)),
                 hi = __half22float2(*reinterpret_cast<const __half2*>(&bits.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xFFFF0000u), __uint_as_float(bits.y << 16),
                     __uint_as_float(bits.y & 0xFFFF0000u));
}

// 4 blocks an SM (128 registers at most): the grid of Llama-3.1-8B (448 blocks) must be resident on 132 SMs.
__global__ void __launch_bounds__(kThreads, 4) mlp_fused_kernel(const MlpArgs a) {
  allow_dependent_launch();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int member = warp & 1, half = warp >> 1;
  const int64_t hidden_words = a.hidden / 8;
  const int half_steps = static_cast<int>(hidden_words / 2 / kWordsPerStep);
  const int64_t first_word = int64_t{half} * half_steps * kWordsPerStep;  // this warp's input half
  const int64_t row = int64_t{blockIdx.x} * kSlice + 4 * quad_row;        // this thread's 4 rows of gate or up
  const int32_t* weights = a.gu_qweight[member] + (first_word + quad_col) * a.inter + row;
  const int64_t step_stride = kWordsPerStep * a.inter;

  extern __shared__ uint4 shared_words[];
  uint32_t* const x_staged = reinterpret_cast<uint32_t*>(shared_words);     // [hidden_words] fragments
  char* const norm_shared = reinterpret_cast<char*>(shared_words + hidden_words);  // the norm weights as stored
  {
    const int64_t bytes = a.hidden * weight_type_bytes(a.norm_type);  // a multiple of 16 (hidden % 128 == 0)
    const char* from = static_cast<const char*>(a.norm_weight);
    for (int64_t off = int64_t{threadIdx.x} * 16; off < bytes; off += kThreads * 16) cp_async16(norm_shared + off, from + off);
    cp_async_commit();
  }
  auto load_batch = [&](uint4 (&batch)[kBatch], int first) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) batch[u] = load_streaming16(weights + (first + u) * step_stride);
  };
  uint4 ping[kBatch], pong[kBatch];
  load_batch(ping, 0);
  if (kBatch < half_steps) load_batch(pong, kBatch);

  // This group's scales and zeros and the next group's (gemv_gptq.cu's pipeline of parameters).
  const int64_t first_step = first_word / kWordsPerStep;
  const int64_t zeros_stride = a.inter / 8;
  int steps_to_group = static_cast<int>(a.gu_group_steps - first_step % a.gu_group_steps);
  const uint16_t* scales_at = a.gu_scales[member] + (first_step / a.gu_group_steps) * a.inter + row;
  const int32_t* zeros_at = a.gu_qzeros[member] + (first_step / a.gu_group_steps) * zeros_stride + row / 8;
  uint2 raw_scales, next_scales;
  uint32_t raw_zeros, next_zeros;
  load_raw_params(scales_at, zeros_at, true, raw_scales, raw_zeros);
  scales_at += a.inter;
  zeros_at += zeros_stride;
  load_raw_params(scales_at, zeros_at, steps_to_group < half_steps, next_scales, next_zeros);

  // Steps 8 .. 15 of each member and half into L2 (what gemv_gptq's default l2_prefetch_steps asks before its
  // wait): thread t takes member t % 2, half t / 2 % 2 and word t / 4 of those 32, one 128-byte run of 32 rows.
  if (a.l2_prefetch) {
    const int m = threadIdx.x & 1, hf = (threadIdx.x >> 1) & 1, i = threadIdx.x >> 2;
    const int64_t word = int64_t{hf} * half_steps * kWordsPerStep + 2 * kBatch * kWordsPerStep + i;
    if (2 * kBatch * kWordsPerStep + i < int64_t{half_steps} * kWordsPerStep) {
      prefetch_l2(a.gu_qweight[m] + word * a.inter + int64_t{blockIdx.x} * kSlice, kSlice * 4);
    }
  }
  wait_for_previous_kernel();
  // The fused step's atomic outputs that no kernel reads any more (mlp_fused.h).
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < a.clear_vectors[c]; i += int64_t{gridDim.x} * kThreads) {
      __stcg(reinterpret_cast<float4*>(a.clear[c]) + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
  }

  // RMSNorm of x: gemv_gptq.cu's input_inv_rms and load_input4<kRmsNorm> over the whole vector.
  __shared__ float4 x_cache[kNormCacheVectors];
  __shared__ float warp_sums[kThreads / 32];
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  const int64_t n4 = a.hidden / 4;
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
    const float4 v = __ldcg(x4 + i);
    if (i < kNormCacheVectors) x_cache[i] = v;
    sum = fmaf(v.x, v.x, sum);
    sum = fmaf(v.y, v.y, sum);
    sum = fmaf(v.z, v.z, sum);
    sum = fmaf(v.w, v.w, sum);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  if (lane == 0) warp_sums[warp] = sum;
  cp_async_wait<0>();
  __syncthreads();
  float total_squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) total_squares += warp_sums[k];
  const float inv_rms = 1.0f / sqrtf(total_squares / static_cast<float>(a.hidden) + a.norm_eps);
  auto normed4 = [&](int64_t i) {
    const float4 v = i < kNormCacheVectors ? x_cache[i] : __ldcg(x4 + i);
    const float4 w = widen4(norm_shared, a.norm_type, i);
    return make_float4(w.x * (v.x * inv_rms), w.y * (v.y * inv_rms), w.z * (v.z * inv_rms), w.w * (v.w * inv_rms));
  };
  for (int64_t word = threadIdx.x; word < hidden_words; word += kThreads) {
    const float4 lo = normed4(2 * word), hi = normed4(2 * word + 1);
    reinterpret_cast<uint4*>(x_staged)[word] =
        make_uint4(pack_half2(lo.x, hi.x), pack_half2(lo.y, hi.y), pack_half2(lo.z, hi.z), pack_half2(lo.w, hi.w));
  }
  __syncthreads();
  // Every read of x by this block is done: count it (no block adds into x before all are counted).
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(a.barrier, 1u);
  }

  // gate/up: gemv_gptq.cu's vector kernel for this warp's 32 rows and input half.
  float acc01[4] = {0, 0, 0, 0}, acc23[4] = {0, 0, 0, 0};
  float total[4] = {0, 0, 0, 0};
  float scale[4];
  uint32_t bias_low[4], bias_high[4];
  int steps_in_acc = 0;
  const ZeroBiasBases bases = zero_bias_bases(a.gu_zero_offset[member]);
  const int zero_shift = 4 * static_cast<int>(row % 8);
  auto decode_params = [&] {
    zero_biases<4>(raw_zeros >> zero_shift, bases, bias_low, bias_high);
    const uint32_t packed[2] = {raw_scales.x, raw_scales.y};
#pragma unroll
    for (int r = 0; r < 4; ++r) scale[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(packed[r / 2] >> (16 * (r % 2)))));
  };
  auto promote = [&] {
    total[0] += scale[0] * acc01[0];
    total[1] += scale[1] * acc01[2];
    total[2] += scale[2] * acc23[0];
    total[3] += scale[3] * acc23[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc01[i] = acc23[i] = 0.0f;
    steps_in_acc = 0;
  };
  decode_params();
  const uint32_t* x_warp = x_staged + (first_word + quad_col) * 4;
  auto compute_batch = [&](const uint4 (&batch)[kBatch], int first) {
    // Groups are whole batches (gate/up groups are multiples of 128 inputs): a change only before a batch.
    if (steps_to_group == 0) {
      promote();
      raw_scales = next_scales;
      raw_zeros = next_zeros;
      decode_params();
      steps_to_group = a.gu_group_steps;
      scales_at += a.inter;
      zeros_at += zeros_stride;
      load_raw_params(scales_at, zeros_at, first + steps_to_group < half_steps, next_scales, next_zeros);
    } else if (steps_in_acc + kBatch > kPromoteSteps) {
      promote();
    }
    steps_to_group -= kBatch;
    steps_in_acc += kBatch;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint4 w = batch[u];
      const uint4 xf = *reinterpret_cast<const uint4*>(x_warp + (first + u) * kWordsPerStep * 4);
      uint32_t v0[4], v1[4], v2[4], v3[4];
      dequant_word4(w.x, bias_low[0], bias_high[0], v0);
      dequant_word4(w.y, bias_low[1], bias_high[1], v1);
      dequant_word4(w.z, bias_low[2], bias_high[2], v2);
      dequant_word4(w.w, bias_low[3], bias_high[3], v3);
      mma_m16n8k16(acc01, v0[0], v1[0], v0[1], v1[1], xf.x, xf.y);
      mma_m16n8k16(acc01, v0[2], v1[2], v0[3], v1[3], xf.z, xf.w);
      mma_m16n8k16(acc23, v2[0], v3[0], v2[1], v3[1], xf.x, xf.y);
      mma_m16n8k16(acc23, v2[2], v3[2], v2[3], v3[3], xf.z, xf.w);
    }
  };
  for (int first = 0; first < half_steps; first += 2 * kBatch) {
    compute_batch(ping, first);
    if (first + 2 * kBatch < half_steps) load_batch(ping, first + 2 * kBatch);
    if (first + kBatch < half_steps) {
      compute_batch(pong, first + kBatch);
      if (first + 3 * kBatch < half_steps) load_batch(pong, first + 3 * kBatch);
    }
  }
  promote();

  // down's first batches: warp w's rows w * rows_per_warp + 32 s + 4 quad_row .. + 3, the block's 4 words.
  const int64_t rows_per_warp = a.hidden / 4;
  const int down_steps = static_cast<int>(rows_per_warp / 32);
  const int64_t down_row = warp * rows_per_warp + 4 * quad_row;  // step 0
  const int64_t down_group = int64_t{blockIdx.x} * kSlice / a.down_group_size;
  const int32_t* down_weights = a.down_qweight + (int64_t{blockIdx.x} * kWordsPerStep + quad_col) * a.hidden + down_row;
  const uint16_t* down_scales = a.down_scales + down_group * a.hidden + down_row;
  const int32_t* down_zeros = a.down_qzeros + down_group * (a.hidden / 8) + down_row / 8;
  struct DownBatch {
    uint4 w[kBatch];
    uint2 s[kBatch];
    uint32_t z[kBatch];
  };
  auto load_down = [&](DownBatch& b, int first) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = first + u;
      const bool ok = s < down_steps;  // uniform across the block
      b.w[u] = ok ? load_streaming16(down_weights + int64_t{s} * 32) : make_uint4(0, 0, 0, 0);
      load_raw_params(down_scales + int64_t{s} * 32, down_zeros + int64_t{s} * 4, ok, b.s[u], b.z[u]);
    }
  };
  DownBatch down_ping, down_pong;
  if (!(a.probe & kMlpProbeNoDown)) {
    load_down(down_ping, 0);
    load_down(down_pong, kBatch);
  }

  // The block's 32 values of SiLU(gate) * up, as fp16 fragments of down's 4 words.
  __shared__ float sums[2][2][kSlice];  // [member][half][row of the slice]
  __shared__ uint4 down_x[kWordsPerStep];
  if (quad_col == 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) sums[member][half][4 * quad_row + r] = total[r];
  }
  __syncthreads();
  if (threadIdx.x < kWordsPerStep) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = 8 * static_cast<int>(threadIdx.x) + e;
      v[e] = silu_mul_value(sums[0][0][i] + sums[0][1][i], sums[1][0][i] + sums[1][1][i]);
    }
    down_x[threadIdx.x] = make_uint4(pack_half2(v[0], v[4]), pack_half2(v[1], v[5]), pack_half2(v[2], v[6]), pack_half2(v[3], v[7]));
  }
  // Every block has read x before any adds into it (the counter above); then each block counts its departure
  // and the last resets both counters for the next launch.
  if (threadIdx.x == 0) {
    while (load_acquire(a.barrier) < gridDim.x) __nanosleep(64);
    if (atomicAdd(a.barrier + 1, 1u) == gridDim.x - 1) {
      a.barrier[0] = 0;
      a.barrier[1] = 0;
    }
  }
  __syncthreads();
  const uint4 xf = down_x[quad_col];
  const ZeroBiasBases down_bases = zero_bias_bases(a.down_zero_offset);
  const int down_shift = 4 * static_cast<int>(down_row % 8);
  auto compute_down = [&](const DownBatch& b, int first) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = first + u;
      if (s >= down_steps) break;
      uint32_t low[4], high[4];
      zero_biases<4>(b.z[u] >> down_shift, down_bases, low, high);
      const uint4 w = b.w[u];
      uint32_t v0[4], v1[4], v2[4], v3[4];
      dequant_word4(w.x, low[0], high[0], v0);
      dequant_word4(w.y, low[1], high[1], v1);
      dequant_word4(w.z, low[2], high[2], v2);
      dequant_word4(w.w, low[3], high[3], v3);
      float d01[4] = {0, 0, 0, 0}, d23[4] = {0, 0, 0, 0};
      mma_m16n8k16(d01, v0[0], v1[0], v0[1], v1[1], xf.x, xf.y);
      mma_m16n8k16(d01, v0[2], v1[2], v0[3], v1[3], xf.z, xf.w);
      mma_m16n8k16(d23, v2[0], v3[0], v2[1], v3[1], xf.x, xf.y);
      mma_m16n8k16(d23, v2[2], v3[2], v2[3], v3[3], xf.z, xf.w);
      if (a.probe & kMlpProbeNoAdds) {  // diagnostic: the sums computed, not added (a store that never happens)
        if (quad_col == 0 && d01[0] == 1.25e-38f && d23[0] == 1.25e-38f) a.x[0] = d01[2] + d23[2];
      } else if (quad_col == 0) {
        auto half_at = [&](uint32_t packed, int i) {
          return __half2float(__ushort_as_half(static_cast<unsigned short>(packed >> (16 * i))));
        };
        const float4 add = make_float4(half_at(b.s[u].x, 0) * d01[0], half_at(b.s[u].x, 1) * d01[2],
                                       half_at(b.s[u].y, 0) * d23[0], half_at(b.s[u].y, 1) * d23[2]);
        float* to = a.x + down_row + int64_t{s} * 32;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float4*>(to), add);
#else
        atomicAdd(to, add.x);
        atomicAdd(to + 1, add.y);
        atomicAdd(to + 2, add.z);
        atomicAdd(to + 3, add.w);
#endif
      }
    }
  };
  const int down_computed = a.probe & kMlpProbeNoDown ? 0 : down_steps;  // diagnostic: no down phase
  for (int first = 0; first < down_computed; first += 2 * kBatch) {
    compute_down(down_ping, first);
    if (first + 2 * kBatch < down_steps) load_down(down_ping, first + 2 * kBatch);
    if (first + kBatch < down_steps) {
      compute_down(down_pong, first + kBatch);
      if (first + 3 * kBatch < down_steps) load_down(down_pong, first + 3 * kBatch);
    }
  }
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Dynamic shared memory: x's fp16 fragments (2 bytes an input), then the norm weights as stored.
constexpr int kMaxSharedBytes = 96 * 1024;
size_t shared_bytes(int64_t hidden, WeightType norm_type) {
  return static_cast<size_t>(hidden * 2 + hidden * weight_type_bytes(norm_type));
}

std::string shape(const DeviceGptqMatrix& m) { return std::string("[") + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]"; }

}  // namespace

Status decode_mlp_fused_supports(const MlpFusedWeights& w) {
  if (!w.gate || !w.up || !w.down) return invalid_argument("decode_mlp_fused: null matrix");
  const DeviceGptqMatrix &gate = *w.gate, &up = *w.up, &down = *w.down;
  const std::string what = "decode_mlp_fused (gate " + shape(gate) + ", down " + shape(down) + ")";
  if (gate.bits != 4 || up.bits != 4 || down.bits != 4) return unsupported(what + ": 4-bit matrices only");
  if (up.rows != gate.rows || up.cols != gate.cols || up.group_size != gate.group_size) {
    return unsupported(what + ": gate and up differ in shape or group size");
  }
  const int64_t hidden = gate.cols, inter = gate.rows;
  if (down.rows != hidden || down.cols != inter) return unsupported(what + ": down is not [hidden, intermediate]");
  if (hidden % 256 != 0 || hidden < 256) return unsupported(what + ": hidden must be a multiple of 256");
  if (hidden * 6 > kMaxSharedBytes) return unsupported(what + ": hidden too large for shared memory");
  if (inter % kSlice != 0) return unsupported(what + ": intermediate must be a multiple of 32");
  if (gate.group_size != hidden && (gate.group_size % 128 != 0 || (hidden / 2) % gate.group_size != 0)) {
    return unsupported(what + ": gate/up groups must be per channel or multiples of 128 dividing hidden / 2");
  }
  if (down.group_size != inter && (down.group_size % kSlice != 0 || inter % down.group_size != 0)) {
    return unsupported(what + ": down's groups must be per channel or multiples of 32");
  }
  for (const DeviceGptqMatrix* m : {w.gate, w.up, w.down}) {
    if (m->zero_offset != 0 && m->zero_offset != 1) return unsupported(what + ": zero_offset must be 0 or 1");
  }
  PETREL_ASSIGN_OR_RETURN(const WeightType norm_type, weight_type(w.norm_weight.dtype, "decode_mlp_fused RMSNorm weight"));
  // The counter wait needs every block of the grid resident at once.
  const size_t shared = shared_bytes(hidden, norm_type);
  const int64_t blocks = inter / kSlice;
  int device = 0, sms = 0, per_sm = 0;
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "decode_mlp_fused");
  PETREL_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "decode_mlp_fused");
  if (shared > 48 * 1024) {
    PETREL_CUDA_RETURN_IF_ERROR(raise_shared_limit_once<mlp_fused_kernel>(kMaxSharedBytes), "decode_mlp_fused");
  }
  PETREL_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mlp_fused_kernel, kThreads, shared),
                              "decode_mlp_fused occupancy");
  if (int64_t{per_sm} * sms < blocks) {
    return unsupported(what + ": its " + std::to_string(blocks) + " blocks do not fit on the GPU at once (" +
                       std::to_string(per_sm) + " an SM x " + std::to_string(sms) + " SMs)");
  }
  return ok_status();
}

Status decode_mlp_fused(const MlpFusedWeights& w, float* x, uint32_t* barrier, Stream stream, const MlpFusedOptions& options) {
  PETREL_RETURN_IF_ERROR(decode_mlp_fused_supports(w));
  const DeviceGptqMatrix &gate = *w.gate, &up = *w.up, &down = *w.down;
  const int64_t hidden = gate.cols, inter = gate.rows;
  if (!x || !barrier) return invalid_argument("decode_mlp_fused: null x or barrier");
  if (address(x) % 16 != 0) return invalid_argument("decode_mlp_fused: x must be 16-byte aligned");
  for (const DeviceGptqMatrix* m : {w.gate, w.up, w.down}) {
    if (!m->qweight || !m->scales || !m->qzeros) return invalid_argument("decode_mlp_fused: null device pointer");
    if (address(m->qweight) % 16 != 0 || address(m->scales) % 8 != 0) {
      return invalid_argument("decode_mlp_fused: qweight must be 16-byte and scales 8-byte aligned");
    }
  }
  PETREL_ASSIGN_OR_RETURN(const WeightType norm_type, weight_type(w.norm_weight.dtype, "decode_mlp_fused RMSNorm weight"));
  if (!w.norm_weight.data || w.norm_weight.size != hidden || address(w.norm_weight.data) % 16 != 0) {
    return invalid_argument("decode_mlp_fused: the RMSNorm weight must have " + std::to_string(hidden) +
                            " elements, 16-byte aligned");
  }
  MlpArgs args{};
  const DeviceGptqMatrix* gu[2] = {&gate, &up};
  for (int i = 0; i < 2; ++i) {
    args.gu_qweight[i] = gu[i]->qweight;
    args.gu_scales[i] = gu[i]->scales;
    args.gu_qzeros[i] = gu[i]->qzeros;
    args.gu_zero_offset[i] = gu[i]->zero_offset;
  }
  args.down_qweight = down.qweight;
  args.down_scales = down.scales;
  args.down_qzeros = down.qzeros;
  args.down_zero_offset = down.zero_offset;
  args.x = x;
  args.norm_weight = w.norm_weight.data;
  args.norm_type = norm_type;
  args.norm_eps = w.norm_eps;
  args.hidden = hidden;
  args.inter = inter;
  args.gu_group_steps = static_cast<int>(gate.group_size == hidden ? int64_t{1} << 30 : gate.group_size / 32);
  args.down_group_size = down.group_size;
  args.barrier = barrier;
  args.l2_prefetch = options.l2_prefetch;
  args.probe = options.probe;
  for (int c = 0; c < 3; ++c) {
    const GemvFusion::Clear& clear = options.clear[c];
    if (clear.data && (address(clear.data) % 16 != 0 || clear.count % 4 != 0 || clear.count < 0)) {
      return invalid_argument("decode_mlp_fused: a buffer to clear must be 16-byte aligned and a multiple of 4 floats");
    }
    args.clear[c] = clear.data;
    args.clear_vectors[c] = clear.data ? clear.count / 4 : 0;
  }
  const size_t shared = shared_bytes(hidden, norm_type);
  const unsigned blocks = static_cast<unsigned>(inter / kSlice);
  return cuda_status(launch_kernel(mlp_fused_kernel, dim3(blocks), dim3(kThreads), shared, stream, options.overlap_previous, args),
                     "decode_mlp_fused launch");
}

}  // namespace petrel::cuda
