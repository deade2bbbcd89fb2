// kernels/cuda GEMV, host side: what the kernel accepts, how a launch is cut, uploads and the workspace.
// Plain C++ (built with or without CUDA); the kernels and the launch are in gemv_gptq.cu.
#include "petrel/kernels/cuda/gemv_gptq.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace petrel::cuda {

namespace {

// Shape of the launch (gemv_gptq.cu's header comment gives the reasoning and the measurements):
// a block wants enough steps to amortize staging x and the split-K epilogue, and the grid wants a few blocks
// per multiprocessor so that every SM has loads in flight.
constexpr int kWordsPerStep = 4;          // packed input words per warp step (one per thread of a quad)
constexpr int kTargetBlocksPerSm = 4;
constexpr int64_t kMinStepsPerSplit = 8;
// The default shared-memory limit (no opt-in needed), less the 16 KB of x the RMSNorm-fused kernels keep in
// static shared memory (gemv_gptq.cu): what is left for the staged slice of x.
constexpr int64_t kMaxSharedBytes = 48 * 1024 - 16 * 1024;

std::string shape_string(const DeviceGptqMatrix& w) {
  return std::to_string(w.bits) + "-bit [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] group " +
         std::to_string(w.group_size);
}

// Bytes of staged x per packed input word: fp16 for the tensor-core kernel, float32 for the CUDA-core one.
int64_t staged_bytes_per_word(int bits, GemvAlgorithm algorithm) {
  const int64_t codes = 32 / bits;
  return codes * (algorithm == GemvAlgorithm::kCudaCore ? 4 : 2);
}

}  // namespace

Status gemv_gptq_supports(const DeviceGptqMatrix& w) {
  const std::string what = "gemv_gptq: " + shape_string(w);
  if (w.bits != 4 && w.bits != 8) return unsupported(what + ": only 4- and 8-bit weights");
  if (w.rows <= 0 || w.cols <= 0) return invalid_argument(what + ": empty matrix");
  if (w.rows % 4 != 0) return unsupported(what + ": rows must be a multiple of 4");
  const int per_word = 32 / w.bits;
  if (w.cols % per_word != 0) return invalid_argument(what + ": cols must be a multiple of " + std::to_string(per_word));
  if (w.group_size != w.cols) {
    if (w.group_size <= 0 || w.group_size % (kWordsPerStep * per_word) != 0 || w.cols % w.group_size != 0) {
      return unsupported(what + ": group size must be per-channel or a multiple of " +
                         std::to_string(kWordsPerStep * per_word) + " that divides cols");
    }
  }
  if (w.zero_offset != 0 && w.zero_offset != 1) return invalid_argument(what + ": zero_offset must be 0 or 1");
  return ok_status();
}

namespace {

// The plan for `row_blocks` blocks of rows that all read an input of w.cols (one matrix, or a group of them).
Result<GemvPlan> plan_row_blocks(const DeviceGptqMatrix& w, int64_t row_blocks, int multiprocessors,
                                 int64_t partial_capacity, const GemvOptions& options, const std::string& what) {
  const int64_t words = w.cols / (32 / w.bits);
  const int64_t steps = (words + kWordsPerStep - 1) / kWordsPerStep;
  const int64_t step_bytes = kWordsPerStep * staged_bytes_per_word(w.bits, options.algorithm);
  // Partial sums are laid out per block of rows (row_blocks * kRowsPerBlock per slice).
  const int64_t padded_rows = row_blocks * GemvPlan::kRowsPerBlock;
  GemvPlan plan;
  plan.row_blocks = row_blocks;
  // The slice of x a block stages must fit in shared memory: a lower bound on the splits.
  const int64_t min_splits = (steps * step_bytes + kMaxSharedBytes - 1) / kMaxSharedBytes;
  int64_t splits = options.k_splits;
  if (splits <= 0) {
    // The largest power of two that keeps the grid within the target: even slices, and the fastest choice
    // for every Llama-3.1-8B shape on the H200 (see gemv_gptq.cu).
    const int64_t target_blocks = int64_t{std::max(multiprocessors, 1)} * kTargetBlocksPerSm;
    splits = 1;
    while (2 * splits * plan.row_blocks <= target_blocks + plan.row_blocks / 2) splits *= 2;
    splits = std::min(splits, (steps + kMinStepsPerSplit - 1) / kMinStepsPerSplit);
    // The workspace bounds the partial sums; fewer splits only cost parallelism.
    if (splits > 1) splits = std::min(splits, std::max<int64_t>(1, partial_capacity / padded_rows));
  }
  splits = std::clamp<int64_t>(std::max(splits, min_splits), 1, steps);
  plan.steps_per_split = (steps + splits - 1) / splits;
  plan.k_splits = static_cast<int>((steps + plan.steps_per_split - 1) / plan.steps_per_split);
  plan.shared_bytes = plan.steps_per_split * step_bytes;
  plan.row_tiles_total = row_blocks;
  if (plan.k_splits > 1 && padded_rows * plan.k_splits > partial_capacity) {
    return out_of_range("gemv_gptq: " + what + " in " + std::to_string(plan.k_splits) + " input slices needs " +
                        std::to_string(padded_rows * plan.k_splits) + " partial sums, the workspace holds " +
                        std::to_string(partial_capacity));
  }
  return plan;
}

}  // namespace

Result<GemvPlan> plan_gemv_gptq(const DeviceGptqMatrix& w, int multiprocessors, int64_t partial_capacity,
                                const GemvOptions& options) {
  PETREL_RETURN_IF_ERROR(gemv_gptq_supports(w));
  const int64_t row_blocks = (w.rows + GemvPlan::kRowsPerBlock - 1) / GemvPlan::kRowsPerBlock;
  return plan_row_blocks(w, row_blocks, multiprocessors, partial_capacity, options, shape_string(w));
}

namespace {

// Members that may share a launch; their row tiles together, and a description for errors.
Status check_members(std::span<const GemvGroupMember> members, const char* function, int64_t& row_tiles,
                     std::string& what) {
  if (members.empty() || members.size() > static_cast<size_t>(kMaxGemvGroupMembers)) {
    return invalid_argument(std::string(function) + ": " + std::to_string(members.size()) + " matrices (1 to " +
                            std::to_string(kMaxGemvGroupMembers) + ")");
  }
  row_tiles = 0;
  what.clear();
  for (const GemvGroupMember& m : members) {
    if (!m.w) return invalid_argument(std::string(function) + ": a member without a matrix");
    PETREL_RETURN_IF_ERROR(gemv_gptq_supports(*m.w));
    const DeviceGptqMatrix& first = *members[0].w;
    if (m.w->bits != first.bits || m.w->cols != first.cols || m.w->group_size != first.group_size) {
      return invalid_argument(std::string(function) + ": " + shape_string(*m.w) + " cannot share a launch with " +
                              shape_string(first) + " (bits, cols and group size must agree)");
    }
    row_tiles += (m.w->rows + GemvPlan::kRowsPerBlock - 1) / GemvPlan::kRowsPerBlock;
    what += (what.empty() ? "" : " + ") + shape_string(*m.w);
  }
  return ok_status();
}

// Batch plans (gemv_gptq.cu's batch kernels). The kernels hold 16 float32 sums per n-tile and thread, and the
// staging of x keeps 64 registers of loads in flight (151 to 165 registers for 1 or 2 n-tiles, 168 for 3,
// 200 for 4; sm_90, 2026-12-03), so 3 blocks of 128 threads fit an SM up to 24 tokens and 2 beyond.
int batch_blocks_per_sm(int64_t tokens) { return tokens <= 24 ? 3 : 2; }

// Bytes per token of a batch kernel's staged slice of x (fp16 fragments, 16 bytes a packed word), rounded so
// that consecutive tokens start 64 bytes apart modulo 128: the 8 lanes of one shared-memory phase (2 tokens x
// 4 words) then hit 8 distinct 16-byte bank groups.
int64_t batch_stride_bytes(int64_t slice_words) {
  const int64_t bytes = slice_words * 16;
  return bytes % 128 == 64 ? bytes : (bytes + 63) / 128 * 128 + 64;
}

}  // namespace

Result<GemvPlan> plan_gemv_gptq_batch(std::span<const GemvGroupMember> members, int64_t tokens, int multiprocessors,
                                      int64_t partial_capacity, const GemvOptions& options) {
  int64_t tiles = 0;
  std::string what;
  PETREL_RETURN_IF_ERROR(check_members(members, "gemv_gptq_batch", tiles, what));
  const DeviceGptqMatrix& w = *members[0].w;
  if (tokens < 1 || tokens > kMaxGemvTokens) {
    return invalid_argument("gemv_gptq_batch: " + std::to_string(tokens) + " tokens (1 to " +
                            std::to_string(kMaxGemvTokens) + ")");
  }
  if (w.bits != 4) return unsupported("gemv_gptq_batch: " + what + ": only 4-bit weights");
  if (options.algorithm != GemvAlgorithm::kTensorCore) return unsupported("gemv_gptq_batch: the tensor-core kernel only");
  if (options.row_tiles < 0) return invalid_argument("gemv_gptq_batch: row_tiles must be >= 0");
  const int64_t token_slots = (tokens + 7) / 8 * 8;
  const int64_t words = w.cols / 8;
  const int64_t steps = (words + kWordsPerStep - 1) / kWordsPerStep;
  GemvPlan plan;
  plan.row_tiles_total = tiles;
  // Longer runs of rows per staged x save L2 reads of x (tokens * 4 bytes per input per block against 64
  // bytes of weights per input per row tile) but leave fewer blocks to spread.
  plan.row_tiles = options.row_tiles > 0 ? options.row_tiles : (tiles >= 64 ? 2 : 1);
  plan.row_tiles = std::min(plan.row_tiles, tiles);
  plan.row_blocks = (tiles + plan.row_tiles - 1) / plan.row_tiles;
  auto shared_for = [&](int64_t steps_per_split) { return token_slots * batch_stride_bytes(steps_per_split * kWordsPerStep); };
  int64_t splits = options.k_splits;
  if (splits <= 0) {
    // Up to two waves of blocks, and partial sums (written and read back: 8 bytes per token, row and split)
    // no more bytes than the weights (half a byte per row and input). Measured on the H200 at 29 tokens
    // (petrel_bench_gemm_cuda --max-m 32 --sweep, 2026-12-03), the fastest of 1 to 16 splits and 1, 2 or 4
    // row tiles for Llama-3.1-8B's q/o (8 splits), k/v (8), down (16) and gate/up (4 splits of 2 row tiles).
    const int64_t max_blocks = 2 * int64_t{std::max(multiprocessors, 1)} * batch_blocks_per_sm(tokens);
    const int64_t max_splits = std::max<int64_t>(1, w.cols / (16 * tokens));
    splits = 1;
    while (2 * splits * plan.row_blocks <= max_blocks && 2 * splits <= max_splits) splits *= 2;
    splits = std::min(splits, (steps + kMinStepsPerSplit - 1) / kMinStepsPerSplit);
    const int64_t per_split = tiles * GemvPlan::kRowsPerBlock * tokens;
    if (splits > 1) splits = std::min(splits, std::max<int64_t>(1, partial_capacity / per_split));
  }
  splits = std::clamp<int64_t>(splits, 1, steps);
  while (splits < steps && shared_for((steps + splits - 1) / splits) > GemvPlan::kMaxBatchSharedBytes) ++splits;
  plan.steps_per_split = (steps + splits - 1) / splits;
  plan.k_splits = static_cast<int>((steps + plan.steps_per_split - 1) / plan.steps_per_split);
  plan.x_stride_bytes = batch_stride_bytes(plan.steps_per_split * kWordsPerStep);
  plan.shared_bytes = token_slots * plan.x_stride_bytes;
  if (plan.shared_bytes > GemvPlan::kMaxBatchSharedBytes) {
    return out_of_range("gemv_gptq_batch: " + what + ": a slice of x for " + std::to_string(tokens) +
                        " tokens needs " + std::to_string(plan.shared_bytes) + " bytes of shared memory");
  }
  const int64_t partials = int64_t{plan.k_splits} * tiles * GemvPlan::kRowsPerBlock * tokens;
  if (plan.k_splits > 1 && partials > partial_capacity) {
    return out_of_range("gemv_gptq_batch: " + what + " in " + std::to_string(plan.k_splits) + " input slices for " +
                        std::to_string(tokens) + " tokens needs " + std::to_string(partials) +
                        " partial sums, the workspace holds " + std::to_string(partial_capacity));
  }
  return plan;
}

Result<GemvPlan> plan_gemv_gptq_grouped(std::span<const GemvGroupMember> members, int multiprocessors,
                                        int64_t partial_capacity, const GemvOptions& options) {
  int64_t row_blocks = 0;
  std::string what;
  PETREL_RETURN_IF_ERROR(check_members(members, "gemv_gptq_grouped", row_blocks, what));
  return plan_row_blocks(*members[0].w, row_blocks, multiprocessors, partial_capacity, options, what);
}

namespace {

// The stored zero every row of every group has, or -1 (DeviceGptqMatrix::uniform_zero): every zeros word compared
// with the first zero repeated (~27 MB of words for 8B at group 128, which upload reads anyway; not timed). Rows
// that do not fill whole words (which GPTQ packing refuses) count as not uniform: the general build reads them.
int uniform_stored_zero(const ref::GptqMatrix& m) {
  const int per_word = 32 / m.bits;
  if (!m.qzeros || m.n_groups() == 0 || m.rows == 0 || m.rows % per_word != 0) return -1;
  const uint32_t zero = static_cast<uint32_t>(m.qzeros[0]) & ((1u << m.bits) - 1);
  uint32_t word = 0;
  for (int i = 0; i < per_word; ++i) word |= zero << (m.bits * i);
  const int64_t words = m.n_groups() * (m.rows / per_word);
  for (int64_t i = 0; i < words; ++i) {
    if (static_cast<uint32_t>(m.qzeros[i]) != word) return -1;
  }
  return static_cast<int>(zero);
}

}  // namespace

Result<DeviceGptqWeights> DeviceGptqWeights::upload(const ref::GptqMatrix& host, HostUploader* uploader) {
  DeviceGptqWeights weights;
  DeviceGptqMatrix& v = weights.view_;
  v.bits = host.bits;
  v.rows = host.rows;
  v.cols = host.cols;
  v.group_size = host.group_size;
  v.zero_offset = host.zero_offset;
  v.uniform_zero = uniform_stored_zero(host);
  if (host.g_idx) {
    // A g_idx that is column / group_size (what petrel writes) is accepted by ref::GptqMatrix::view() as null;
    // a real act-order permutation would need the columns regrouped at export.
    for (int64_t c = 0; c < host.cols; ++c) {
      if (host.g_idx[c] != c / host.group_size) {
        return unsupported("gemv_gptq: act-order (a g_idx that permutes groups) is not supported on CUDA");
      }
    }
  }
  PETREL_RETURN_IF_ERROR(gemv_gptq_supports(v));
  const size_t qweight_bytes = static_cast<size_t>(host.cols / (32 / host.bits) * host.rows) * 4;
  const size_t scales_bytes = static_cast<size_t>(host.n_groups() * host.rows) * 2;
  const size_t qzeros_bytes = static_cast<size_t>(host.n_groups() * (host.rows * host.bits / 32)) * 4;
  PETREL_ASSIGN_OR_RETURN(weights.qweight_, DeviceBuffer::allocate(qweight_bytes));
  PETREL_ASSIGN_OR_RETURN(weights.scales_, DeviceBuffer::allocate(scales_bytes));
  PETREL_ASSIGN_OR_RETURN(weights.qzeros_, DeviceBuffer::allocate(qzeros_bytes));
  // A CPU bundle pads qweight's word rows (GptqMatrix::stride()); the device copy is dense, as the kernels read it.
  // The uploader gathers the rows into its pinned chunks (a dense host copy first made a CPU bundle's load on
  // the GPU 2.5-3.0 s against 0.9-1.0 for a cuda bundle: session 25).
  const int64_t words = host.cols / (32 / host.bits);
  const int32_t* qweight = host.qweight;
  std::vector<int32_t> dense;
  if (host.stride() != host.rows && !uploader) {
    dense.resize(static_cast<size_t>(words * host.rows));
    for (int64_t k = 0; k < words; ++k) {
      std::memcpy(dense.data() + k * host.rows, host.qweight + k * host.stride(), static_cast<size_t>(host.rows) * 4);
    }
    qweight = dense.data();
  }
  if (uploader) {
    PETREL_RETURN_IF_ERROR(uploader->copy_rows(weights.qweight_.data(), qweight, static_cast<size_t>(host.rows) * 4,
                                               static_cast<size_t>(host.stride()) * 4, static_cast<size_t>(words)));
    PETREL_RETURN_IF_ERROR(uploader->copy(weights.scales_.data(), host.scales, scales_bytes));
    PETREL_RETURN_IF_ERROR(uploader->copy(weights.qzeros_.data(), host.qzeros, qzeros_bytes));
  } else {
    PETREL_RETURN_IF_ERROR(weights.qweight_.upload(qweight, qweight_bytes));
    PETREL_RETURN_IF_ERROR(weights.scales_.upload(host.scales, scales_bytes));
    PETREL_RETURN_IF_ERROR(weights.qzeros_.upload(host.qzeros, qzeros_bytes));
  }
  v.qweight = weights.qweight_.as<const int32_t>();
  v.scales = weights.scales_.as<const uint16_t>();
  v.qzeros = weights.qzeros_.as<const int32_t>();
  return weights;
}

Result<GemvWorkspace> GemvWorkspace::create(int64_t partial_floats) {
  PETREL_ASSIGN_OR_RETURN(int device, current_device());
  PETREL_ASSIGN_OR_RETURN(DeviceInfo info, device_info(device));
  GemvWorkspace ws;
  ws.multiprocessors_ = info.multiprocessors;
  ws.partial_floats_ = std::max<int64_t>(partial_floats, 0);
  // A split launch has at least 2 slices, so it has at most partial_floats / 2 rows and as many row blocks
  // as that divided by the block's rows.
  ws.counters_ = ws.partial_floats_ / 2 / GemvPlan::kRowsPerBlock + 1;
  PETREL_ASSIGN_OR_RETURN(ws.partials_, DeviceBuffer::allocate(static_cast<size_t>(ws.partial_floats_) * 4));
  PETREL_ASSIGN_OR_RETURN(ws.counter_buffer_, DeviceBuffer::allocate(static_cast<size_t>(ws.counters_) * 4));
  PETREL_RETURN_IF_ERROR(ws.counter_buffer_.fill_bytes(0));  // the kernels leave them at 0 again
  return ws;
}

}  // namespace petrel::cuda
