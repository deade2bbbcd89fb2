// `petrel quantize`: a bf16/f16/f32 Hugging Face Llama checkpoint in, a W4A16 GPTQ-convention checkpoint out.
//
// Streaming and bounded memory: tensors are read from the memory-mapped source one at a time (their pages
// released after use), quantized, and written in order; GPTQ keeps one decoder layer's float weights and the
// calibration activations. Calibration flows layer by layer: each layer's linears are quantized from the
// Hessian of their inputs in the order q/k/v, o, gate/up, down (each group sees the outputs of the already
// quantized ones: "true sequential"), and the quantized layer's outputs feed the next layer.
//
// Output (docs/QUANTIZATION.md): per linear `qweight`/`qzeros`/`scales`/`g_idx` (GPTQ v1, loadable by vLLM
// and transformers), norms and embedding in the source dtype (the embedding optionally RTN-quantized, a petrel
// extension), the LM head 8-bit per channel by default,
// `quantization_config` in config.json with petrel's recipe under "petrel". Written to a temporary
// directory renamed into place when complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "petrel/quant/calibration.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"
#include "petrel/util/status.h"

namespace petrel::quant {

enum class QuantMethod { kRtn, kGptq };
const char* method_name(QuantMethod method);

// Where GPTQ runs (RTN always runs on the CPU). kAuto: CUDA when this build has it and a device is present.
// On CUDA the calibration activations and the layer being quantized live in device memory (quant/gptq_cuda.h);
// host memory holds the memory-mapped source and one linear's codes at a time.
enum class QuantDevice { kAuto, kCpu, kCuda };
const char* device_name(QuantDevice device);

struct QuantizeOptions {
  QuantMethod method = QuantMethod::kGptq;
  QuantScheme scheme;  // decoder linears; default: 4-bit symmetric per output channel (Qualcomm's W4A16)
  bool quantize_lm_head = true;
  QuantScheme lm_head_scheme{8, -1, true};
  // The embedding table, RTN per token row (a lookup has no input Hessian for GPTQ to use). Off by default:
  // GPTQ loaders other than petrel (vLLM, transformers) expect a float embedding.
  bool quantize_embedding = false;
  QuantScheme embedding_scheme{8, -1, true};
  // More bits where llama.cpp's Q4_K_M spends them: these projections ("v_proj", "down_proj"; any of the seven
  // short names) at `more_bits` bits (the same group size) in the first and last eighth of the layers and every
  // third layer between (more_bits_layer()); declared per module in quantization_config.dynamic.
  std::vector<std::string> more_bits_modules;
  int more_bits = 8;
  CalibrationOptions calibration;  // GPTQ only
  GptqOptions gptq;
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;
  bool show_progress = true;
  int64_t max_layers = -1;  // quantize only the first N layers and stop without writing (timing runs); -1: all
  QuantDevice device = QuantDevice::kAuto;  // kCuda without a usable device is an error
};

struct QuantizeReport {
  double seconds = 0;
  int64_t calibration_tokens = 0;
  int64_t layers_done = 0;
  double seconds_per_layer = 0;
  uint64_t output_bytes = 0;
  QuantDevice device = QuantDevice::kCpu;  // where GPTQ ran (kAuto resolved)
};

// llama.cpp's use_more_bits(i, n): the layers Q4_K_M gives its larger type for v and down.
bool more_bits_layer(int64_t layer, int64_t n_layers);

Status quantize_checkpoint(const std::filesystem::path& source, const std::filesystem::path& out,
                           const QuantizeOptions& options, QuantizeReport* report = nullptr);

}  // namespace petrel::quant
