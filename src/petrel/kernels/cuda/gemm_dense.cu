// kernels/cuda: the dense matrix product y = x w^T of many rows through cuBLAS, and the float32 -> f16/bf16
// conversion that stages x for it (and for gemm_gptq's dequantize-then-cuBLAS path).
//
// Row-major y[m, rows] = x[m, cols] w[rows, cols]^T is, in cuBLAS's column-major terms, the product
// Y (rows x m, leading dimension rows) = op_T(W) (W seen as cols x rows, ld cols) * X (cols x m, ld cols):
// no transposes in memory, one call.
// - F32 weights: cublasSgemm with float32 x, float32 products (the handle's default math mode: no TF32).
// - F16/BF16 weights: x converted to the weights' dtype in the workspace, then cublasGemmEx with float32
//   output and CUBLAS_COMPUTE_32F; m is cut into pieces whose converted x fits the scratch.
// cuBLAS gets the workspace's own memory (cublasSetWorkspace) on every call, so that it allocates nothing
// itself and the call can be captured into a CUDA graph.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "petrel/kernels/cuda/blas_check.h"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/gemm.h"

namespace petrel::cuda {

namespace {

constexpr int kConvertThreads = 256;

template <typename T>
__device__ __forceinline__ T round_to(float v);
template <>
__device__ __forceinline__ __half round_to<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Four floats in, four 2-byte values out per thread-iteration; `vectorized` needs x and out 16- and 8-byte
// aligned; the last n % 4 elements (or all, unvectorized) one at a time.
template <typename T>
__global__ void __launch_bounds__(kConvertThreads) convert_kernel(const float* x, int64_t n, T* out, bool vectorized) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    const int64_t quads = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t i = first; i < quads; i += stride) {
      const float4 v = __ldg(x4 + i);
      struct alignas(8) Four { T v[4]; } packed;
      packed.v[0] = round_to<T>(v.x);
      packed.v[1] = round_to<T>(v.y);
      packed.v[2] = round_to<T>(v.z);
      packed.v[3] = round_to<T>(v.w);
      reinterpret_cast<Four*>(out)[i] = packed;
    }
    done = quads * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) out[i] = round_to<T>(x[i]);
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

Status GemmWorkspace::bind_blas(Stream stream) {
  BlasHandle& handle = blas();
  PETREL_RETURN_IF_ERROR(handle.set_stream(stream));
  // cublasSetStream resets the workspace to cuBLAS's own pool: hand it ours again after every rebind.
  PETREL_BLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(handle.get(), blas_workspace(), static_cast<size_t>(blas_workspace_bytes())),
      "cublasSetWorkspace");
  return ok_status();
}

Status convert_floats(const float* x, int64_t n, DType dtype, void* out, Stream stream) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return invalid_argument("convert_floats: dtype must be F16 or BF16, not " + std::string(dtype_name(dtype)));
  }
  if (n < 0) return invalid_argument("convert_floats: negative count");
  if (n == 0) return ok_status();
  if (!x || !out) return invalid_argument("convert_floats: null device pointer");
  const bool vectorized = aligned(x, 16) && aligned(out, 8);
  // A few waves of blocks; each thread loops over the rest.
  const int64_t work = vectorized ? (n + 3) / 4 : n;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((work + kConvertThreads - 1) / kConvertThreads, 1, 4096));
  if (dtype == DType::kF16) {
    convert_kernel<__half><<<blocks, kConvertThreads, 0, stream>>>(x, n, static_cast<__half*>(out), vectorized);
  } else {
    convert_kernel<__nv_bfloat16><<<blocks, kConvertThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out), vectorized);
  }
  return cuda_status(cudaGetLastError(), "convert_floats launch (" + std::to_string(n) + " values)");
}

Status gemm_dense(const DeviceDenseMatrix& w, const float* x, int64_t m, float* y, GemmWorkspace& workspace,
                  Stream stream) {
  const std::string what = "gemm_dense (" + std::string(dtype_name(w.dtype)) + " [" + std::to_string(w.rows) + ", " +
                           std::to_string(w.cols) + "], m = " + std::to_string(m) + ")";
  if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16) {
    return unsupported(what + ": weights must be F32, F16 or BF16");
  }
  if (w.rows <= 0 || w.cols <= 0) return invalid_argument(what + ": empty matrix");
  if (m < 1) return invalid_argument(what + ": m must be >= 1");
  constexpr int64_t kIntMax = 0x7FFFFFFF;  // cuBLAS takes int dimensions
  if (w.rows > kIntMax || w.cols > kIntMax) return unsupported(what + ": dimensions beyond cuBLAS's int");
  if (!w.data || !x || !y) return invalid_argument(what + ": null device pointer");
  if (!aligned(x, 16) || !aligned(y, 16)) return invalid_argument(what + ": x and y must be 16-byte aligned");
  PETREL_RETURN_IF_ERROR(workspace.bind_blas(stream).with_context(what));
  cublasHandle_t handle = workspace.blas().get();
  const float one = 1.0f, zero = 0.0f;
  const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);

  if (w.dtype == DType::kF32) {
    for (int64_t m0 = 0; m0 < m; m0 += kIntMax) {
      const int n = static_cast<int>(std::min(m - m0, kIntMax));
      PETREL_BLAS_RETURN_IF_ERROR(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one,
                                              static_cast<const float*>(w.data), cols, x + m0 * w.cols, cols, &zero,
                                              y + m0 * w.rows, rows),
                                  "cublasSgemm " + what);
    }
    return ok_status();
  }

  // x in the weights' dtype, as many tokens at a time as the scratch holds (a multiple of 4 tokens, so that
  // every piece of x after the first stays 16-byte aligned).
  int64_t chunk = std::min<int64_t>(workspace.capacity() / (2 * w.cols), kIntMax);
  if (chunk >= 4 && chunk < m) chunk = chunk / 4 * 4;
  if (chunk < 1) {
    return out_of_range(what + ": the workspace's " + std::to_string(workspace.capacity()) +
                        " bytes hold less than one token of converted x (" + std::to_string(2 * w.cols) + " bytes)");
  }
  const cudaDataType_t type = w.dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  for (int64_t m0 = 0; m0 < m; m0 += chunk) {
    const int n = static_cast<int>(std::min(chunk, m - m0));
    PETREL_RETURN_IF_ERROR(convert_floats(x + m0 * w.cols, n * w.cols, w.dtype, workspace.scratch(), stream));
    PETREL_BLAS_RETURN_IF_ERROR(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w.data, type, cols,
                                             workspace.scratch(), type, cols, &zero, y + m0 * w.rows, CUDA_R_32F, rows,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                "cublasGemmEx " + what);
  }
  return ok_status();
}

}  // namespace petrel::cuda
