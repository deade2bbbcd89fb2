// kernels/cuda internal: cuBLAS and cuSOLVER status codes as petrel Status values. Only for files built with
// CUDA.
#pragma once

#include <cublas_v2.h>
#include <cusolverDn.h>

#include <string>

#include "petrel/util/status.h"

namespace petrel::cuda {

// "cublasGemmEx (q_proj, 512 x 4096 x 4096): CUBLAS_STATUS_INVALID_VALUE" for a failed call.
inline Status blas_status(cublasStatus_t status, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return ok_status();
  const std::string message = what + ": " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")";
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return out_of_range(message);
  if (status == CUBLAS_STATUS_INVALID_VALUE || status == CUBLAS_STATUS_NOT_SUPPORTED) return invalid_argument(message);
  return internal_error(message);
}

inline Status solver_status(cusolverStatus_t status, const std::string& what) {
  if (status == CUSOLVER_STATUS_SUCCESS) return ok_status();
  const std::string message = what + ": cusolver status " + std::to_string(static_cast<int>(status));
  if (status == CUSOLVER_STATUS_ALLOC_FAILED) return out_of_range(message);
  if (status == CUSOLVER_STATUS_INVALID_VALUE) return invalid_argument(message);
  return internal_error(message);
}

}  // namespace petrel::cuda

#define PETREL_BLAS_RETURN_IF_ERROR(call, what) PETREL_RETURN_IF_ERROR(::petrel::cuda::blas_status((call), (what)))
#define PETREL_SOLVER_RETURN_IF_ERROR(call, what) PETREL_RETURN_IF_ERROR(::petrel::cuda::solver_status((call), (what)))
