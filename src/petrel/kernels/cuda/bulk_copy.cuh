// kernels/cuda internal: Hopper's bulk copy engine (cp.async.bulk, global -> shared, completing on an mbarrier)
// and the mbarrier operations around it, and the bulk L2 prefetch. Used by resident_gemv.cu, gemv_gptq.cu (the
// prefetch) and bench/persistent_probe.cu's ring variant; first written for session 8's bulk-copy GEMV (branch
// experiment/l2-read-ahead-and-bulk-gemv). One instruction moves a whole contiguous run (a multiple of 16 bytes) without registers; the
// barrier's phase completes when the bytes announced with expect_tx have all landed. sm_90 and later: on older
// targets these compile to nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace petrel::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initializes the barrier at `bar` for `arrivals` arrivals per phase; then fence_barrier_init() and a block
// barrier before any other thread or the copy engine uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
#endif
}

__device__ __forceinline__ void fence_barrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Shared memory this thread (and, after a block barrier, the block) read with ordinary loads may now be
// overwritten by the copy engine.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// One arrival on `bar`, announcing `bytes` more to come from bulk copies in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
#endif
}

// Waits until the phase of `bar` with parity `parity` (0, 1, 0, ... for its 1st, 2nd, 3rd phase) completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Asks `bytes` (a multiple of 16, 16-byte aligned) at p into L2, without waiting and without registers (the
// weights a block will stream soon, fetched while the previous kernel finishes).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to this block's shared memory,
// completing on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* shared, const void* global, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(shared)),
               "l"(global), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#endif
}

}  // namespace petrel::cuda
