// kernels/cuda: cuBLAS and cuSOLVER handles, owned and bound to a stream. Plain C++ (no CUDA header), like
// stream.h; without the backend create() answers "not built" (cuda_unavailable.cc).
//
// Where petrel uses the vendor libraries instead of its own kernels: dense float32/f16/bf16 matrix products of
// many rows (prefill of float checkpoints, GPTQ's calibration forward and Hessians, prefill attention's two
// batched products) and the dense factorizations of GPTQ (Cholesky). Its own kernels remain for what the
// libraries do not do well or at all: 4-bit dequantization fused into products, decode-shaped work, fusions.
// Math mode is cuBLAS's default (CUBLAS_DEFAULT_MATH: float32 products stay float32, no TF32).
#pragma once

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

struct cublasContext;
struct cusolverDnContext;

namespace petrel::cuda {

// A cuBLAS handle on the current device. Work issued through it goes to the stream last set (the legacy
// default stream until then). Handles are not thread-safe: one per thread (or per stream) of work.
class BlasHandle {
 public:
  BlasHandle() = default;
  static Result<BlasHandle> create();
  ~BlasHandle();
  BlasHandle(BlasHandle&& other) noexcept;
  BlasHandle& operator=(BlasHandle&& other) noexcept;
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;

  cublasContext* get() const { return handle_; }  // cublasHandle_t
  Status set_stream(Stream stream);

 private:
  cublasContext* handle_ = nullptr;
};

// A cuSOLVER dense handle on the current device; as BlasHandle.
class SolverHandle {
 public:
  SolverHandle() = default;
  static Result<SolverHandle> create();
  ~SolverHandle();
  SolverHandle(SolverHandle&& other) noexcept;
  SolverHandle& operator=(SolverHandle&& other) noexcept;
  SolverHandle(const SolverHandle&) = delete;
  SolverHandle& operator=(const SolverHandle&) = delete;

  cusolverDnContext* get() const { return handle_; }  // cusolverDnHandle_t
  Status set_stream(Stream stream);

 private:
  cusolverDnContext* handle_ = nullptr;
};

}  // namespace petrel::cuda
