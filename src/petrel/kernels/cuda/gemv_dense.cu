// kernels/cuda: y = W x for a dense float weight matrix (F32, F16 or BF16, row-major [rows, cols]), for
// float checkpoints and tied LM heads. Not the deployment path (that is W4A16, gemv_gptq.cu), so it is kept
// simple: one warp per output row, each lane reading 16 bytes of the row at a time (8 half-precision or 4
// float32 weights) when the row starts 16-byte aligned and cols fills whole vectors, else one element at a
// time; lanes' float32 partial sums are reduced with shuffles. A row is read with fully used 512-byte warp
// transactions, so large matrices stream at a good fraction of the memory bandwidth; x (float32) is re-read
// by every warp and stays in L1/L2.
#include <cuda_runtime.h>

#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gemv_dense.h"

namespace petrel::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps, 8 rows per block
constexpr int kRowsPerBlock = kThreads / 32;

__device__ __forceinline__ float widen_half(uint32_t bits16, WeightType type) {
  const unsigned short b = static_cast<unsigned short>(bits16);
  return type == WeightType::kF16 ? __half2float(__ushort_as_half(b)) : __uint_as_float(uint32_t{b} << 16);
}

__global__ void __launch_bounds__(kThreads) gemv_dense_kernel(const void* w, WeightType type, int64_t rows, int64_t cols,
                                                              bool vectorized, const float* x, float* y) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  float sum = 0.0f;
  const int bytes = weight_type_bytes(type);
  if (vectorized) {
    const int per_vector = 16 / bytes;
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const char*>(w) + row * cols * bytes);
    const int64_t vectors = cols / per_vector;
    for (int64_t v = lane; v < vectors; v += 32) {
      const uint4 packed = __ldg(wr + v);
      const float* xv = x + v * per_vector;
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      if (type == WeightType::kF32) {
#pragma unroll
        for (int j = 0; j < 4; ++j) sum = fmaf(__uint_as_float(words[j]), xv[j], sum);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sum = fmaf(widen_half(words[j] & 0xFFFFu, type), xv[2 * j], sum);
          sum = fmaf(widen_half(words[j] >> 16, type), xv[2 * j + 1], sum);
        }
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) sum = fmaf(load_widened(w, type, row * cols + c), x[c], sum);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  if (lane == 0) y[row] = sum;
}

}  // namespace

Status gemv_dense(const DeviceDenseMatrix& w, const float* x, float* y, Stream stream) {
  PETREL_ASSIGN_OR_RETURN(WeightType type, weight_type(w.dtype, "cuda::gemv_dense"));
  if (w.rows <= 0 || w.cols <= 0) {
    return invalid_argument("cuda::gemv_dense: empty matrix [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]");
  }
  if (!w.data || !x || !y) return invalid_argument("cuda::gemv_dense: null device pointer");
  const int64_t row_bytes = w.cols * weight_type_bytes(type);
  const bool vectorized = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  const int64_t blocks = (w.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  gemv_dense_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(w.data, type, w.rows, w.cols, vectorized, x, y);
  return cuda_status(cudaGetLastError(), "gemv_dense launch");
}

}  // namespace petrel::cuda
