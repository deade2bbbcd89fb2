// kernels/cuda: uploads of large pageable host memory (a bundle's mmap'd weights) to the device through a
// ring of pinned staging buffers. Plain C++ over stream.h's wrappers, built with or without CUDA.
//
// Why: cudaMemcpy from pageable memory stages through a small driver buffer and measured ~6 GB/s on the H200
// machine (4.2 GB of Llama-3.1-8B W4 weights in ~0.7 s of a ~1.9 s init). Here several host threads copy
// each chunk into pinned memory (memory bandwidth, the pages are already mapped by the bundle's checksum
// pass) while the DMA engine moves the chunks before it (PCIe/NVLink-C2C bandwidth, tens of GB/s).
// Small copies share a chunk; each copy is one cudaMemcpyAsync from its place in the chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "petrel/kernels/cuda/stream.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

class HostUploader {
 public:
  HostUploader() = default;
  // `slots` pinned buffers of `chunk_bytes` on the current device's context; `threads` host threads copy
  // each chunk (1: the calling thread alone).
  static Result<HostUploader> create(size_t chunk_bytes = size_t{32} << 20, int slots = 3, int threads = 4);
  HostUploader(HostUploader&&) noexcept = default;
  HostUploader& operator=(HostUploader&&) noexcept = default;

  // Queues bytes from `host` to `device` (device memory of the current device). When it returns, the host
  // memory has been read (it may change or go away); the device copy may still be in flight until finish().
  Status copy(void* device, const void* host, size_t bytes);
  // The same for `rows` rows of `row_bytes` that lie `stride` bytes apart on the host, packed densely on the device
  // (a CPU bundle's padded qweight rows): gathered straight into the pinned chunks, no host copy in between.
  Status copy_rows(void* device, const void* host, size_t row_bytes, size_t stride, size_t rows);
  // Waits until every queued copy has reached the device, and reports any error.
  Status finish();
  int64_t bytes_copied() const { return bytes_; }

 private:
  struct Slot {
    PinnedBuffer buffer;
    CudaEvent done;     // recorded after the slot's last device copy
    bool busy = false;  // `done` is pending
  };
  Status close_slot();

  std::vector<Slot> slots_;
  CudaStream stream_;
  size_t chunk_ = 0;
  int threads_ = 1;
  int current_ = 0;
  size_t fill_ = 0;  // bytes used in the current slot
  int64_t bytes_ = 0;
};

}  // namespace petrel::cuda
