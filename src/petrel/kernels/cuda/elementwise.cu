// kernels/cuda: embedding lookup, SiLU(gate) * up and residual add: the token generator's element-wise ops,
// one thread per element (float32 [n] arrays; tables row-major [rows, cols] in their stored dtype).
// Numerics: widening is exact; silu uses expf (not the approximate __expf) and IEEE division, as ref::silu_mul.
// These move a few KB per call and are launch-bound; in the decode step they run inside a CUDA graph, and
// the residual adds are fused into RMSNorm (norm.cu), so add_in_place serves other callers and the tests.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "petrel/kernels/cuda/activation.cuh"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/programmatic_launch.cuh"

namespace petrel::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void embedding_kernel(const void* table, WeightType type, int64_t rows, int64_t cols, const int32_t* tokens,
                                 float* out) {
  const int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (c >= cols) return;
  const int32_t token = tokens[blockIdx.y];
  out[int64_t{blockIdx.y} * cols + c] = token >= 0 && token < rows ? load_widened(table, type, token * cols + c) : __int_as_float(0x7FC00000);
}

// A GPTQ table's row per token (petrel quantize --embedding-bits: a token is an output channel), dequantized
// as ref::GptqMatrix::row_to_f32 does (scale * (code - zero) in float32: the same bits as the CPU). One thread
// per packed word of a row; a row's words are `rows` words apart (GPTQ's [cols * bits / 32, rows] layout), so
// a lookup reads cols * bits / 32 scattered words a token (512 32-byte sectors, 16 KB, for Llama-3.1-8B at 4
// bits): nothing next to a decode step's weights, and the table stays at its stored size on the device.
__global__ void embedding_gptq_kernel(DeviceGptqMatrix table, const int32_t* tokens, float* out) {
  const int per_word = 32 / table.bits;
  const int64_t w = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (w >= table.cols / per_word) return;
  const int32_t token = tokens[blockIdx.y];
  float* row = out + int64_t{blockIdx.y} * table.cols + w * per_word;
  if (token < 0 || token >= table.rows) {
    for (int k = 0; k < per_word; ++k) row[k] = __int_as_float(0x7FC00000);
    return;
  }
  const uint32_t mask = (1u << table.bits) - 1;
  const int64_t g = w * per_word / table.group_size;
  const float scale = __half2float(__ushort_as_half(table.scales[g * table.rows + token]));
  const uint32_t zeros = static_cast<uint32_t>(table.qzeros[g * (table.rows * table.bits / 32) + token / per_word]);
  const int zero = static_cast<int>((zeros >> (table.bits * (token % per_word))) & mask) + table.zero_offset;
  const uint32_t word = static_cast<uint32_t>(table.qweight[w * table.rows + token]);
  for (int k = 0; k < per_word; ++k) {
    row[k] = __fmul_rn(scale, static_cast<float>(static_cast<int>((word >> (table.bits * k)) & mask) - zero));
  }
}

// values[i] = -infinity where bit i of `allowed` (bit i % 32 of word i / 32) is clear: a constraint's mask
// (JSON mode) applied on the device, between the LM head and the top-k choice.
__global__ void mask_kernel(float* values, const uint32_t* allowed, int64_t n) {
  allow_dependent_launch();
  wait_for_previous_kernel();
  const int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i >= n) return;
  if (!((allowed[i / 32] >> (i % 32)) & 1u)) values[i] = -INFINITY;
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  allow_dependent_launch();  // what follows waits for the previous kernel first (programmatic_launch.cuh)
  wait_for_previous_kernel();
  const int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i >= n) return;
  out[i] = silu_mul_value(gate[i], up[i]);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i < n) x[i] += y[i];
}

}  // namespace

Status embedding_lookup(const DeviceDenseMatrix& table, const int32_t* tokens, int64_t n_tokens, float* out,
                        Stream stream) {
  PETREL_ASSIGN_OR_RETURN(WeightType type, weight_type(table.dtype, "cuda::embedding_lookup"));
  if (table.rows <= 0 || table.cols <= 0 || n_tokens <= 0 || n_tokens > 65535) {
    return invalid_argument("cuda::embedding_lookup: table [" + std::to_string(table.rows) + ", " +
                            std::to_string(table.cols) + "], " + std::to_string(n_tokens) + " tokens");
  }
  if (!table.data || !tokens || !out) return invalid_argument("cuda::embedding_lookup: null device pointer");
  embedding_kernel<<<dim3(blocks_for(table.cols), static_cast<unsigned>(n_tokens)), kThreads, 0, stream>>>(
      table.data, type, table.rows, table.cols, tokens, out);
  return cuda_status(cudaGetLastError(), "embedding_lookup launch");
}

Status embedding_lookup_gptq(const DeviceGptqMatrix& table, const int32_t* tokens, int64_t n_tokens, float* out,
                             Stream stream) {
  const std::string shape = "cuda::embedding_lookup_gptq: table [" + std::to_string(table.rows) + ", " +
                            std::to_string(table.cols) + "] at " + std::to_string(table.bits) + " bits, group " +
                            std::to_string(table.group_size) + ", " + std::to_string(n_tokens) + " tokens";
  if (table.bits != 4 && table.bits != 8) return invalid_argument(shape + ": bits must be 4 or 8");
  const int per_word = 32 / table.bits;
  if (table.rows <= 0 || table.cols <= 0 || table.cols % per_word != 0 || table.group_size <= 0 ||
      table.group_size % per_word != 0 || table.rows % per_word != 0 || n_tokens <= 0 || n_tokens > 65535) {
    return invalid_argument(shape);
  }
  if (!table.qweight || !table.scales || !table.qzeros || !tokens || !out) return invalid_argument(shape + ": null device pointer");
  embedding_gptq_kernel<<<dim3(blocks_for(table.cols / per_word), static_cast<unsigned>(n_tokens)), kThreads, 0, stream>>>(
      table, tokens, out);
  return cuda_status(cudaGetLastError(), "embedding_lookup_gptq launch");
}

Status mask_logits(float* values, const uint32_t* allowed, int64_t n, Stream stream, bool overlap_previous) {
  if (n <= 0) return invalid_argument("cuda::mask_logits: " + std::to_string(n) + " values");
  if (!values || !allowed) return invalid_argument("cuda::mask_logits: null device pointer");
  return cuda_status(launch_kernel(mask_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, overlap_previous, values, allowed, n),
                     "mask_logits launch");
}

Status silu_mul(const float* gate, const float* up, int64_t n, float* out, Stream stream, bool overlap_previous) {
  if (n <= 0) return invalid_argument("cuda::silu_mul: " + std::to_string(n) + " elements");
  if (!gate || !up || !out) return invalid_argument("cuda::silu_mul: null device pointer");
  return cuda_status(launch_kernel(silu_mul_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, overlap_previous,
                                   gate, up, n, out),
                     "silu_mul launch");
}

Status add_in_place(float* x, const float* y, int64_t n, Stream stream) {
  if (n <= 0) return invalid_argument("cuda::add_in_place: " + std::to_string(n) + " elements");
  if (!x || !y) return invalid_argument("cuda::add_in_place: null device pointer");
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  return cuda_status(cudaGetLastError(), "add_in_place launch");
}

}  // namespace petrel::cuda
