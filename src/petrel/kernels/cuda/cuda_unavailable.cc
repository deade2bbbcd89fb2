// kernels/cuda in a build without CUDA: every entry point of the backend exists and says it was not built,
// so that the runtime, the CLI and the tests compile and link the same way in both builds.
#if !PETREL_HAVE_CUDA

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"

namespace petrel::cuda {

namespace {
Status not_built() { return unsupported("the CUDA backend is not built (configure with nvcc available and -DPETREL_CUDA=ON)"); }
}  // namespace

bool built_with_cuda() { return false; }
Result<std::vector<DeviceInfo>> list_devices() { return std::vector<DeviceInfo>{}; }
Result<DeviceInfo> device_info(int) { return not_built(); }
std::string runtime_version() { return "none"; }
std::string driver_version() { return "unknown"; }
std::string no_device_reason() { return "CUDA backend not built"; }
Status set_device(int) { return not_built(); }
Result<int> current_device() { return not_built(); }
Status synchronize() { return not_built(); }

Result<DeviceBuffer> DeviceBuffer::allocate(size_t) { return not_built(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
Status DeviceBuffer::upload(const void*, size_t, size_t) { return not_built(); }
Status DeviceBuffer::download(void*, size_t, size_t) const { return not_built(); }
Status DeviceBuffer::fill_bytes(uint8_t) { return not_built(); }

Status gemv_gptq(const DeviceGptqMatrix&, const float*, float*, GemvWorkspace&, Stream, const GemvOptions&) {
  return not_built();
}

}  // namespace petrel::cuda

#endif  // !PETREL_HAVE_CUDA
