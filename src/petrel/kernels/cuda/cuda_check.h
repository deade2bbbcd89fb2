// kernels/cuda internal: CUDA runtime errors as petrel Status values. Only for files built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "petrel/util/status.h"

namespace petrel::cuda {

// "cudaMalloc(268435456 bytes): out of memory (cudaErrorMemoryAllocation)" for a failed call.
inline Status cuda_status(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return ok_status();
  const std::string message = what + ": " + cudaGetErrorString(error) + " (" + cudaGetErrorName(error) + ")";
  if (error == cudaErrorMemoryAllocation) return out_of_range(message);
  if (error == cudaErrorInvalidValue || error == cudaErrorInvalidDevice || error == cudaErrorInvalidConfiguration) {
    return invalid_argument(message);
  }
  return internal_error(message);
}

}  // namespace petrel::cuda

#define PETREL_CUDA_RETURN_IF_ERROR(call, what) PETREL_RETURN_IF_ERROR(::petrel::cuda::cuda_status((call), (what)))
