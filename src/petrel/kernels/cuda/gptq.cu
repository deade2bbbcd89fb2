// kernels/cuda: GPTQ on the device (the reference implementation's `fasterquant`, as quant/gptq.cc does it on the
// CPU) and the float32 calibration forward around it. gptq.h has the contracts.
//
// What runs where.
//   Hessian        H += X^T X: cublasSsyrk, float32 (as the CPU's cblas_ssyrk), upper triangle of row-major H
//                  (= the lower one of cuBLAS's column-major view).
//   Inverse        float64, cuSOLVER: potrf (H + damp I = L L^T), potri ((H + damp I)^-1 in the lower
//                  triangle), potrf again: L' L'^T = H^-1. In column-major memory L' is exactly row-major U =
//                  L'^T, the upper factor with H^-1 = U^T U that fasterquant wants, so no transpose and no
//                  symmetrization is needed (potrf and potri read and write only the lower triangle). The host
//                  reads the diagonal (dead inputs, the mean for the damping, in the CPU's order) and each
//                  attempt's `info`; a not positive definite H retries with 10x the damping, as the CPU does.
//   Column loop    one launch per block of <= 128 columns, then the lazy update W[:, end:] -= Err U[block, end:]
//                  as one cublasSgemm (the GPTQ paper's "lazy batch updates").
//
// The in-block kernel. Rows of W are independent in GPTQ (U is shared, the errors are per row), so one warp
// owns one row: lane l keeps the block's columns l, l + 32, l + 64, l + 96 in registers, and U's block
// [count, count] sits in shared memory (64 KB at 128 columns; 8 warps = 8 rows share it). Column c is
// broadcast from its lane (shfl); every lane computes the same code, dequantized value and scaled error
// e = (w - q) / U[c, c] (cheaper than a second broadcast), the owner keeps them, and each lane updates its
// later columns w[j] -= e U[c, j] (U's row c read from shared memory by consecutive lanes: no bank conflicts).
// At a group's first column the warp writes its registers back to W and computes the group's scale and zero
// from global memory, so that a group that reaches past the block (group_size > block, or not dividing it)
// sees the lazily updated columns exactly as the CPU does. The sequential work per block is ~128 steps of ~60
// instructions per warp; the block products are the bulk (rows * cols^2 FLOP per matrix: 0.84 TFLOP for
// Llama-3.1-8B's down_proj).
//
// Scale and zero. A warp computes a group's parameters: min/max by shuffles (exact, order-free), then the
// clipping search over 26 ratios with the squared error summed per lane and across lanes by a butterfly (all
// lanes get the same bits). That summation order differs from the CPU's sequential sum, so on near-ties the
// chosen clip ratio can differ; everything else (fp16 rounding of the scale, round-half-even codes, the
// asymmetric zero clamp) is format.cc's arithmetic written with explicit _rn intrinsics so that nvcc does not
// contract it into FMAs the CPU build (x86-64 baseline, no FMA) does not use.
//
// Numerics against quant::quantize_gptq (CPU, same W and H): on the H200 all codes were identical in the seven
// cases of tests/gptq_cuda_test.cc (per channel, g32 to g256, asymmetric, 8-bit, blocks not aligned with
// groups), and so the proxy loss tr((W - Q) H (W - Q)^T). They need not be: float32 rounding differences
// (cuBLAS's summation order and FMAs in the lazy update, cuSOLVER's factorization order) can move a weight
// across a rounding boundary, after which the error feedback differs for the rest of that row; the test allows
// 1% of codes (5% at 8 bits) and 1% of proxy loss. End to end the calibration forwards differ by rounding too,
// which the layer-to-layer flow amplifies (tiny-llama31: 87-89% equal codes after layer 0, same fidelity).
//
// The calibration forward uses cublasSgemm (float32, no TF32) for the linears and for attention's two
// products (one strided-batched call per head over all sequences), a row softmax kernel in between, and a
// RoPE kernel reading the host-computed cos/sin tables, so it matches the CPU path's float32 reference ops
// up to summation order. Keys and values stay float32, unlike the serving path's fp16 cache.
#if PETREL_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "petrel/kernels/cuda/blas_check.h"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/dtype_load.cuh"
#include "petrel/kernels/cuda/gptq.h"

namespace petrel::cuda {

namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;  // rows per block of the row kernels
constexpr int kSlots = kGptqMaxBlock / 32;     // block columns a lane holds

unsigned grid_for(int64_t n, int64_t per_block = kThreads) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

// ---- Scale, zero and codes: quant/format.cc's arithmetic ----

struct Params {
  float scale;
  int zero;
};

__device__ __forceinline__ float round_to_f16(float x) { return __half2float(__float2half_rn(x)); }

// format.cc params_for_range.
__device__ Params params_for_range(float lo, float hi, const GptqGrid& grid) {
  const int max_code = (1 << grid.bits) - 1;
  Params p;
  if (grid.symmetric) {
    const float amax = fmaxf(fabsf(lo), fabsf(hi));
    p.zero = (max_code + 1) / 2;
    p.scale = amax > 0 ? __fdiv_rn(__fmul_rn(2.0f, amax), static_cast<float>(max_code)) : 1.0f;
  } else {
    lo = fminf(lo, 0.0f);
    hi = fmaxf(hi, 0.0f);
    if (__fsub_rn(hi, lo) <= 0) {
      lo = -1.0f;
      hi = 1.0f;
    }
    p.scale = __fdiv_rn(__fsub_rn(hi, lo), static_cast<float>(max_code));
  }
  p.scale = round_to_f16(fmaxf(p.scale, 6.2e-5f));
  if (!grid.symmetric) p.zero = min(max(static_cast<int>(rintf(__fdiv_rn(-lo, p.scale))), 1), max_code);
  return p;
}

// format.h quantize_value: round-half-even(w / scale) + zero, clamped (rintf is what its magic number does).
__device__ __forceinline__ int quantize_code(float w, const Params& p, int max_code) {
  const float q = __fadd_rn(rintf(__fdiv_rn(w, p.scale)), static_cast<float>(p.zero));
  return static_cast<int>(fminf(fmaxf(q, 0.0f), static_cast<float>(max_code)));
}

__device__ __forceinline__ float dequantize(int code, const Params& p) {
  return __fmul_rn(p.scale, static_cast<float>(code - p.zero));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, offset));
  return __shfl_sync(kFullMask, v, 0);
}

// This lane's part of format.cc group_error over values[0, n).
__device__ float lane_group_error(const float* values, int64_t n, const Params& p, int max_code, int lane) {
  float err = 0.0f;
  for (int64_t i = lane; i < n; i += 32) {
    const float d = __fsub_rn(dequantize(quantize_code(values[i], p, max_code), p), values[i]);
    err = __fadd_rn(err, __fmul_rn(d, d));
  }
  return err;
}

// format.cc find_group_params over values[0, n) by one warp; every lane returns the same parameters.
__device__ Params warp_group_params(const float* values, int64_t n, const GptqGrid& grid, int lane) {
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = lane; i < n; i += 32) {
    lo = fminf(lo, values[i]);
    hi = fmaxf(hi, values[i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    lo = fminf(lo, __shfl_xor_sync(kFullMask, lo, offset));
    hi = fmaxf(hi, __shfl_xor_sync(kFullMask, hi, offset));
  }
  Params best = params_for_range(lo, hi, grid);
  if (!grid.clip_search) return best;
  const int max_code = (1 << grid.bits) - 1;
  float best_err = warp_sum(lane_group_error(values, n, best, max_code, lane));
  for (int step = 1; step <= 25; ++step) {
    const float shrink = __fsub_rn(1.0f, __fdiv_rn(static_cast<float>(step), 50.0f));
    const Params p = params_for_range(__fmul_rn(lo, shrink), __fmul_rn(hi, shrink), grid);
    const float err = warp_sum(lane_group_error(values, n, p, max_code, lane));
    if (err < best_err) {
      best_err = err;
      best = p;
    }
  }
  return best;
}

__device__ __forceinline__ void store_params(const Params& p, int64_t group, int64_t row, int64_t rows,
                                             uint16_t* scales, uint8_t* zeros) {
  scales[group * rows + row] = __half_as_ushort(__float2half_rn(p.scale));  // exact: scale is fp16-valued
  zeros[group * rows + row] = static_cast<uint8_t>(p.zero);
}

// ---- GPTQ kernels ----

__global__ void zero_dead_columns_kernel(float* w, int64_t rows, int64_t cols, const uint8_t* dead) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < rows * cols; i += int64_t{gridDim.x} * blockDim.x) {
    if (dead[i % cols]) w[i] = 0.0f;
  }
}

// Per-channel parameters of each whole row (one warp per row).
__global__ void __launch_bounds__(kThreads) row_params_kernel(const float* w, int64_t rows, int64_t cols,
                                                              GptqGrid grid, uint16_t* scales, uint8_t* zeros) {
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const Params p = warp_group_params(w + row * cols, cols, grid, lane);
  if (lane == 0) store_params(p, 0, row, rows, scales, zeros);
}

// Columns [first, first + count) of every row; see the header comment. Dynamic shared memory: U's block,
// count * count floats.
__global__ void __launch_bounds__(kThreads) block_kernel(float* w, int64_t rows, int64_t cols, int64_t first, int count,
                                                         const float* __restrict__ u, GptqGrid grid, uint8_t* codes,
                                                         uint16_t* scales, uint8_t* zeros, float* err, int err_ld) {
  extern __shared__ float u_block[];  // [count, count]: u_block[a * count + b] = U[first + a, first + b]
  for (int i = threadIdx.x; i < count * count; i += kThreads) {
    const int a = i / count, b = i % count;
    u_block[i] = b >= a ? u[(first + a) * cols + first + b] : 0.0f;
  }
  __syncthreads();
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* w_row = w + row * cols;
  const int max_code = (1 << grid.bits) - 1;
  const bool grouped = grid.group_size > 0;

  float value[kSlots], error[kSlots];
  int code[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int j = k * 32 + lane;
    value[k] = j < count ? w_row[first + j] : 0.0f;
    error[k] = 0.0f;
    code[k] = 0;
  }
  Params p{1.0f, 0};
  if (!grouped) {
    p.scale = __half2float(__ushort_as_half(scales[row]));
    p.zero = zeros[row];
  } else if (first % grid.group_size != 0) {  // the block starts inside a group: its parameters are set
    const int64_t g = first / grid.group_size;
    p.scale = __half2float(__ushort_as_half(scales[g * rows + row]));
    p.zero = zeros[g * rows + row];
  }
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    for (int owner = 0; owner < 32; ++owner) {
      const int c = k * 32 + owner;
      if (c >= count) break;  // uniform across the warp
      const int64_t column = first + c;
      if (grouped && column % grid.group_size == 0) {
        // The group's range from the row as it is now: this block's columns from registers, later ones from W.
#pragma unroll
        for (int k2 = 0; k2 < kSlots; ++k2) {
          const int j = k2 * 32 + lane;
          if (j < count) w_row[first + j] = value[k2];
        }
        __syncwarp();
        const int64_t n = grid.group_size < cols - column ? grid.group_size : cols - column;
        p = warp_group_params(w_row + column, n, grid, lane);
        if (lane == 0) store_params(p, column / grid.group_size, row, rows, scales, zeros);
        __syncwarp();
      }
      const float x = __shfl_sync(kFullMask, value[k], owner);
      const int q = quantize_code(x, p, max_code);
      const float dq = dequantize(q, p);
      const float e = __fdiv_rn(__fsub_rn(x, dq), u_block[c * count + c]);
      if (lane == owner) {
        value[k] = dq;
        error[k] = e;
        code[k] = q;
      }
      const float* u_row = u_block + c * count;
#pragma unroll
      for (int k2 = k; k2 < kSlots; ++k2) {
        const int j = k2 * 32 + lane;
        if (j > c && j < count) value[k2] = __fsub_rn(value[k2], __fmul_rn(e, u_row[j]));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int j = k * 32 + lane;
    if (j < count) {
      w_row[first + j] = value[k];
      codes[row * cols + first + j] = static_cast<uint8_t>(code[k]);
      err[row * err_ld + j] = error[k];
    }
  }
}

// ---- Inverse helpers (column-major float64) ----

__global__ void set_dead_diagonal_kernel(double* h, int64_t cols, const uint8_t* dead) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < cols; i += int64_t{gridDim.x} * blockDim.x) {
    if (dead[i]) h[i * cols + i] = 1.0;
  }
}

__global__ void add_diagonal_kernel(double* a, int64_t cols, double value) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < cols; i += int64_t{gridDim.x} * blockDim.x) {
    a[i * cols + i] += value;
  }
}

// u (row-major upper) from the column-major lower factor: u[i, j] = a[i * cols + j] for j >= i.
__global__ void upper_factor_kernel(const double* a, int64_t cols, float* u) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < cols * cols; i += int64_t{gridDim.x} * blockDim.x) {
    u[i] = i % cols >= i / cols ? static_cast<float>(a[i]) : 0.0f;
  }
}

__global__ void hessian_to_f64_kernel(const float* h_upper, int64_t dim, double* out) {
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < dim * dim; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / dim, j = idx % dim;
    out[idx] = j >= i ? h_upper[idx] : h_upper[j * dim + i];
  }
}

// ---- Calibration forward kernels ----

__global__ void widen_kernel(const void* in, WeightType type, int64_t n, float* out) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = load_widened(in, type, i);
  }
}

// ref::apply_rope at position row % seq_len; one thread per (row, head, i < half).
__global__ void rope_kernel(float* x, int64_t n_rows, int64_t seq_len, int64_t n_heads, int64_t head_dim,
                            const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  const int64_t total = n_rows * n_heads * half;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % half, head_row = idx / half;  // head_row = row * n_heads + head
    const int64_t position = (head_row / n_heads) % seq_len;
    float* v = x + head_row * head_dim;
    const float c = cos[position * half + i], s = sin[position * half + i];
    const float a = v[i], b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

// Causal softmax of each row of scores [n_sequences * seq_len, seq_len] (query t sees keys 0 .. t), as
// ref::softmax; masked entries become 0. One warp per row.
__global__ void __launch_bounds__(kThreads) causal_softmax_kernel(float* scores, int64_t n_rows, int64_t seq_len) {
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  float* s = scores + row * seq_len;
  const int64_t n_keys = row % seq_len + 1;
  float max_value = -INFINITY;
  for (int64_t j = lane; j < n_keys; j += 32) max_value = fmaxf(max_value, s[j]);
  for (int offset = 16; offset > 0; offset /= 2) max_value = fmaxf(max_value, __shfl_xor_sync(kFullMask, max_value, offset));
  float sum = 0.0f;
  for (int64_t j = lane; j < n_keys; j += 32) {
    const float e = expf(s[j] - max_value);
    s[j] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < seq_len; j += 32) s[j] = j < n_keys ? s[j] * inv : 0.0f;
}

Status launched(const char* what) { return cuda_status(cudaGetLastError(), std::string(what) + " launch"); }

bool fits_int(int64_t v) { return v > 0 && v <= INT_MAX; }

}  // namespace

// ---- Hessian ----

Status gptq_hessian_add(const float* x, int64_t n_rows, int64_t dim, float* h_upper, BlasHandle& blas, Stream stream) {
  if (!fits_int(n_rows) || !fits_int(dim)) {
    return invalid_argument("cuda::gptq_hessian_add: " + std::to_string(n_rows) + " rows of " + std::to_string(dim));
  }
  if (!x || !h_upper) return invalid_argument("cuda::gptq_hessian_add: null device pointer");
  PETREL_RETURN_IF_ERROR(blas.set_stream(stream));
  const float one = 1.0f;
  // Column-major view: x is X^T [dim, n_rows] (ld dim); C = X^T X, lower triangle = row-major upper.
  PETREL_BLAS_RETURN_IF_ERROR(cublasSsyrk(blas.get(), CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, static_cast<int>(dim),
                                          static_cast<int>(n_rows), &one, x, static_cast<int>(dim), &one, h_upper,
                                          static_cast<int>(dim)),
                              "cublasSsyrk (Hessian " + std::to_string(dim) + " x " + std::to_string(dim) + ", " +
                                  std::to_string(n_rows) + " rows)");
  return ok_status();
}

Status gptq_hessian_to_f64(const float* h_upper, int64_t dim, double* out, Stream stream) {
  if (dim <= 0 || !h_upper || !out) return invalid_argument("cuda::gptq_hessian_to_f64: bad arguments");
  hessian_to_f64_kernel<<<grid_for(dim * dim), kThreads, 0, stream>>>(h_upper, dim, out);
  return launched("gptq_hessian_to_f64");
}

// ---- Inverse ----

Result<GptqInverseReport> gptq_inverse_factor(double* h, int64_t cols, double damp_percent, float* u, uint8_t* dead,
                                              SolverHandle& solver, Stream stream, const std::string& what) {
  if (!fits_int(cols)) return invalid_argument(what + ": gptq: " + std::to_string(cols) + " columns");
  if (!h || !u || !dead) return invalid_argument(what + ": gptq: null device pointer");
  PETREL_RETURN_IF_ERROR(solver.set_stream(stream));
  const int n = static_cast<int>(cols);

  // Dead inputs and the mean diagonal, on the host in the CPU's order.
  std::vector<double> diagonal(cols);
  PETREL_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(diagonal.data(), sizeof(double), h, (cols + 1) * sizeof(double),
                                                sizeof(double), cols, cudaMemcpyDeviceToHost, stream),
                              what + ": reading the Hessian's diagonal");
  PETREL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), what + ": reading the Hessian's diagonal");
  std::vector<uint8_t> dead_host(cols, 0);
  GptqInverseReport report;
  for (int64_t i = 0; i < cols; ++i) {
    if (diagonal[i] == 0.0) {
      diagonal[i] = 1.0;
      dead_host[i] = 1;
      ++report.dead_columns;
    }
  }
  double mean_diag = 0;
  for (int64_t i = 0; i < cols; ++i) mean_diag += diagonal[i];
  mean_diag /= cols;
  PETREL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dead, dead_host.data(), cols, cudaMemcpyHostToDevice, stream),
                              what + ": uploading the dead-input mask");
  set_dead_diagonal_kernel<<<grid_for(cols), kThreads, 0, stream>>>(h, cols, dead);
  PETREL_RETURN_IF_ERROR(launched("gptq set_dead_diagonal"));

  const size_t matrix_bytes = static_cast<size_t>(cols) * cols * sizeof(double);
  PETREL_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::allocate(matrix_bytes));
  int lwork_potrf = 0, lwork_potri = 0;
  PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnDpotrf_bufferSize(solver.get(), CUBLAS_FILL_MODE_LOWER, n, a.as<double>(), n,
                                                            &lwork_potrf),
                                what + ": cusolverDnDpotrf_bufferSize");
  PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnDpotri_bufferSize(solver.get(), CUBLAS_FILL_MODE_LOWER, n, a.as<double>(), n,
                                                            &lwork_potri),
                                what + ": cusolverDnDpotri_bufferSize");
  const int lwork = lwork_potrf > lwork_potri ? lwork_potrf : lwork_potri;
  PETREL_ASSIGN_OR_RETURN(DeviceBuffer work, DeviceBuffer::allocate(static_cast<size_t>(lwork) * sizeof(double) + 256));
  PETREL_ASSIGN_OR_RETURN(DeviceBuffer info_buffer, DeviceBuffer::allocate(sizeof(int)));
  int* info_device = info_buffer.as<int>();
  auto read_info = [&](const char* step) -> Result<int> {
    int info = 0;
    PETREL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&info, info_device, sizeof(int), cudaMemcpyDeviceToHost, stream),
                                what + ": " + step);
    PETREL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), what + ": " + step);
    if (info < 0) return internal_error(what + ": " + step + ": parameter " + std::to_string(-info) + " is invalid");
    return info;
  };

  double damp = damp_percent * mean_diag;
  for (int attempt = 0;; ++attempt) {
    PETREL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.data(), h, matrix_bytes, cudaMemcpyDeviceToDevice, stream),
                                what + ": copying the Hessian");
    add_diagonal_kernel<<<grid_for(cols), kThreads, 0, stream>>>(a.as<double>(), cols, damp);
    PETREL_RETURN_IF_ERROR(launched("gptq add_diagonal"));
    PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnDpotrf(solver.get(), CUBLAS_FILL_MODE_LOWER, n, a.as<double>(), n,
                                                   work.as<double>(), lwork, info_device),
                                  what + ": cusolverDnDpotrf (H + damp I)");
    PETREL_ASSIGN_OR_RETURN(int info, read_info("cusolverDnDpotrf (H + damp I)"));
    if (info == 0) {
      PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnDpotri(solver.get(), CUBLAS_FILL_MODE_LOWER, n, a.as<double>(), n,
                                                     work.as<double>(), lwork, info_device),
                                    what + ": cusolverDnDpotri");
      PETREL_ASSIGN_OR_RETURN(info, read_info("cusolverDnDpotri"));
    }
    if (info == 0) {
      PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnDpotrf(solver.get(), CUBLAS_FILL_MODE_LOWER, n, a.as<double>(), n,
                                                     work.as<double>(), lwork, info_device),
                                    what + ": cusolverDnDpotrf (H^-1)");
      PETREL_ASSIGN_OR_RETURN(info, read_info("cusolverDnDpotrf (H^-1)"));
    }
    if (info == 0) break;
    if (attempt >= 6) {
      return invalid_data(what + ": gptq: the Hessian is not positive definite even with damping " + std::to_string(damp));
    }
    damp *= 10;
  }
  upper_factor_kernel<<<grid_for(cols * cols), kThreads, 0, stream>>>(a.as<double>(), cols, u);
  PETREL_RETURN_IF_ERROR(launched("gptq upper_factor"));
  // `a` and `work` are freed on return; cudaFree waits for the work using them.
  report.damp_used = damp;
  return report;
}

// ---- Column loop ----

Status gptq_quantize(float* w, int64_t rows, int64_t cols, const float* u, const uint8_t* dead, const GptqGrid& grid,
                     int64_t block_size, const GptqOutput& out, float* workspace, BlasHandle& blas, Stream stream,
                     const std::string& what) {
  if (!fits_int(rows) || !fits_int(cols)) {
    return invalid_argument(what + ": gptq: shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (grid.bits != 4 && grid.bits != 8) return unsupported(what + ": gptq: " + std::to_string(grid.bits) + "-bit codes");
  if (grid.group_size > 0 && cols % grid.group_size != 0) {
    return invalid_argument(what + ": gptq: " + std::to_string(cols) + " columns are not a multiple of group size " +
                            std::to_string(grid.group_size));
  }
  if (block_size < 1 || block_size > kGptqMaxBlock) {
    return invalid_argument(what + ": gptq on CUDA takes blocks of 1 to " + std::to_string(kGptqMaxBlock) +
                            " columns, not " + std::to_string(block_size));
  }
  if (!w || !u || !dead || !out.codes || !out.scales || !out.zeros || !workspace) {
    return invalid_argument(what + ": gptq: null device pointer");
  }
  zero_dead_columns_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(w, rows, cols, dead);
  PETREL_RETURN_IF_ERROR(launched("gptq zero_dead_columns"));
  const unsigned row_blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (grid.group_size <= 0) {
    row_params_kernel<<<row_blocks, kThreads, 0, stream>>>(w, rows, cols, grid, out.scales, out.zeros);
    PETREL_RETURN_IF_ERROR(launched("gptq row_params"));
  }
  const int max_shared = static_cast<int>(kGptqMaxBlock * kGptqMaxBlock * sizeof(float));
  PETREL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared),
                              "cudaFuncSetAttribute(gptq block_kernel, " + std::to_string(max_shared) + " bytes)");
  PETREL_RETURN_IF_ERROR(blas.set_stream(stream));
  const float minus_one = -1.0f, one = 1.0f;
  for (int64_t first = 0; first < cols; first += block_size) {
    const int count = static_cast<int>(block_size < cols - first ? block_size : cols - first);
    const size_t shared = static_cast<size_t>(count) * count * sizeof(float);
    block_kernel<<<row_blocks, kThreads, shared, stream>>>(w, rows, cols, first, count, u, grid, out.codes, out.scales,
                                                           out.zeros, workspace,
                                                           static_cast<int>(block_size));
    PETREL_RETURN_IF_ERROR(launched("gptq block_kernel"));
    const int64_t end = first + count;
    if (end < cols) {
      // Column-major: W^T[end:, :] (ld cols) -= U[first:end, end:]^T (ld cols) * Err^T (ld block_size).
      PETREL_BLAS_RETURN_IF_ERROR(
          cublasSgemm(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols - end), static_cast<int>(rows), count,
                      &minus_one, u + first * cols + end, static_cast<int>(cols), workspace,
                      static_cast<int>(block_size), &one, w + end, static_cast<int>(cols)),
          what + ": cublasSgemm (GPTQ lazy update, columns " + std::to_string(end) + "..)");
    }
  }
  return ok_status();
}

// ---- Calibration forward ----

Status widen_to_f32(const void* in, DType dtype, int64_t n, float* out, Stream stream) {
  PETREL_ASSIGN_OR_RETURN(WeightType type, weight_type(dtype, "cuda::widen_to_f32"));
  if (n <= 0 || !in || !out) return invalid_argument("cuda::widen_to_f32: bad arguments");
  widen_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, type, n, out);
  return launched("widen_to_f32");
}

Status linear_f32(const float* x, int64_t m, const float* w, int64_t out_features, int64_t in_features, float* y,
                  BlasHandle& blas, Stream stream) {
  if (!fits_int(m) || !fits_int(out_features) || !fits_int(in_features) || !x || !w || !y) {
    return invalid_argument("cuda::linear_f32: [" + std::to_string(m) + ", " + std::to_string(in_features) + "] x [" +
                            std::to_string(out_features) + ", " + std::to_string(in_features) + "]^T");
  }
  PETREL_RETURN_IF_ERROR(blas.set_stream(stream));
  const float one = 1.0f, zero = 0.0f;
  // Column-major: Y^T [out, m] = W (viewed [in, out], transposed) * X^T [in, m].
  PETREL_BLAS_RETURN_IF_ERROR(
      cublasSgemm(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_features), static_cast<int>(m),
                  static_cast<int>(in_features), &one, w, static_cast<int>(in_features), x,
                  static_cast<int>(in_features), &zero, y, static_cast<int>(out_features)),
      "cublasSgemm (" + std::to_string(m) + " x " + std::to_string(out_features) + " x " + std::to_string(in_features) + ")");
  return ok_status();
}

Status rope_sequences(float* x, int64_t n_rows, int64_t seq_len, int64_t n_heads, int64_t head_dim, const float* cos,
                      const float* sin, Stream stream) {
  if (n_rows <= 0 || seq_len <= 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || !x || !cos || !sin) {
    return invalid_argument("cuda::rope_sequences: " + std::to_string(n_rows) + " rows, " + std::to_string(n_heads) +
                            " heads of " + std::to_string(head_dim));
  }
  rope_kernel<<<grid_for(n_rows * n_heads * head_dim / 2), kThreads, 0, stream>>>(x, n_rows, seq_len, n_heads, head_dim,
                                                                                  cos, sin);
  return launched("rope_sequences");
}

Status sequence_attention(const float* q, const float* k, const float* v, int64_t n_sequences, int64_t seq_len,
                          const SequenceAttentionShape& shape, float* workspace, float* out, BlasHandle& blas,
                          Stream stream) {
  const int64_t q_dim = shape.n_heads * shape.head_dim, kv_dim = shape.n_kv_heads * shape.head_dim;
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.head_dim <= 0 ||
      !fits_int(n_sequences) || !fits_int(seq_len) || !q || !k || !v || !out ||
      !workspace) {
    return invalid_argument("cuda::sequence_attention: " + std::to_string(n_sequences) + " sequences of " +
                            std::to_string(seq_len) + ", heads " + std::to_string(shape.n_heads) + "/" +
                            std::to_string(shape.n_kv_heads) + " of " + std::to_string(shape.head_dim));
  }
  PETREL_RETURN_IF_ERROR(blas.set_stream(stream));
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim)), one = 1.0f, zero = 0.0f;
  const int t = static_cast<int>(seq_len), d = static_cast<int>(shape.head_dim), batch = static_cast<int>(n_sequences);
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t n_rows = n_sequences * seq_len;
  for (int64_t head = 0; head < shape.n_heads; ++head) {
    const int64_t kv_head = head / group;
    // Scores, per sequence: row-major S [t, t] = Q_h K_h^T * scale; column-major S^T = K_h Q_h^T.
    PETREL_BLAS_RETURN_IF_ERROR(
        cublasSgemmStridedBatched(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, t, t, d, &scale, k + kv_head * d,
                                  static_cast<int>(kv_dim), seq_len * kv_dim, q + head * d, static_cast<int>(q_dim),
                                  seq_len * q_dim, &zero, workspace, t, seq_len * seq_len, batch),
        "cublasSgemmStridedBatched (attention scores, head " + std::to_string(head) + ")");
    causal_softmax_kernel<<<static_cast<unsigned>((n_rows + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0, stream>>>(
        workspace, n_rows, seq_len);
    PETREL_RETURN_IF_ERROR(launched("causal_softmax"));
    // Output, per sequence: row-major O_h [t, d] = P V_h; column-major O_h^T = V_h^T P^T.
    PETREL_BLAS_RETURN_IF_ERROR(
        cublasSgemmStridedBatched(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, d, t, t, &one, v + kv_head * d,
                                  static_cast<int>(kv_dim), seq_len * kv_dim, workspace, t, seq_len * seq_len, &zero,
                                  out + head * d, static_cast<int>(q_dim), seq_len * q_dim, batch),
        "cublasSgemmStridedBatched (attention output, head " + std::to_string(head) + ")");
  }
  return ok_status();
}

}  // namespace petrel::cuda

#endif  // PETREL_HAVE_CUDA
