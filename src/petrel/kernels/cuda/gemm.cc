// kernels/cuda GEMM, host side: the workspace, what gemm_gptq accepts and how it cuts a product. Plain C++
// (built with or without CUDA); the kernels and the launches are in gemm_gptq.cu and gemm_dense.cu.
#include <algorithm>
#include <string>

#include "petrel/kernels/cuda/gemm.h"

namespace petrel::cuda {

namespace {

constexpr int64_t kCounters = int64_t{1} << 16;       // split-K arrival counters: one per (row block, token tile)
constexpr int64_t kBlasWorkspaceBytes = int64_t{32} << 20;  // what NVIDIA's cuBLAS notes advise for Hopper
constexpr int64_t kAlignment = 256;  // sub-buffers of the scratch start at cudaMalloc's alignment

int64_t align_up(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string shape_string(const DeviceGptqMatrix& w, int64_t m) {
  return std::to_string(w.bits) + "-bit [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] group " +
         std::to_string(w.group_size) + ", m = " + std::to_string(m);
}

// Blocks of the fused kernel resident on one SM: bounded by shared memory (228 KB an SM, 1 KB reserved a
// block) and registers (64K an SM; ptxas's counts for sm_90a: at most 98 a thread for tiles of 8 or 16
// tokens, 128 for 32, 176 for 64).
int64_t resident_blocks(const GemmPlan& plan) {
  const int64_t by_shared = (228 * 1024) / (plan.shared_bytes + 1024);
  const int64_t registers = plan.token_tile <= 16 ? 104 : plan.token_tile == 32 ? 128 : 176;
  const int64_t by_registers = 65536 / (32 * plan.warps * registers);
  return std::clamp<int64_t>(std::min(by_shared, by_registers), 1, 8);
}

Result<GemmPlan> plan_tensor_core(const DeviceGptqMatrix& w, int64_t m, int multiprocessors, int64_t scratch_capacity,
                                  int64_t counter_capacity, const GemmOptions& options) {
  // Messages are built only on error: planning runs on every call.
  const auto what = [&] { return "gemm_gptq (tensor core): " + shape_string(w, m); };
  GemmPlan plan;
  plan.algorithm = GemmAlgorithm::kTensorCore;
  const int64_t words = w.cols * w.bits / 32;
  const int64_t steps = ceil_div(words, GemmPlan::kWordsPerStep);
  const int64_t chunks = ceil_div(steps, GemmPlan::kChunkSteps);
  const int64_t words_padded = chunks * GemmPlan::kChunkSteps * GemmPlan::kWordsPerStep;
  const int64_t x_bytes_per_token = words_padded * GemmPlan::fragment_bytes(w.bits);

  // Defaults from the H200 sweep (bench/README.md, petrel_bench_gemm_cuda --sweep): the smallest tile that
  // holds m up to 32 tokens; beyond, 64-token tiles for the large matrices (gate/up, down) and 32 for the
  // others; 16 for k/v-sized matrices (<= 2048 rows), whose few row blocks want more token tiles instead.
  const bool large = w.rows * w.cols >= (int64_t{32} << 20);
  const int default_tile = m <= 8 ? 8 : m <= 16 || w.rows <= 2048 ? 16 : m <= 32 ? 32 : large ? 64 : 32;
  plan.token_tile = options.token_tile > 0 ? options.token_tile : default_tile;
  if (plan.token_tile != 8 && plan.token_tile != 16 && plan.token_tile != 32 && plan.token_tile != 64) {
    return invalid_argument(what() + ": token_tile must be 8, 16, 32 or 64, not " + std::to_string(plan.token_tile));
  }
  // 8 warps (256 rows a block) only for 32-token tiles of the many-row matrices or beyond 64 tokens.
  const int default_warps = plan.token_tile == 32 && (w.rows >= 8192 || m > 64) ? 8 : 4;
  plan.warps = options.warps > 0 ? options.warps : default_warps;
  if (plan.warps != 4 && plan.warps != 8) {
    return invalid_argument(what() + ": warps must be 4 or 8, not " + std::to_string(plan.warps));
  }
  if (options.k_splits < 0) return invalid_argument(what() + ": k_splits must be >= 0");
  // A matrix with few rows at a moderate m (k/v_proj's 1024 rows at m = 64) would leave SMs idle with the
  // big tile even at the most splits: fall back to 4 warps, then to smaller token tiles.
  const auto most_blocks = [&] {
    return ceil_div(w.rows, 32 * plan.warps) * ceil_div(m, plan.token_tile) * chunks;
  };
  while (most_blocks() < multiprocessors) {
    if (options.warps == 0 && plan.warps == 8) plan.warps = 4;
    else if (options.token_tile == 0 && plan.token_tile > 8) plan.token_tile /= 2;
    else break;
  }
  // 3 stages measured 0-10% slower than 2 for tiles of 16 to 64 tokens; 8-token tiles were timed with 3 only.
  // One tile of 32 tokens in 8 warps (a short prompt through gate+up as one launch, or through any matrix of
  // >= 8192 rows) takes 3: the 157 KB of shared memory hold it to one block an SM, and the split rule below then
  // gives one block an SM, no split-K (gate+up at m = 29 on the H200, 2026-12-03: the 29-token prompt 4.39 ->
  // 4.31 ms per channel, 4.78 -> 4.75 at group 128, petrel_bench_decode_cuda --prompt 29). The same single
  // split with 2 stages was faster alone (gemm bench: 43.7 against 47.8 us with 2 splits) but 0.7 ms slower in
  // the prompt: overlapped with the kernels before it, the scheduler put two of its blocks on some SMs.
  const bool one_tile_32x8 = ceil_div(m, plan.token_tile) == 1 && plan.token_tile == 32 && plan.warps == 8;
  plan.stages = options.stages > 0 ? options.stages : plan.token_tile == 8 || one_tile_32x8 ? 3 : 2;
  if (plan.stages != 2 && plan.stages != 3) {
    return invalid_argument(what() + ": stages must be 2 or 3, not " + std::to_string(plan.stages));
  }
  plan.row_blocks = ceil_div(w.rows, 32 * plan.warps);
  plan.shared_bytes = int64_t{plan.stages} * GemmPlan::stage_bytes(w.bits, plan.token_tile, plan.warps);

  // Splits: the largest power of two that keeps the grid within the blocks resident at once (as gemv_gptq's
  // plan), each split at least one chunk of 8 steps.
  const auto split_plan = [&](int64_t m_chunk, int64_t splits) {
    const int64_t tiles = ceil_div(m_chunk, plan.token_tile);
    if (splits <= 0) {
      const int64_t blocks = plan.row_blocks * tiles;
      const int64_t target = int64_t{std::max(multiprocessors, 1)} * resident_blocks(plan);
      splits = 1;
      while (2 * splits * blocks <= target + blocks / 2) splits *= 2;
    }
    splits = std::clamp<int64_t>(splits, 1, chunks);
    const int64_t chunks_per_split = ceil_div(chunks, splits);
    plan.steps_per_split = chunks_per_split * GemmPlan::kChunkSteps;
    plan.k_splits = static_cast<int>(ceil_div(chunks, chunks_per_split));
    plan.token_tiles = tiles;
    plan.m_chunk = m_chunk;
    plan.scratch_bytes = align_up(m_chunk * x_bytes_per_token) +
                         (plan.k_splits > 1 ? align_up(int64_t{plan.k_splits} * m_chunk * w.rows * 4) : 0);
  };
  split_plan(m, options.k_splits);
  if (plan.k_splits > 1 && plan.row_blocks * plan.token_tiles > counter_capacity) split_plan(m, 1);
  if (plan.scratch_bytes > scratch_capacity && plan.k_splits > 1) split_plan(m, 1);
  if (plan.scratch_bytes > scratch_capacity) {
    // Fewer tokens per launch, in whole tiles.
    const int64_t fit = scratch_capacity / x_bytes_per_token / plan.token_tile * plan.token_tile;
    if (fit < std::min<int64_t>(m, plan.token_tile)) {
      return out_of_range(what() + ": the workspace's " + std::to_string(scratch_capacity) + " bytes hold less than " +
                          std::to_string(plan.token_tile) + " tokens of staged x (" +
                          std::to_string(x_bytes_per_token) + " bytes each)");
    }
    split_plan(std::min(m, fit), 1);
  }
  if (options.k_splits > 1 && plan.k_splits != std::min<int64_t>(options.k_splits, chunks)) {
    return out_of_range(what() + ": " + std::to_string(options.k_splits) +
                        " splits do not fit the workspace's scratch or counters");
  }
  return plan;
}

Result<GemmPlan> plan_dequant_cublas(const DeviceGptqMatrix& w, int64_t m, int64_t scratch_capacity) {
  GemmPlan plan;
  plan.algorithm = GemmAlgorithm::kDequantCublas;
  const int64_t row_bytes = w.cols * 2;  // one row of fp16 W, or one token of fp16 x
  // At least this many rows per cuBLAS call before m is cut instead: thinner slices waste the tensor cores.
  const int64_t min_slice = std::min<int64_t>(w.rows, 64);
  plan.m_chunk = m;
  if (align_up(m * row_bytes) + min_slice * row_bytes > scratch_capacity) {
    plan.m_chunk = (scratch_capacity - kAlignment - min_slice * row_bytes) / row_bytes;
    if (plan.m_chunk < 1) {
      return out_of_range("gemm_gptq (dequant + cuBLAS): " + shape_string(w, m) + ": the workspace's " +
                          std::to_string(scratch_capacity) + " bytes hold less than one token of fp16 x and " +
                          std::to_string(min_slice) + " rows of fp16 W");
    }
  }
  const int64_t x_bytes = align_up(plan.m_chunk * row_bytes);
  plan.slice_rows = std::min(w.rows, (scratch_capacity - x_bytes) / row_bytes);
  if (plan.slice_rows < w.rows) plan.slice_rows = plan.slice_rows / 8 * 8;  // slices start 32-byte aligned in y
  plan.scratch_bytes = x_bytes + plan.slice_rows * row_bytes;
  return plan;
}

}  // namespace

struct GemmWorkspace::Impl {
  DeviceBuffer scratch, counters, blas_workspace;
  BlasHandle blas;
  int multiprocessors = 0;
};

Result<GemmWorkspace> GemmWorkspace::create(int64_t bytes) {
  PETREL_ASSIGN_OR_RETURN(int device, current_device());
  PETREL_ASSIGN_OR_RETURN(DeviceInfo info, device_info(device));
  auto impl = std::make_shared<Impl>();
  impl->multiprocessors = info.multiprocessors;
  PETREL_ASSIGN_OR_RETURN(impl->scratch, DeviceBuffer::allocate(static_cast<size_t>(std::max<int64_t>(bytes, kAlignment))));
  PETREL_ASSIGN_OR_RETURN(impl->counters, DeviceBuffer::allocate(static_cast<size_t>(kCounters) * 4));
  PETREL_RETURN_IF_ERROR(impl->counters.fill_bytes(0));  // the kernels leave them at 0 again
  PETREL_ASSIGN_OR_RETURN(impl->blas_workspace, DeviceBuffer::allocate(static_cast<size_t>(kBlasWorkspaceBytes)));
  PETREL_ASSIGN_OR_RETURN(impl->blas, BlasHandle::create());
  GemmWorkspace workspace;
  workspace.impl_ = std::move(impl);
  return workspace;
}

int64_t GemmWorkspace::capacity() const { return impl_ ? static_cast<int64_t>(impl_->scratch.size()) : 0; }
void* GemmWorkspace::scratch() const { return impl_ ? impl_->scratch.data() : nullptr; }
BlasHandle& GemmWorkspace::blas() {
  static BlasHandle none;  // a workspace that was never created: calls through it fail with "no handle"
  return impl_ ? impl_->blas : none;
}
int GemmWorkspace::multiprocessors() const { return impl_ ? impl_->multiprocessors : 0; }
uint32_t* GemmWorkspace::counters() const { return impl_ ? impl_->counters.as<uint32_t>() : nullptr; }
int64_t GemmWorkspace::counter_capacity() const { return impl_ ? static_cast<int64_t>(impl_->counters.size() / 4) : 0; }
void* GemmWorkspace::blas_workspace() const { return impl_ ? impl_->blas_workspace.data() : nullptr; }
int64_t GemmWorkspace::blas_workspace_bytes() const {
  return impl_ ? static_cast<int64_t>(impl_->blas_workspace.size()) : 0;
}

Status gemm_gptq_supports(const DeviceGptqMatrix& w) {
  const Status status = gemv_gptq_supports(w);  // "gemv_gptq: <shape>: <what does not fit>"
  if (!status.ok()) {
    const std::string prefix = "gemv_gptq: ";
    const std::string& message = status.message();
    return Status(status.code(), "gemm_gptq: " + (message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message));
  }
  if (w.bits == 4 && w.rows % 8 != 0) {
    return unsupported("gemm_gptq: 4-bit [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                       "]: rows must be a multiple of 8 (qzeros packs 8 rows per int32 word)");
  }
  return ok_status();
}

GemmAlgorithm auto_gemm_algorithm(const DeviceGptqMatrix& w, int64_t m) {
  // Crossovers measured on the H200 (CUDA graph replay, bench/README.md): dequant + cuBLAS overtakes the fused
  // kernel between m = 128 and 256 for Llama-3.1-8B's 4096x4096, 14336x4096 and 4096x14336 (interpolated
  // ~150-200), and between 32 and 64 for 1024x4096 (a tie at 64), whose dequantization is cheap.
  const bool small = w.rows * w.cols < (int64_t{16} << 20);
  return m <= (small ? 48 : 160) ? GemmAlgorithm::kTensorCore : GemmAlgorithm::kDequantCublas;
}

Result<GemmPlan> plan_gemm_gptq(const DeviceGptqMatrix& w, int64_t m, int multiprocessors, int64_t scratch_capacity,
                                int64_t counter_capacity, const GemmOptions& options) {
  PETREL_RETURN_IF_ERROR(gemm_gptq_supports(w));
  if (m < 1) return invalid_argument("gemm_gptq: m must be >= 1, got " + std::to_string(m));
  const GemmAlgorithm algorithm =
      options.algorithm == GemmAlgorithm::kAuto ? auto_gemm_algorithm(w, m) : options.algorithm;
  if (algorithm == GemmAlgorithm::kTensorCore) {
    return plan_tensor_core(w, m, multiprocessors, scratch_capacity, counter_capacity, options);
  }
  return plan_dequant_cublas(w, m, scratch_capacity);
}

}  // namespace petrel::cuda
