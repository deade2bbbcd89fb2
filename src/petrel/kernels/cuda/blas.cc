// kernels/cuda: cuBLAS and cuSOLVER handles (blas.h).
#if PETREL_HAVE_CUDA

#include "petrel/kernels/cuda/blas.h"

#include <utility>

#include "petrel/kernels/cuda/blas_check.h"

namespace petrel::cuda {

Result<BlasHandle> BlasHandle::create() {
  BlasHandle handle;
  PETREL_BLAS_RETURN_IF_ERROR(cublasCreate(&handle.handle_), "cublasCreate");
  return handle;
}

BlasHandle::~BlasHandle() {
  if (handle_) cublasDestroy(handle_);
}

BlasHandle::BlasHandle(BlasHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}

BlasHandle& BlasHandle::operator=(BlasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_) cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Status BlasHandle::set_stream(Stream stream) {
  if (!handle_) return internal_error("cublasSetStream: no handle");
  PETREL_BLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream), "cublasSetStream");
  return ok_status();
}

Result<SolverHandle> SolverHandle::create() {
  SolverHandle handle;
  PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnCreate(&handle.handle_), "cusolverDnCreate");
  return handle;
}

SolverHandle::~SolverHandle() {
  if (handle_) cusolverDnDestroy(handle_);
}

SolverHandle::SolverHandle(SolverHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}

SolverHandle& SolverHandle::operator=(SolverHandle&& other) noexcept {
  if (this != &other) {
    if (handle_) cusolverDnDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Status SolverHandle::set_stream(Stream stream) {
  if (!handle_) return internal_error("cusolverDnSetStream: no handle");
  PETREL_SOLVER_RETURN_IF_ERROR(cusolverDnSetStream(handle_, stream), "cusolverDnSetStream");
  return ok_status();
}

}  // namespace petrel::cuda

#endif  // PETREL_HAVE_CUDA
