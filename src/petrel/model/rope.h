// Rotary position embedding tables for Llama-family models, computed exactly as transformers does
// (modeling_rope_utils.py: `_compute_default_rope_parameters`, `_compute_llama3_parameters`,
// `_compute_linear_scaling_rope_parameters`), in float32 like PyTorch.
#pragma once

#include <cstdint>
#include <vector>

#include "petrel/io/hf_config.h"

namespace petrel {

// inv_freq[head_dim / 2] after scaling.
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim);

// cos/sin for positions [first, first + count): each [count, head_dim / 2], as the kernels take them.
void rope_cos_sin(const std::vector<float>& inv_freq, int64_t first_position, int64_t count, float* cos, float* sin);

}  // namespace petrel
