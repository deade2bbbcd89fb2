// kernels/cuda internal: Hopper's bulk copy engine (cp.async.bulk, global -> shared, completing on an mbarrier)
// and the mbarrier operations around it, and the bulk L2 prefetch. Used by resident_gemv.cu, gemv_gptq.cu (the
// prefetch) and bench/persistent_probe.cu's ring variant; first written for session 8's bulk-copy GEMV (branch
// experiment/l2-read-ahead-and-bulk-gemv). One instruction moves a whole contiguous run (a multiple of 16 bytes) without registers; the
// barrier's phase completes when the bytes announced with expect_tx have all landed. sm_90 and later: on older
// targets these compile to nothing.
#pragma once

#include <cuda.h>  // CUtensorMap (the driver's encoder is found at run time: no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "petrel/util/status.h"

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

// The box at (inner coordinate c0, outer coordinate c1) of the 2D tensor `map` describes, into shared memory at
// `shared` (128-byte aligned; 1024-byte aligned where the map swizzles 128-byte rows), completing on `bar`.
__device__ __forceinline__ void tensor_copy_to_shared(void* shared, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          shared_address(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
#endif
}

// Host: `map` describes the int32 matrix at `base`, `outer` rows of `inner` elements each (rows inner * 4 bytes
// apart, a multiple of 16), in boxes of box_outer x box_inner elements; elements outside the matrix read as zeros.
// `who` names the caller in errors.
inline Status encode_int32_tensor_map_2d(CUtensorMap& map, const int32_t* base, int64_t inner, int64_t outer,
                                         uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle,
                                         const char* who) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return unsupported(std::string(who) + ": the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(inner) * 4};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_INT32, 2, const_cast<int32_t*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return internal_error(std::string(who) + ": cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                          ") for a [" + std::to_string(outer) + ", " + std::to_string(inner) + "] int32 matrix");
  }
  return ok_status();
}

}  // namespace petrel::cuda
