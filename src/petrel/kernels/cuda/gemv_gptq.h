// kernels/cuda: y = dequant(W) x for one activation vector (the token generator's shape) with W a 4-bit (or
// 8-bit: the LM head) GPTQ matrix read in place in device memory. The layout is ref::GptqMatrix's
// (kernels/ref/ops.h); gemv_gptq.cu says how the kernel reads it and why.
//
// Numerics: x comes in as float32 and the tensor-core kernel (the default) rounds it to fp16 as it stages it
// (W4A16: 16-bit activations into the matrix unit); weights are dequantized exactly (code - zero is a small
// integer, exact in fp16), products are exact, sums and the per-group scale are float32. So the result equals
// ref::matmul on x rounded to fp16 up to float32 summation order; against ref::matmul on x itself it differs
// by the fp16 rounding of x (relative L2 about 3e-4 on random data). The CUDA-core kernel keeps x in float32.
// y is float32.
#pragma once

#include <cstdint>
#include <span>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/uploader.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// A GPTQ matrix whose tensors are in device memory; fields and shapes as ref::GptqMatrix (no g_idx:
// act-order matrices are not supported).
struct DeviceGptqMatrix {
  int bits = 4;  // 4 or 8
  int64_t rows = 0;        // out_features
  int64_t cols = 0;        // in_features
  int64_t group_size = 0;  // cols for per-channel
  int zero_offset = 1;     // 1: GPTQ v1 (stored zero = real zero - 1); 0: gptq_v2
  const int32_t* qweight = nullptr;  // [cols * bits / 32, rows]
  const uint16_t* scales = nullptr;  // fp16 [n_groups, rows]
  const int32_t* qzeros = nullptr;   // [n_groups, rows * bits / 32]
  // The stored zero of every row in every group when they are all the same (a symmetric grid: 7 in GPTQ v1,
  // petrel's default), else -1. Set by DeviceGptqWeights::upload; the 4-bit vector GEMV then decodes the zeros
  // once instead of at every group change (GemvOptions::uniform_zeros).
  int uniform_zero = -1;

  int64_t n_groups() const { return group_size > 0 ? (cols + group_size - 1) / group_size : 0; }
  // Bytes of qweight, scales and qzeros: what one GEMV must read at least.
  int64_t weight_bytes() const { return cols * rows * bits / 8 + n_groups() * rows * 2 + n_groups() * rows * bits / 8; }
};

// Owns the device copy of a host GPTQ matrix.
class DeviceGptqWeights {
 public:
  // Uploads `host` to the current device; refuses act-order (g_idx) and shapes gemv_gptq cannot read.
  // With `uploader`, the copies are queued on it (HostUploader::finish() before the first use); without, they
  // are synchronous cudaMemcpy calls.
  static Result<DeviceGptqWeights> upload(const ref::GptqMatrix& host, HostUploader* uploader = nullptr);
  const DeviceGptqMatrix& view() const { return view_; }
  // A view of tensors another DeviceGptqWeights owns (a tied LM head reading the embedding's table); it must
  // not outlive the owner.
  static DeviceGptqWeights borrow(const DeviceGptqMatrix& view) {
    DeviceGptqWeights weights;
    weights.view_ = view;
    return weights;
  }

 private:
  DeviceGptqMatrix view_;
  DeviceBuffer qweight_, scales_, qzeros_;
};

// OK when gemv_gptq reads `w` (data pointers are not looked at); otherwise says what does not fit:
// bits 4 or 8; rows a multiple of 4 (each thread reads 4 output channels with one 16-byte load);
// cols a multiple of 32 / bits; per-channel or group_size a multiple of 4 * 32 / bits (32 for 4-bit, 16 for
// 8-bit) that divides cols; zero_offset 0 or 1.
Status gemv_gptq_supports(const DeviceGptqMatrix& w);

enum class GemvAlgorithm {
  kTensorCore,  // mma.sync m16n8k16, fp16 x (default; see gemv_gptq.cu)
  kCudaCore,    // float32 FMA per weight, float32 x: the plain column-per-thread kernel, kept as a baseline
};

// The default of GemvOptions::l2_prefetch_steps (gemv_gptq.cu says why).
inline constexpr int kDefaultL2PrefetchSteps = 16;

struct GemvOptions {
  GemvAlgorithm algorithm = GemvAlgorithm::kTensorCore;
  int k_splits = 0;  // blocks along the input dimension; 0: chosen from the shape and the multiprocessor count
  // Programmatic dependent launch (Hopper and later; ignored before): the kernel may start while the previous
  // kernel on the stream is still running. Each block issues its first weight loads (and the L2 prefetch
  // below), then waits for the previous kernel to complete (griddepcontrol.wait) before it reads x or writes
  // anything, so the result is the same as without overlap. Every kernel of the token generator's fused step
  // waits likewise, which is what makes chains of such launches safe (gemv_gptq.cu).
  bool overlap_previous = false;
  // Steps (of 4 packed input words) of each block's slice of the weights asked into L2 before that wait,
  // beyond the batches of 4 steps each thread loads into registers (two; three at 8 bits) (tensor-core kernel
  // only; 0: none).
  int l2_prefetch_steps = kDefaultL2PrefetchSteps;
  // Split-K sums reduced inside a thread-block cluster (the k_splits blocks of a row range exchange their
  // partial sums through distributed shared memory; Hopper and later, k_splits <= 16, tensor-core kernel)
  // instead of through L2 with an arrival counter. The same sums in the same order: bitwise the same y.
  bool cluster_reduce = false;
  // Split-K sums added straight into y by every block (float atomic adds, fire-and-forget: no partials, no
  // arrival counter, no last block's second pass) instead of the last block adding the slices in a fixed order.
  // y must hold its starting value when the kernel runs: the residual (GemvFusion::residual == y, the residual
  // stream updated in place) or zeros (GemvFusion::clear of an earlier launch, or a memset). The order of the
  // adds varies from run to run, so with more than two slices y is no longer bitwise reproducible (two slices
  // into zeros are: a + b == b + a). Vector kernels (the token generator); ignored with cluster_reduce.
  bool atomic_reduce = false;
  // 4-bit vector kernels with an RMSNorm input whose slices lie in one group (per channel) keep three batches of
  // weight loads in flight (gemv_gptq.cu, kBuildDeep); false: two, as every other vector kernel.
  bool deep_batches = true;
  // 4-bit vector kernels with an RMSNorm input whose slices lie in one group (per channel): how many of the
  // batches of weight loads a thread keeps in flight (two, or three with deep_batches) go out after the wait for
  // the previous kernel, right behind the block's first reads of x, instead of before it (0 to 2; more counts as
  // all but the first; a build of its own, gemv_gptq.cu's kBuildLate; ignored at group 128, where it lost 8%).
  // Fewer bytes queue ahead of x; the same sums, bitwise the same y.
  int late_batches = 0;
  // 4-bit vector kernels whose slices span several groups (group 128) and whose matrices' zeros are all one
  // value (DeviceGptqMatrix::uniform_zero): a build that decodes the zeros once, loads only the scales at each
  // group change and keeps three batches of weight loads in flight (gemv_gptq.cu's kBuildUniformZeros); false:
  // the general build, which loads and decodes every group's zeros. The same arithmetic: bitwise the same y.
  bool uniform_zeros = true;
  // gemv_gptq_batch: row tiles (of 128 rows) each block computes one after another with one staged copy of x;
  // 0: chosen from the token count.
  int row_tiles = 0;
};

// What a GEMV does to its input as it stages it and to its output as it writes it: the token generator's
// element-wise steps fused into the matrix products around them (tensor-core kernel only).
enum class GemvInput {
  kPlain,    // x as given
  kRmsNorm,  // ref::rms_norm of x as one row of cols: norm_weight * (x * (1 / sqrt(mean(x^2) + norm_eps)))
  kSiluMul,  // ref::silu_mul(x, up): x is the gate projection, up the up projection, both [cols]
};

struct GemvFusion {
  GemvInput input = GemvInput::kPlain;
  DeviceVector norm_weight;   // kRmsNorm: [cols], F32, F16 or BF16
  float norm_eps = 0.0f;      // kRmsNorm
  const float* up = nullptr;  // kSiluMul: [cols], 16-byte aligned
  // When set, y = residual + W input, the sum written where each row is finished: the residual stream
  // updated in place when residual == y. Single-matrix launches only.
  const float* residual = nullptr;
  // Zeroed by the launch's blocks after they waited for the previous kernel (vector kernels): outputs of later
  // atomic_reduce launches, cleared where no kernel in between reads them. Each 16-byte aligned, count % 4 == 0.
  struct Clear {
    float* data = nullptr;
    int64_t count = 0;
  } clear[2];
};

// Scratch memory for the split-K reduction and the per-block arrival counters. One workspace per stream:
// two GEMVs in flight at once must not share one. Created on the current device.
class GemvWorkspace {
 public:
  // partial_floats: capacity of the partial-sum buffer; a split-K launch needs rows * k_splits of it.
  static Result<GemvWorkspace> create(int64_t partial_floats = int64_t{1} << 20);
  int multiprocessors() const { return multiprocessors_; }
  int64_t partial_capacity() const { return partial_floats_; }
  int64_t counter_capacity() const { return counters_; }
  float* partials() const { return partials_.as<float>(); }
  uint32_t* counters() const { return counter_buffer_.as<uint32_t>(); }

 private:
  int multiprocessors_ = 0;
  int64_t partial_floats_ = 0, counters_ = 0;
  DeviceBuffer partials_, counter_buffer_;
};

// How a launch cuts the matrix: blocks of kRowsPerBlock output rows times k_splits slices of the input,
// each slice steps_per_split steps of 4 packed input words.
struct GemvPlan {
  static constexpr int kRowsPerBlock = 128;
  static constexpr int kThreadsPerBlock = 128;
  // The batch kernels' limit on staged x per block (they raise the kernel's dynamic shared-memory limit to it).
  static constexpr int64_t kMaxBatchSharedBytes = 96 * 1024;
  int64_t row_blocks = 0;  // blocks along the rows (gridDim.x)
  int k_splits = 1;
  int64_t steps_per_split = 0;
  int64_t shared_bytes = 0;  // dynamic shared memory per block: the staged slice of x
  int64_t row_tiles = 1;        // row tiles of kRowsPerBlock per block (batch kernels; 1 otherwise)
  int64_t row_tiles_total = 0;  // row tiles of all matrices together
  int64_t x_stride_bytes = 0;   // batch kernels: bytes per token of the staged slice of x
};

// The plan gemv_gptq would use for `w` on a device with `multiprocessors` SMs, given the workspace's partial
// capacity (exposed for the benchmark and the tests).
Result<GemvPlan> plan_gemv_gptq(const DeviceGptqMatrix& w, int multiprocessors, int64_t partial_capacity,
                                const GemvOptions& options = {});

// y[w.rows] = dequant(w) * x[w.cols] on `stream`, asynchronously; x and y are device pointers, 16-byte
// aligned. Checks shapes before the launch and returns launch errors; errors during execution surface at the
// next synchronizing call. Every element of y is written.
Status gemv_gptq(const DeviceGptqMatrix& w, const float* x, float* y, GemvWorkspace& workspace,
                 Stream stream = nullptr, const GemvOptions& options = {}, const GemvFusion& fusion = {});

// One matrix of a grouped GEMV and where its product goes.
struct GemvGroupMember {
  const DeviceGptqMatrix* w = nullptr;
  float* y = nullptr;  // [w->rows], 16-byte aligned
};
inline constexpr int kMaxGemvGroupMembers = 3;

// y_i = W_i op(x) for up to kMaxGemvGroupMembers matrices that read the same input (q/k/v, gate/up) in ONE
// launch: the grid covers every member's row blocks and each block finds its matrix, so the small matrices
// do not each pay a launch, a first-load latency and a split-K epilogue. Members must agree on bits, cols
// and group_size (zero_offset may differ); each stays in its own GPTQ tensors. fusion.residual needs a
// single member.
Status gemv_gptq_grouped(std::span<const GemvGroupMember> members, const float* x, GemvWorkspace& workspace,
                         Stream stream = nullptr, const GemvOptions& options = {}, const GemvFusion& fusion = {});

// The plan gemv_gptq_grouped would use (all members' row blocks side by side in one grid).
Result<GemvPlan> plan_gemv_gptq_grouped(std::span<const GemvGroupMember> members, int multiprocessors,
                                        int64_t partial_capacity, const GemvOptions& options = {});

// The most tokens one gemv_gptq_batch call takes.
inline constexpr int64_t kMaxGemvTokens = 32;

// Y_i[tokens, W_i.rows] = op(X)[tokens, cols] dequant(W_i)^T for 1 <= tokens <= kMaxGemvTokens: the prompt
// processor's short chunks (a chat turn; time to first token) through the token generator's kernel rather
// than a GEMM. Each step's weights are dequantized once and multiplied with up to 4 n-tiles of 8 tokens
// (the mma's N dimension, which the vector kernel fills with copies of x), so the weights are read once for
// all tokens and the cost per step grows by 4 mma per n-tile, not by a dequantization. x is [tokens, cols]
// float32 (row-major, 16-byte aligned), each y [tokens, rows]; op is kPlain or kSiluMul (up [tokens, cols]),
// and fusion.residual ([tokens, rows], single matrix) is added as in gemv_gptq. 4-bit weights, tensor-core
// algorithm. A token's result equals gemv_gptq's on that row of x with the same k_splits, bit for bit.
// Each block stages its slice of x for all tokens (fp16, up to 96 KB) and computes GemvOptions::row_tiles
// row tiles with it, so x is read from L2 once per row_tiles * 128 rows.
Status gemv_gptq_batch(std::span<const GemvGroupMember> members, const float* x, int64_t tokens,
                       GemvWorkspace& workspace, Stream stream = nullptr, const GemvOptions& options = {},
                       const GemvFusion& fusion = {});

// The plan gemv_gptq_batch would use; the partials need k_splits * tokens * row_tiles_total * 128 floats.
Result<GemvPlan> plan_gemv_gptq_batch(std::span<const GemvGroupMember> members, int64_t tokens, int multiprocessors,
                                      int64_t partial_capacity, const GemvOptions& options = {});

}  // namespace petrel::cuda
