// kernels/cuda: the CUDA backend's device layer. Plain C++: no CUDA header is needed to include this, so the
// runtime, the CLI and the tests use it whether or not the build has CUDA. In a build without CUDA
// (PETREL_HAVE_CUDA undefined) every function exists and answers "not built" (cuda_unavailable.cc).
//
// Devices are numbered as the CUDA runtime numbers them (CUDA_VISIBLE_DEVICES applies). Allocations and
// launches go to the calling thread's current device (set_device), as in the CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "petrel/util/status.h"

// The CUDA runtime's opaque stream type, declared so that a stream can pass through this header:
// cudaStream_t is CUstream_st*.
struct CUstream_st;

namespace petrel::cuda {

using Stream = CUstream_st*;  // nullptr: the legacy default stream

// True when this build has the CUDA backend (PETREL_HAVE_CUDA).
bool built_with_cuda();

struct DeviceInfo {
  int index = 0;
  std::string name;              // "NVIDIA H200"
  int64_t total_memory_bytes = 0;
  int compute_major = 0;         // compute capability, 9.0 for Hopper
  int compute_minor = 0;
  int multiprocessors = 0;
  int64_t l2_cache_bytes = 0;
  int64_t shared_memory_per_block_optin = 0;  // the most dynamic shared memory a block may ask for
  // Peak memory bandwidth, bytes a second, from the memory clock and bus width the runtime reports (two
  // transfers a clock): ~4.9e12 for an H200, ~3.35e12 for an H100 SXM; 0 where the runtime reports neither.
  // Defaults that depend on the memory system read it (CudaModelOptions' tensor-copy GEMVs).
  int64_t peak_memory_bandwidth = 0;
};

// The GPUs the CUDA runtime sees. No driver or no GPU is no error: the list is empty, and
// no_device_reason() says why. Anything else the runtime reports is an error.
Result<std::vector<DeviceInfo>> list_devices();
Result<DeviceInfo> device_info(int device);
// The runtime's and the driver's CUDA versions as "13.0"; the driver's is "none" without a driver.
std::string runtime_version();
std::string driver_version();
// Why list_devices() is empty ("no CUDA-capable device is detected", "CUDA backend not built", ...);
// empty when there are devices.
std::string no_device_reason();

Status set_device(int device);
Result<int> current_device();
// The shared-memory carveout (percent of an SM's unified L1 and shared memory that is shared memory, 0 to 100;
// -1: none asked, the driver's choice) that the calling thread's launches with programmatic dependent launch
// ask for (cudaLaunchAttributePreferredSharedMemoryCarveout; programmatic_launch.cuh). Without one the driver
// picks a carveout per kernel from its shared memory, and the next kernel's blocks were seen to wait for an SM
// set up for a smaller one to drain instead of starting beside the running blocks, though registers had room
// (CudaModelOptions::decode_shared_carveout has the measurements).
int overlapped_launch_carveout();
// Sets it for the calling thread; returns the previous value.
int set_overlapped_launch_carveout(int percent);
// Sets it for a scope (-1 leaves the thread's setting alone).
class ScopedLaunchCarveout {
 public:
  explicit ScopedLaunchCarveout(int percent)
      : active_(percent >= 0), previous_(active_ ? set_overlapped_launch_carveout(percent) : 0) {}
  ~ScopedLaunchCarveout() {
    if (active_) set_overlapped_launch_carveout(previous_);
  }
  ScopedLaunchCarveout(const ScopedLaunchCarveout&) = delete;
  ScopedLaunchCarveout& operator=(const ScopedLaunchCarveout&) = delete;

 private:
  bool active_;
  int previous_;
};

// Waits for all work on the current device and reports any error an earlier asynchronous launch left.
Status synchronize();

// Free and total memory of the current device, as cudaMemGetInfo reports them.
struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
Result<MemoryInfo> memory_info();

// Device memory owned by value: freed on destruction, movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of uninitialized memory on the current device (256-byte aligned, as cudaMalloc gives).
  static Result<DeviceBuffer> allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return size_; }

  // Synchronous copies of `bytes` at byte `offset` of this buffer; out-of-range spans are errors.
  Status upload(const void* host, size_t bytes, size_t offset = 0);
  Status download(void* host, size_t bytes, size_t offset = 0) const;
  // Sets every byte (0xFF poisons float buffers with NaN, for tests that check every output is written).
  Status fill_bytes(uint8_t value);

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace petrel::cuda
