// kernels/cuda: Y = X W^T for many activation rows at once (the prompt processor's shape, and GPTQ's
// calibration forward): W a 4-bit GPTQ matrix (or the 8-bit LM head) read in place, or a dense matrix in its
// stored dtype. gemm_gptq.cu says how the W4A16 kernels work and why, with the H200 measurements behind
// kAuto; gemm_dense.cu the dense path. Host-side checks and launch plans are in gemm.cc.
//
// Shapes: x float32 row-major [m, w.cols]; y float32 row-major [m, w.rows] (every element written); device
// pointers, x and y 16-byte aligned (cudaMalloc'd buffers and row offsets of them are, since the GPTQ shapes
// have cols % 8 == 0 and rows % 4 == 0). x and y must not overlap. Calls are asynchronous on `stream`: the
// host-side checks come back at once, errors during execution surface at the next synchronizing call.
//
// Numerics (GPTQ). Both algorithms multiply x rounded to fp16 (the tensor cores' input) with float32 sums.
// Dequantization: per-channel matrices in the fused kernel (kTensorCore) are exact (code - zero is a small
// integer, exact in fp16; the scale is applied to the float32 sums), so the result is ref::matmul on x
// rounded to fp16 up to summation order. Grouped matrices, and every matrix under kDequantCublas, use the
// weight rounded once to fp16 (fp16(scale * (code - zero)), relative 2^-12 per weight). Against ref::matmul
// on float32 x the relative L2 error is about 3e-4 (per-channel, fused) to 4e-4 on random data.
// Dense: float32 weights give float32 products (no TF32); f16/bf16 weights multiply x rounded to the same
// dtype with float32 accumulation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "petrel/kernels/cuda/blas.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/util/dtype.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// Scratch memory (staged activations, dequantized weight slices, split-K partials), zeroed split-K arrival
// counters, cuBLAS's own workspace and a cuBLAS handle. One workspace per stream: two products in flight at
// once must not share one. Created on the current device.
class GemmWorkspace {
 public:
  // bytes: capacity of the scratch buffer; products that need more are cut into pieces that fit (fewer
  // tokens per launch, fewer weight rows per cuBLAS call), at some cost in speed. What one call uses
  // (GemmPlan::scratch_bytes): kDequantCublas 2 * cols * (m + rows), e.g. 121 MB for gate/up (14336x4096)
  // and 132 MB for down (4096x14336) at m = 512; kTensorCore 2 * cols * m for the staged x plus, when it
  // splits K, 4 * k_splits * m * rows of partial sums (<= 15 MB for Llama-3.1-8B's shapes at m <= 160). So
  // the default 256 MB holds every Llama-3.1-8B layer linear in one piece up to m ~ 4,800 tokens.
  // Besides the scratch, create() allocates 32 MB for cuBLAS and 256 KB of counters.
  static Result<GemmWorkspace> create(int64_t bytes = int64_t{256} << 20);
  int64_t capacity() const;
  void* scratch() const;
  BlasHandle& blas();
  int multiprocessors() const;
  // The split-K counters (zero between launches: each launch leaves them as it found them).
  uint32_t* counters() const;
  int64_t counter_capacity() const;
  // Memory handed to cuBLAS (cublasSetWorkspace) on every call, so that it never allocates on its own (which
  // would break stream capture into a CUDA graph).
  void* blas_workspace() const;
  int64_t blas_workspace_bytes() const;
  // Points the cuBLAS handle at `stream` and at blas_workspace(); every cuBLAS call through this workspace
  // does this first. (On the H200 a small cuBLAS product costs ~20 us launched on a stream against ~7 us in a
  // CUDA graph: the host side of cuBLAS, not the GPU, bounds small calls outside graphs.)
  Status bind_blas(Stream stream);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

enum class GemmAlgorithm {
  kAuto,           // the fastest measured on an H200: kTensorCore up to m = 160 (m = 48 below 16M weights),
                   // kDequantCublas beyond (auto_gemm_algorithm; gemm_gptq.cu has the numbers)
  kTensorCore,     // petrel's fused kernel: dequantization in registers feeding mma.sync
  kDequantCublas,  // dequantize W to fp16 in the workspace (in row slices), then cublasGemmEx
};

struct GemmOptions {
  GemmAlgorithm algorithm = GemmAlgorithm::kAuto;
  // Overrides of the fused kernel's plan, for the benchmark's sweeps and the tests; 0: planned.
  int token_tile = 0;  // tokens per block: 8, 16, 32 or 64
  int warps = 0;       // warps per block, 32 output rows each: 4 or 8
  int k_splits = 0;    // blocks along the input dimension (split-K)
  int stages = 0;      // chunks in the shared-memory pipeline: 2 or 3
  // The fused kernel's launches (x staging, product) overlap the kernel before each on the stream (programmatic
  // dependent launch; each waits for it before it reads anything it wrote or writes global memory: the product
  // requests its first weights before the wait). The dequant + cuBLAS path ignores it.
  bool overlap_previous = false;
  // gemm_gptq_group: the members' products in ONE launch, their row blocks side by side in one grid planned as
  // one matrix of all their rows (more blocks to spread over the SMs at small m, one launch and one tail instead
  // of several), where each member but the last has whole row blocks of the plan and all share a group size.
  bool one_launch = true;
};

// How gemm_gptq cuts one product (exposed for the tests and the benchmark).
struct GemmPlan {
  // The fused kernel's fixed geometry (gemm_gptq.cu): a step is 4 packed input words of 32 output rows per
  // warp; x and the weights move through shared memory in chunks of 8 steps, `stages` chunks in flight.
  static constexpr int kWordsPerStep = 4;
  static constexpr int kChunkSteps = 8;
  // Bytes of staged x per token and packed word (fp16, fragment order): 8 inputs of a 4-bit word, 4 of an
  // 8-bit one.
  static constexpr int fragment_bytes(int bits) { return bits == 4 ? 16 : 8; }
  // Shared-memory bytes between two tokens' chunks of x: the chunk, padded so that the 8 (4-bit) or 16
  // (8-bit) lanes of one shared-memory phase read distinct banks.
  static constexpr int token_stride_bytes(int bits) {
    return kChunkSteps * kWordsPerStep * fragment_bytes(bits) + (bits == 4 ? 64 : 32);
  }
  // Shared-memory bytes between two packed words of the block's 32 * warps rows of weights: padded by 32 so
  // that the 4 words one shared-memory phase reads (one per quad column) land in distinct banks.
  static constexpr int weight_stride_bytes(int warps) { return 32 * warps * 4 + 32; }
  // One pipeline stage: a chunk of x for `token_tile` tokens and of the weights for 32 * warps rows.
  static constexpr int stage_bytes(int bits, int token_tile, int warps) {
    return token_tile * token_stride_bytes(bits) + kChunkSteps * kWordsPerStep * weight_stride_bytes(warps);
  }

  GemmAlgorithm algorithm = GemmAlgorithm::kTensorCore;  // resolved: never kAuto
  int64_t m_chunk = 0;        // tokens per launch (m unless the scratch is too small for all of them)
  int64_t scratch_bytes = 0;  // scratch used by one chunk
  // kTensorCore: grid (token_tiles, row_blocks, k_splits) of blocks of `warps` warps.
  int token_tile = 0;
  int warps = 0;
  int64_t token_tiles = 0;  // of one chunk
  int64_t row_blocks = 0;
  int k_splits = 1;
  int64_t steps_per_split = 0;  // steps of 4 packed input words; a multiple of the kernel's chunk of 8 steps
  int stages = 0;
  int64_t shared_bytes = 0;     // dynamic shared memory per block: the pipeline's stages of x and weights
  // kDequantCublas: rows of W dequantized per cublasGemmEx.
  int64_t slice_rows = 0;
};

// The algorithm kAuto picks for m tokens through `w` (from the H200 measurements in gemm_gptq.cu).
GemmAlgorithm auto_gemm_algorithm(const DeviceGptqMatrix& w, int64_t m);

// OK when gemm_gptq reads `w` (data pointers are not looked at): what gemv_gptq_supports accepts, with the
// rows of a 4-bit matrix a multiple of 8 (its qzeros pack 8 rows per word).
Status gemm_gptq_supports(const DeviceGptqMatrix& w);

// The plan gemm_gptq follows for m tokens with a workspace of `scratch_capacity` bytes and `counter_capacity`
// counters on a device with `multiprocessors` SMs.
Result<GemmPlan> plan_gemm_gptq(const DeviceGptqMatrix& w, int64_t m, int multiprocessors, int64_t scratch_capacity,
                                int64_t counter_capacity, const GemmOptions& options = {});

// y[m, w.rows] = x[m, w.cols] * dequant(w)^T on `stream`, asynchronously; any m >= 1 with any algorithm
// (kAuto included): a product the scratch cannot hold at once is cut into pieces, and only a workspace too
// small for one tile of tokens (or one token and 64 rows of fp16 W) is refused (kOutOfRange). Capturable
// into a CUDA graph (no allocation, no synchronization; the shared-memory opt-in happens at a kernel's first
// launch on each device, so make one call before capturing).
Status gemm_gptq(const DeviceGptqMatrix& w, const float* x, int64_t m, float* y, GemmWorkspace& workspace,
                 Stream stream = nullptr, const GemmOptions& options = {});

// What the fused kernel's x staging does to x on its way to fp16 (gemm_gptq_group): the prompt processor's
// element-wise steps before a linear, fused into the staging launch the linear needs anyway.
struct GemmInputFusion {
  GemvInput input = GemvInput::kPlain;  // kPlain, kRmsNorm (cuda::rms_norm of each row) or kSiluMul
  DeviceVector norm_weight;             // kRmsNorm: [cols], F32, F16 or BF16
  float norm_eps = 0.0f;                // kRmsNorm
  // kRmsNorm: when set, each row of x first becomes x + residual ([m, cols]), written to residual_sum (which
  // may be x itself: the residual stream updated in place, as cuda::rms_norm does); both or neither.
  const float* residual = nullptr;
  float* residual_sum = nullptr;
  const float* up = nullptr;  // kSiluMul: the input is ref::silu_mul(x, up), up [m, cols] 16-byte aligned
};

// y_i[m, W_i.rows] = op(x)[m, cols] dequant(W_i)^T for up to kMaxGemvGroupMembers matrices that read the same
// input (gate and up), through the fused kernel: x is staged ONCE (op applied on the way: the post-attention
// RMSNorm with its residual add for gate/up, SiLU(gate) * up for down) and each member is one product launch.
// In the prompt processor's MLP this replaces rms_norm + 2 stagings (gate, up) and silu_mul + 1 staging (down)
// by 2 staging launches, and gate and up share one product launch (GemmOptions::one_launch). Results are
// bitwise those of the separate kernels (cuda::rms_norm or cuda::silu_mul, then gemm_gptq) with the same
// tile, warps, splits and stages (one launch is planned as one matrix of all members: its planned splits may
// differ from one member's, and so may the float32 sums' order). Members must agree on bits and cols. Only for products whose plans
// are kTensorCore with all m tokens in one launch (gemm_gptq_group_applies; kUnsupported otherwise):
// the caller keeps the separate kernels for the rest (dequant + cuBLAS at large m).
Status gemm_gptq_group(std::span<const GemvGroupMember> members, const float* x, int64_t m, GemmWorkspace& workspace,
                       Stream stream = nullptr, const GemmOptions& options = {}, const GemmInputFusion& fusion = {});

// True when gemm_gptq_group takes these members and m (every plan kTensorCore, one launch for all tokens).
bool gemm_gptq_group_applies(std::span<const GemvGroupMember> members, int64_t m, const GemmWorkspace& workspace,
                             const GemmOptions& options = {});

// y[m, w.rows] = x[m, w.cols] * w^T for a dense row-major w (nn.Linear's [out, in]) in F32, F16 or BF16;
// any m >= 1. F16/BF16 stage x in that dtype in the workspace (m is cut into pieces that fit).
Status gemm_dense(const DeviceDenseMatrix& w, const float* x, int64_t m, float* y, GemmWorkspace& workspace,
                  Stream stream = nullptr);

// W as fp16 [w.rows, w.cols] row-major (nn.Linear's layout) into `out` (2 * rows * cols bytes, 16-byte
// aligned): each weight fp16(scale * (code - zero)), exactly what kDequantCublas multiplies. For a cache of
// dequantized weights (CudaModelOptions::prefill_f16_weights) that gemm_dense then reads as F16.
Status dequantize_gptq(const DeviceGptqMatrix& w, void* out, Stream stream = nullptr);

// out[i] = x[i] rounded to `dtype` (F16 or BF16, round to nearest even) for i < n, on `stream`; out holds
// 2-byte elements. x and out 16-byte aligned. The staging step of gemm_dense, usable on its own.
Status convert_floats(const float* x, int64_t n, DType dtype, void* out, Stream stream = nullptr);

}  // namespace petrel::cuda
