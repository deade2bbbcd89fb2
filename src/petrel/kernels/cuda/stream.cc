// kernels/cuda: streams, graphs and ordered copies through the CUDA runtime.
#if PETREL_HAVE_CUDA

#include "petrel/kernels/cuda/stream.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "petrel/kernels/cuda/cuda_check.h"

namespace petrel::cuda {

Result<CudaStream> CudaStream::create() {
  CudaStream stream;
  PETREL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream;
}

CudaStream::~CudaStream() {
  if (stream_) cudaStreamDestroy(stream_);
}

CudaStream::CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Status CudaStream::synchronize() const { return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

Result<CudaEvent> CudaEvent::create() {
  CudaEvent event;
  PETREL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event.event_, cudaEventDisableTiming), "cudaEventCreate");
  return event;
}

Result<CudaEvent> CudaEvent::create_timed() {
  CudaEvent event;
  PETREL_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event.event_), "cudaEventCreate");
  return event;
}

Result<double> CudaEvent::elapsed_ms(const CudaEvent& start, const CudaEvent& end) {
  float ms = 0.0f;
  PETREL_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, end.event_), "cudaEventElapsedTime");
  return static_cast<double>(ms);
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Status CudaEvent::record(Stream stream) const { return cuda_status(cudaEventRecord(event_, stream), "cudaEventRecord"); }

Status CudaEvent::wait_in(Stream stream) const {
  return cuda_status(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

Status CudaEvent::synchronize() const { return cuda_status(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

Status CudaGraph::begin_capture(Stream stream) {
  if (!stream) return invalid_argument("CUDA graph capture needs a stream of its own, not the default stream");
  // Thread-local mode: other threads' unrelated CUDA calls do not invalidate this capture.
  return cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

Result<CudaGraph> CudaGraph::end_capture(Stream stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return cuda_status(ended, "cudaStreamEndCapture");
  }
  CudaGraph result;
  const cudaError_t instantiated = cudaGraphInstantiate(&result.exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (instantiated != cudaSuccess) {
    result.exec_ = nullptr;
    return cuda_status(instantiated, "cudaGraphInstantiate");
  }
  return result;
}

Status CudaGraph::launch(Stream stream) const {
  if (!exec_) return internal_error("CudaGraph::launch: nothing was captured");
  return cuda_status(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
}

Status copy_to_device(void* device, const void* host, size_t bytes, Stream stream) {
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync to device");
}

Status copy_to_host(void* host, const void* device, size_t bytes, Stream stream) {
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync to host");
}

Status copy_on_device(void* destination, const void* source, size_t bytes, Stream stream) {
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpyAsync on device");
}

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  PETREL_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&buffer.data_, bytes, cudaHostAllocMapped),
                              "cudaHostAlloc(" + std::to_string(bytes) + " bytes, mapped)");
  buffer.size_ = bytes;
  if (cudaHostGetDevicePointer(&buffer.device_, buffer.data_, 0) != cudaSuccess) {
    buffer.device_ = nullptr;
    cudaGetLastError();  // not sticky; clear it so that it does not surface at an unrelated call
  }
  return buffer;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      device_(std::exchange(other.device_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    device_ = std::exchange(other.device_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace petrel::cuda

#endif  // PETREL_HAVE_CUDA
