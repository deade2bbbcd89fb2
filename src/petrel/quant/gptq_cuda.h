// GPTQ on a CUDA device: the same method as gptq.h (Hessians, damping, Cholesky of the inverse, blocked column
// loop; kernels/cuda/gptq.cu says how each runs on the GPU) and the calibration flow of quantize_checkpoint
// with its activations in device memory. Plain C++ over kernels/cuda's API: in a build without CUDA every
// entry point answers "not built".
//
// Differences from the CPU path, all at float32 rounding level: cuBLAS's summation order and FMAs in the
// products, a float64 factorization by cuSOLVER instead of LAPACK, warp-order sums in the clipping search
// (tests/gptq_cuda_test.cc bounds the effect: >= 99% identical codes, proxy loss within 1%).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors.h"
#include "petrel/kernels/cuda/blas.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"
#include "petrel/util/status.h"

namespace petrel::quant {

// True when this build has the CUDA backend and the runtime sees a device (what --device auto asks).
bool cuda_gptq_available();
// Why cuda_gptq_available() is false, for error messages.
std::string cuda_gptq_unavailable_reason();

// cuBLAS and cuSOLVER handles on the current device. All work goes to the legacy default stream, so that the
// synchronous uploads and downloads of DeviceBuffer are ordered with the kernels without events.
class CudaGptqContext {
 public:
  static Result<CudaGptqContext> create();
  cuda::BlasHandle& blas() { return blas_; }
  cuda::SolverHandle& solver() { return solver_; }

 private:
  cuda::BlasHandle blas_;
  cuda::SolverHandle solver_;
};

// HessianAccumulator with device inputs: sum of x^T x in float32, upper triangle.
class CudaHessian {
 public:
  static Result<CudaHessian> create(int64_t dim);
  // x: [n_rows, dim] float32 in device memory.
  Status add(CudaGptqContext& context, const float* x, int64_t n_rows);
  int64_t dim() const { return dim_; }
  int64_t rows_seen() const { return rows_seen_; }
  const float* upper() const { return upper_.as<float>(); }
  // The full symmetric matrix [dim, dim] in float64 on the host, as HessianAccumulator::to_matrix.
  Result<std::vector<double>> to_matrix() const;

 private:
  int64_t dim_ = 0, rows_seen_ = 0;
  cuda::DeviceBuffer upper_;  // float32 [dim, dim]
};

// The inverse Hessian's upper Cholesky factor (float32) and dead-input mask of one input, shared by every
// linear that reads that input (q, k and v; gate and up).
struct CudaGptqInverse {
  int64_t cols = 0;
  cuda::DeviceBuffer u;     // float32 [cols, cols]
  cuda::DeviceBuffer dead;  // uint8 [cols]
  GptqReport report;
};
// From a device Hessian (consumed: `hessian` may be destroyed afterwards).
Result<CudaGptqInverse> gptq_inverse_cuda(CudaGptqContext& context, const CudaHessian& hessian,
                                          const GptqOptions& options, const std::string& what);
// From a host Hessian h[cols, cols] in float64 (quantize_gptq's argument).
Result<CudaGptqInverse> gptq_inverse_cuda(CudaGptqContext& context, const std::vector<double>& h, int64_t cols,
                                          const GptqOptions& options, const std::string& what);

// GPTQ of w[rows, cols] (float32, device memory) with a prepared inverse; on return w holds the dequantized
// weights. `what` names the tensor in errors. options.block_size above kernels/cuda's 128 columns is taken as 128
// (the lazy batch size changes only rounding, not the method).
Result<QuantizedMatrix> quantize_gptq_device(CudaGptqContext& context, float* w, int64_t rows, int64_t cols,
                                             const CudaGptqInverse& inverse, const QuantScheme& scheme,
                                             const GptqOptions& options, const std::string& what);

// quantize_gptq's contract (host W and H in, codes out), run on the current CUDA device.
Result<QuantizedMatrix> quantize_gptq_cuda(const std::vector<float>& w, int64_t rows, int64_t cols,
                                           const std::vector<double>& h, const QuantScheme& scheme,
                                           const GptqOptions& options = {}, GptqReport* report = nullptr);

// quantize_checkpoint's GPTQ calibration flow on the device: the residual stream of every calibration window
// lives in device memory; each decoder layer's weights are uploaded in their stored dtype and widened there
// (host memory holds no float copy of a layer). Within a layer, true sequential as on the CPU: q/k/v from the
// normed input, o from the attention of the quantized q/k/v, gate/up from the normed residual after the
// quantized attention, down from silu(gate) * up; the quantized layer's output feeds the next layer.
class CudaCalibration {
 public:
  // The linears of a decoder layer, in this order (quantize_checkpoint's kLinearNames).
  static constexpr int kLinears = 7;
  // Writes the embedding rows of `tokens` to out[tokens.size(), hidden] (float or quantized table).
  using EmbedRows = std::function<void(std::span<const int32_t> tokens, float* out)>;
  // samples: token windows of equal length (already checked against the vocabulary); embed: their embedding
  // rows; rope_cos / rope_sin: [seq_len, head_dim / 2] from rope_cos_sin.
  static Result<std::unique_ptr<CudaCalibration>> create(const LlamaConfig& config,
                                                         const std::vector<std::vector<int32_t>>& samples,
                                                         const EmbedRows& embed, const std::vector<float>& rope_cos,
                                                         const std::vector<float>& rope_sin);
  ~CudaCalibration();

  // Called before each linear is quantized (for progress) and with each result, in kLinearNames order.
  using OnStart = std::function<void(int linear)>;
  using OnResult = std::function<Status(int linear, const QuantizedMatrix& q)>;
  // weights[i]: linear i's [out, in] weight in its stored dtype; prefix ("model.layers.3.") and names name the
  // tensors in errors.
  Status quantize_layer(const std::array<TensorView, kLinears>& weights, const TensorView& input_norm,
                        const TensorView& post_norm, const std::array<QuantScheme, kLinears>& schemes,
                        const GptqOptions& options,
                        const std::string& prefix, const char* const* names, const OnStart& on_start,
                        const OnResult& on_result);
  // The LM head [vocab, hidden] from the Hessian of the final normed hidden states. Frees the per-layer device
  // buffers first (the calibration is done afterwards).
  Result<QuantizedMatrix> quantize_head(const TensorView& final_norm, const TensorView& head, const QuantScheme& scheme,
                                        const GptqOptions& options);

 private:
  struct Impl;
  explicit CudaCalibration(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace petrel::quant
