// kernels/cuda internal: Ampere's asynchronous global -> shared copies (cp.async), used by gemm_gptq.cu's
// pipeline, attention.cu's KV staging and gemv_gptq.cu's norm weights. Only for files built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace petrel::cuda {

// 16 bytes global -> shared without registers, bypassing L1 (both addresses 16-byte aligned).
__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
}

// As cp_async16, or 16 zero bytes (nothing read) when not `inside`.
__device__ __forceinline__ void cp_async16_zero_fill(void* shared, const void* global, bool inside) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  const uint32_t bytes = inside ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(address), "l"(global), "r"(bytes) : "memory");
}

// 4 bytes global -> shared (both addresses 4-byte aligned); cp.async.cg takes only 16, so this one goes
// through L1 (.ca).
__device__ __forceinline__ void cp_async4(void* shared, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(address), "l"(global) : "memory");
}

// 8 bytes global -> shared (both addresses 8-byte aligned), through L1 as cp_async4.
__device__ __forceinline__ void cp_async8(void* shared, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(address), "l"(global) : "memory");
}

// Closes the group of copies issued since the last commit (possibly empty).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most kPending committed groups of this thread are still in flight. The data is then
// visible to this thread; a __syncthreads() makes every thread's copies visible to the block.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace petrel::cuda
