// kernels/cuda: a stream, CUDA graphs of the work issued on it, and copies ordered on it. Plain C++ (no CUDA
// header), like device.h; without the backend every call answers "not built" (cuda_unavailable.cc).
//
// Why graphs: the token generator issues ~15 small kernels per layer, and one launch costs ~3 us of CPU and
// GPU gap (bench/README.md: a 128x256 GEMV takes 2.9 us), comparable to a whole 4096x4096 W4 GEMV. Captured
// once into a graph and replayed, the launches go to the GPU as one submission. Kernels in a graph keep the
// arguments they were captured with, so anything that changes per step (the token, the position) must be
// read from device memory that is written before each replay.
#pragma once

#include <cstddef>

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

struct CUgraphExec_st;
struct CUevent_st;

namespace petrel::cuda {

// A non-blocking stream on the current device, destroyed with the object.
class CudaStream {
 public:
  CudaStream() = default;
  static Result<CudaStream> create();
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Stream get() const { return stream_; }
  // Waits for the work on this stream and reports any error it left.
  Status synchronize() const;

 private:
  Stream stream_ = nullptr;
};

// An event without timing, to order work between streams: record() on one, wait_in() on another. Used to fork
// independent kernels onto side streams and join them back; inside a graph capture this becomes graph edges.
class CudaEvent {
 public:
  CudaEvent() = default;
  static Result<CudaEvent> create();
  // An event that also records a GPU timestamp (elapsed_ms).
  static Result<CudaEvent> create_timed();
  // Milliseconds of GPU time between two recorded timed events, once `end` has completed.
  static Result<double> elapsed_ms(const CudaEvent& start, const CudaEvent& end);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  Status record(Stream stream) const;
  // Work issued on `stream` after this call waits for the work recorded before the last record().
  Status wait_in(Stream stream) const;
  // The host waits for the work recorded before the last record().
  Status synchronize() const;

 private:
  CUevent_st* event_ = nullptr;
};

// The work issued on a stream between begin_capture and end_capture, replayable with launch.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Between the two calls, launches on `stream` are recorded, not run (the stream must not be the legacy
  // default stream). A failed capture leaves the graph empty and the stream usable.
  static Status begin_capture(Stream stream);
  static Result<CudaGraph> end_capture(Stream stream);
  bool empty() const { return exec_ == nullptr; }
  Status launch(Stream stream) const;

 private:
  CUgraphExec_st* exec_ = nullptr;
};

// Host <-> device copies ordered on `stream` (asynchronous with pinned host memory, otherwise staged).
Status copy_to_device(void* device, const void* host, size_t bytes, Stream stream);
Status copy_to_host(void* host, const void* device, size_t bytes, Stream stream);
// Device-to-device, ordered on `stream`.
Status copy_on_device(void* destination, const void* source, size_t bytes, Stream stream);

// Page-locked host memory (copies to and from it overlap with other work and are captured in graphs), mapped
// into the device's address space: kernels may read and write it directly through device_data() (zero-copy,
// over the bus; worth it for results written once and read by the host, such as the decode step's logits).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return size_; }
  // The address kernels use for this memory (the same as data() on unified-addressing systems), or null when
  // the device cannot map it.
  void* device_data() const { return device_; }

 private:
  void* data_ = nullptr;
  void* device_ = nullptr;
  size_t size_ = 0;
};

}  // namespace petrel::cuda
