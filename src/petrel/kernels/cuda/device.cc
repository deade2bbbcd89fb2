// kernels/cuda: device queries and device memory through the CUDA runtime (linked statically).
#if PETREL_HAVE_CUDA

#include "petrel/kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "petrel/kernels/cuda/cuda_check.h"

namespace petrel::cuda {

namespace {

std::string version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// No driver and no device mean "no GPU here", not a failure.
bool means_no_device(cudaError_t error) {
  return error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver || error == cudaErrorNotSupported ||
         error == cudaErrorSystemNotReady || error == cudaErrorCompatNotSupportedOnDevice;
}

}  // namespace

bool built_with_cuda() { return true; }

namespace {
thread_local int launch_carveout = -1;
}  // namespace

int overlapped_launch_carveout() { return launch_carveout; }
int set_overlapped_launch_carveout(int percent) { return std::exchange(launch_carveout, percent); }

std::string runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return "unknown";
  return version_string(version);
}

std::string driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess || version == 0) return "none";
  return version_string(version);
}

std::string no_device_reason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear it: this query is no failure of a later call
    return cudaGetErrorString(error);
  }
  return count == 0 ? "the CUDA runtime reports no device" : "";
}

Result<DeviceInfo> device_info(int device) {
  cudaDeviceProp prop{};
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device),
                              "cudaGetDeviceProperties(device " + std::to_string(device) + ")");
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.l2_cache_bytes = prop.l2CacheSize;
  info.shared_memory_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  int clock_khz = 0, bus_bits = 0;  // attributes: CUDA 13's cudaDeviceProp no longer has the memory clock
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess) {
    info.peak_memory_bandwidth = int64_t{2} * clock_khz * 1000 * (bus_bits / 8);
  } else {
    cudaGetLastError();  // no memory clock is no error: the bandwidth stays unknown (0)
  }
  return info;
}

Result<std::vector<DeviceInfo>> list_devices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (means_no_device(error)) {
    cudaGetLastError();
    return std::vector<DeviceInfo>{};
  }
  PETREL_CUDA_RETURN_IF_ERROR(error, "cudaGetDeviceCount");
  std::vector<DeviceInfo> devices;
  for (int d = 0; d < count; ++d) {
    PETREL_ASSIGN_OR_RETURN(DeviceInfo info, device_info(d));
    devices.push_back(std::move(info));
  }
  return devices;
}

Status set_device(int device) { return cuda_status(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"); }

Result<int> current_device() {
  int device = 0;
  PETREL_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

Status synchronize() { return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

Result<MemoryInfo> memory_info() {
  size_t free_bytes = 0, total_bytes = 0;
  PETREL_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return MemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  if (const cudaError_t e = cudaMalloc(&buffer.data_, bytes); e != cudaSuccess) {
    cudaGetLastError();  // the failure is returned here, not left for a later launch's check to report
    return cuda_status(e, "cudaMalloc(" + std::to_string(bytes) + " bytes)");
  }
  buffer.size_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);  // an error here (a dead context) has no one to go to
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

namespace {
Status check_span(size_t size, size_t bytes, size_t offset, const char* what) {
  if (offset > size || bytes > size - offset) {
    return out_of_range(std::string(what) + ": " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                        " do not fit a device buffer of " + std::to_string(size) + " bytes");
  }
  return ok_status();
}
}  // namespace

Status DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  PETREL_RETURN_IF_ERROR(check_span(size_, bytes, offset, "DeviceBuffer::upload"));
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice),
                     "cudaMemcpy host to device");
}

Status DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  PETREL_RETURN_IF_ERROR(check_span(size_, bytes, offset, "DeviceBuffer::download"));
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
                     "cudaMemcpy device to host");
}

Status DeviceBuffer::fill_bytes(uint8_t value) {
  if (size_ == 0) return ok_status();
  return cuda_status(cudaMemset(data_, value, size_), "cudaMemset");
}

}  // namespace petrel::cuda

#endif  // PETREL_HAVE_CUDA
