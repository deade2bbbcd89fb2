// kernels/cuda internal: programmatic dependent launch (PDL), the overlap of consecutive kernels on one stream
// that the token generator's fused step uses (gemv_gptq.cu, attention.cu). Only for files built with CUDA.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start before the kernel ahead
// of it on the stream has finished: as soon as every block of that kernel has executed
// allow_dependent_launch() (or exited). Its blocks then run what does not depend on the previous kernel (weight
// loads, L2 prefetches) and call wait_for_previous_kernel(), which returns once the previous kernel has
// completed and its memory writes are visible. Inside stream capture the attribute becomes a programmatic
// edge of the CUDA graph (CUDA 12.3 and later), so replayed steps overlap too.
//
// Rules a kernel launched this way follows, so that a chain of them stays correct:
//  - nothing written by an earlier kernel is read, and nothing in global memory is written, before the wait
//    (a block's own shared memory may be: the GEMM stages its first weights there with cp.async);
//  - every block waits before it exits, except blocks that do no work when some block of the grid waits (the
//    grid then still completes after its predecessor, so the next kernel's wait covers both);
//  - data written by the previous kernel is read through L2 (ld.global.cg), not a possibly stale L1 line.
// Without the attribute (or before Hopper, where both instructions compile to nothing) the kernel behaves as
// an ordinary launch.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "petrel/kernels/cuda/device.h"

namespace petrel::cuda {

// The next kernel on the stream (if launched with overlap) may start its blocks once all blocks of this grid
// have called this. Called first thing: the dependent kernel's own wait still orders its reads.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Returns once the kernel this one overlaps has completed and its writes are visible; at once without overlap.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared, stream>>>(args...) with the launch attributes `attributes[0 .. n)`.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_with_attributes(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                                   cudaLaunchAttribute* attributes, unsigned n, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

inline cudaLaunchAttribute overlap_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// With `overlap`, the attributes of an overlapped launch from attributes[*n] on: programmatic stream
// serialization, and the calling thread's shared-memory carveout where one is set (device.h:
// overlapped_launch_carveout). Returns the new count.
inline unsigned add_overlap_attributes(cudaLaunchAttribute* attributes, unsigned n, bool overlap) {
  if (!overlap) return n;
  attributes[n++] = overlap_attribute();
  if (const int carveout = overlapped_launch_carveout(); carveout >= 0) {
    attributes[n] = {};
    attributes[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attributes[n].val.sharedMemCarveout = static_cast<unsigned>(carveout);
    ++n;
  }
  return n;
}

// kernel<<<grid, block, shared, stream>>>(args...), with programmatic stream serialization when `overlap`.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                          bool overlap, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  const unsigned n = add_overlap_attributes(attributes, 0, overlap);
  return launch_with_attributes(kernel, grid, block, shared, stream, attributes, n, std::forward<Args>(args)...);
}

// launch_kernel in thread-block clusters of `cluster` blocks (grid divisible by it; Hopper and later). Cluster
// sizes above 8 need cudaFuncAttributeNonPortableClusterSizeAllowed, set here before each such launch.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel_in_clusters(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, dim3 cluster, size_t shared,
                                      cudaStream_t stream, bool overlap, Args&&... args) {
  if (cluster.x * cluster.y * cluster.z > 8) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
  }
  cudaLaunchAttribute attributes[3] = {};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = cluster.x;
  attributes[0].val.clusterDim.y = cluster.y;
  attributes[0].val.clusterDim.z = cluster.z;
  const unsigned n = add_overlap_attributes(attributes, 1, overlap);
  return launch_with_attributes(kernel, grid, block, shared, stream, attributes, n, std::forward<Args>(args)...);
}

// Lets `Kernel` use up to `bytes` of dynamic shared memory (the opt-in above 48 KB), once per kernel and device:
// a host call of a few microseconds that small launches (the prompt processor's, every layer) would otherwise
// pay each time. `bytes` must be the same on every call for one kernel (the largest its launches use).
template <auto Kernel>
cudaError_t raise_shared_limit_once(int bytes) {
  static std::atomic<uint64_t> raised{0};  // a bit per device
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const uint64_t bit = uint64_t{1} << (device % 64);
  if (raised.load(std::memory_order_relaxed) & bit) return cudaSuccess;
  error = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (error == cudaSuccess) raised.fetch_or(bit, std::memory_order_relaxed);
  return error;
}

}  // namespace petrel::cuda
