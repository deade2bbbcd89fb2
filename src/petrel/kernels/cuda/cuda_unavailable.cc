// kernels/cuda in a build without CUDA: every entry point of the backend exists and says it was not built,
// so that the runtime, the CLI and the tests compile and link the same way in both builds.
#if !PETREL_HAVE_CUDA

#include "petrel/kernels/cuda/blas.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemm.h"
#include "petrel/kernels/cuda/gemv_dense.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/gemv_tma.h"
#include "petrel/kernels/cuda/gptq.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/cuda/resident_gemv.h"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/kernels/cuda/top_k.h"
#include "petrel/kernels/cuda/stream.h"

namespace petrel::cuda {

namespace {
Status not_built() { return unsupported("the CUDA backend is not built (configure with nvcc available and -DPETREL_CUDA=ON)"); }
}  // namespace

bool built_with_cuda() { return false; }
int overlapped_launch_carveout() { return -1; }
int set_overlapped_launch_carveout(int) { return -1; }
Result<std::vector<DeviceInfo>> list_devices() { return std::vector<DeviceInfo>{}; }
Result<DeviceInfo> device_info(int) { return not_built(); }
std::string runtime_version() { return "none"; }
std::string driver_version() { return "unknown"; }
std::string no_device_reason() { return "CUDA backend not built"; }
Status set_device(int) { return not_built(); }
Result<int> current_device() { return not_built(); }
Status synchronize() { return not_built(); }
Result<MemoryInfo> memory_info() { return not_built(); }

Result<BlasHandle> BlasHandle::create() { return not_built(); }
BlasHandle::~BlasHandle() = default;
BlasHandle::BlasHandle(BlasHandle&&) noexcept {}
BlasHandle& BlasHandle::operator=(BlasHandle&&) noexcept { return *this; }
Status BlasHandle::set_stream(Stream) { return not_built(); }
Result<SolverHandle> SolverHandle::create() { return not_built(); }
SolverHandle::~SolverHandle() = default;
SolverHandle::SolverHandle(SolverHandle&&) noexcept {}
SolverHandle& SolverHandle::operator=(SolverHandle&&) noexcept { return *this; }
Status SolverHandle::set_stream(Stream) { return not_built(); }

Result<DeviceBuffer> DeviceBuffer::allocate(size_t) { return not_built(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
Status DeviceBuffer::upload(const void*, size_t, size_t) { return not_built(); }
Status DeviceBuffer::download(void*, size_t, size_t) const { return not_built(); }
Status DeviceBuffer::fill_bytes(uint8_t) { return not_built(); }

Status gemv_gptq_tma_supports(const DeviceGptqMatrix&) { return not_built(); }
Status gemv_gptq_tma(const DeviceGptqMatrix&, const float*, float*, int, Stream, const GemvTmaOptions&) { return not_built(); }
Status gemv_gptq_tma_grouped(std::span<const GemvGroupMember>, const float*, int, Stream, const GemvTmaOptions&,
                             const GemvFusion&) {
  return not_built();
}

Status resident_gemv_supports(std::span<const ResidentGemv>, int, int64_t, const ResidentGemvOptions&) { return not_built(); }
struct ResidentGemvChains::Impl {};
ResidentGemvChains::ResidentGemvChains(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ResidentGemvChains::ResidentGemvChains() = default;
ResidentGemvChains::ResidentGemvChains(ResidentGemvChains&&) noexcept = default;
ResidentGemvChains& ResidentGemvChains::operator=(ResidentGemvChains&&) noexcept = default;
ResidentGemvChains::~ResidentGemvChains() = default;
Result<ResidentGemvChains> ResidentGemvChains::create(std::span<const std::vector<ResidentGemv>>, int64_t, const ResidentGemvOptions&) { return not_built(); }
void ResidentGemvChains::set_probe(int) {}
int ResidentGemvChains::size() const { return 0; }
int ResidentGemvChains::grid_blocks() const { return 0; }
int ResidentGemvChains::k_splits(int, int) const { return 0; }
int64_t ResidentGemvChains::weight_bytes(int) const { return 0; }
Status ResidentGemvChains::enqueue(int, Stream, bool) const { return not_built(); }

Status gemv_gptq(const DeviceGptqMatrix&, const float*, float*, GemvWorkspace&, Stream, const GemvOptions&,
                 const GemvFusion&) {
  return not_built();
}
Status gemv_gptq_grouped(std::span<const GemvGroupMember>, const float*, GemvWorkspace&, Stream, const GemvOptions&,
                         const GemvFusion&) {
  return not_built();
}
Status gemv_gptq_batch(std::span<const GemvGroupMember>, const float*, int64_t, GemvWorkspace&, Stream, const GemvOptions&,
                       const GemvFusion&) {
  return not_built();
}


Result<CudaStream> CudaStream::create() { return not_built(); }
CudaStream::~CudaStream() = default;
CudaStream::CudaStream(CudaStream&&) noexcept {}
CudaStream& CudaStream::operator=(CudaStream&&) noexcept { return *this; }
Status CudaStream::synchronize() const { return not_built(); }
Result<CudaEvent> CudaEvent::create() { return not_built(); }
Result<CudaEvent> CudaEvent::create_timed() { return not_built(); }
Result<double> CudaEvent::elapsed_ms(const CudaEvent&, const CudaEvent&) { return not_built(); }
CudaEvent::~CudaEvent() = default;
CudaEvent::CudaEvent(CudaEvent&&) noexcept {}
CudaEvent& CudaEvent::operator=(CudaEvent&&) noexcept { return *this; }
Status CudaEvent::record(Stream) const { return not_built(); }
Status CudaEvent::wait_in(Stream) const { return not_built(); }
Status CudaEvent::synchronize() const { return not_built(); }
CudaGraph::~CudaGraph() = default;
CudaGraph::CudaGraph(CudaGraph&&) noexcept {}
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept { return *this; }
Status CudaGraph::begin_capture(Stream) { return not_built(); }
Result<CudaGraph> CudaGraph::end_capture(Stream) { return not_built(); }
Status CudaGraph::launch(Stream) const { return not_built(); }
Status copy_to_device(void*, const void*, size_t, Stream) { return not_built(); }
Status copy_to_host(void*, const void*, size_t, Stream) { return not_built(); }
Status copy_on_device(void*, const void*, size_t, Stream) { return not_built(); }
Result<PinnedBuffer> PinnedBuffer::allocate(size_t) { return not_built(); }
PinnedBuffer::~PinnedBuffer() = default;
PinnedBuffer::PinnedBuffer(PinnedBuffer&&) noexcept {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&&) noexcept { return *this; }

Status rms_norm(float*, const float*, int64_t, int64_t, const DeviceVector&, float, float*, Stream, bool) { return not_built(); }
Status embedding_lookup(const DeviceDenseMatrix&, const int32_t*, int64_t, float*, Stream) { return not_built(); }
Status embedding_lookup_gptq(const DeviceGptqMatrix&, const int32_t*, int64_t, float*, Stream) { return not_built(); }
Status mask_logits(float*, const uint32_t*, int64_t, Stream, bool) { return not_built(); }
Status silu_mul(const float*, const float*, int64_t, float*, Stream, bool) { return not_built(); }
Status add_in_place(float*, const float*, int64_t, Stream) { return not_built(); }
Status gemv_dense(const DeviceDenseMatrix&, const float*, float*, Stream) { return not_built(); }
Status rope_store_kv(float*, const float*, const float*, const RopeShape&, const float*, const int32_t*, uint16_t*,
                     uint16_t*, Stream) {
  return not_built();
}
Status rope_store_kv_rows(float*, const float*, const float*, int64_t, int64_t, const RopeShape&, const float*,
                          uint16_t*, uint16_t*, Stream, bool) {
  return not_built();
}
int64_t prefill_attention_workspace_bytes(const PrefillAttentionShape&, int64_t, int64_t) { return 0; }
bool prefill_attention_short_preferred(int64_t, int64_t) { return false; }
Status prefill_attention_short(const float*, const uint16_t*, const uint16_t*, int64_t, int64_t, const PrefillAttentionShape&,
                               float*, Stream, bool) {
  return not_built();
}
Status prefill_attention(const float*, const uint16_t*, const uint16_t*, int64_t, int64_t, const PrefillAttentionShape&,
                         BlasHandle&, void*, int64_t, float*, Stream) {
  return not_built();
}
int64_t decode_attention_split(int64_t) { return 128; }
int64_t decode_attention_workspace_floats(const DecodeAttentionShape&) { return 0; }
Status decode_attention(const float*, const uint16_t*, const uint16_t*, const int32_t*, const DecodeAttentionShape&,
                        float*, float*, Stream) {
  return not_built();
}
Status decode_attention_rope(const float*, const float*, const float*, const float*, const int32_t*, uint16_t*,
                             uint16_t*, const DecodeAttentionShape&, float*, uint32_t*, float*, Stream, bool) {
  return not_built();
}

// gptq.h
Status gptq_hessian_add(const float*, int64_t, int64_t, float*, BlasHandle&, Stream) { return not_built(); }
Status gptq_hessian_to_f64(const float*, int64_t, double*, Stream) { return not_built(); }
Result<GptqInverseReport> gptq_inverse_factor(double*, int64_t, double, float*, uint8_t*, SolverHandle&, Stream,
                                              const std::string&) {
  return not_built();
}
Status gptq_quantize(float*, int64_t, int64_t, const float*, const uint8_t*, const GptqGrid&, int64_t, const GptqOutput&,
                     float*, BlasHandle&, Stream, const std::string&) {
  return not_built();
}
Status widen_to_f32(const void*, DType, int64_t, float*, Stream) { return not_built(); }
Status linear_f32(const float*, int64_t, const float*, int64_t, int64_t, float*, BlasHandle&, Stream) { return not_built(); }
Status rope_sequences(float*, int64_t, int64_t, int64_t, int64_t, const float*, const float*, Stream) { return not_built(); }
Status sequence_attention(const float*, const float*, const float*, int64_t, int64_t, const SequenceAttentionShape&,
                          float*, float*, BlasHandle&, Stream) {
  return not_built();
}

Status GemmWorkspace::bind_blas(Stream) { return not_built(); }
Status gemm_gptq(const DeviceGptqMatrix&, const float*, int64_t, float*, GemmWorkspace&, Stream, const GemmOptions&) {
  return not_built();
}
Status gemm_gptq_group(std::span<const GemvGroupMember>, const float*, int64_t, GemmWorkspace&, Stream, const GemmOptions&,
                       const GemmInputFusion&) {
  return not_built();
}
bool gemm_gptq_group_applies(std::span<const GemvGroupMember>, int64_t, const GemmWorkspace&, const GemmOptions&) {
  return false;
}
Status gemm_dense(const DeviceDenseMatrix&, const float*, int64_t, float*, GemmWorkspace&, Stream) { return not_built(); }
Status convert_floats(const float*, int64_t, DType, void*, Stream) { return not_built(); }
Status top_k_logits(const float*, int64_t, int, TopKResult*, void*, Stream, bool) { return not_built(); }
Status dequantize_gptq(const DeviceGptqMatrix&, void*, Stream) { return not_built(); }

}  // namespace petrel::cuda

#endif  // !PETREL_HAVE_CUDA
