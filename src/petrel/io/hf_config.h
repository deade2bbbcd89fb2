// Hugging Face `config.json` of a Llama-family checkpoint, parsed once into a typed, validated struct.
// Reads the classic layout (`rope_theta`, `rope_scaling`) and the newer one (`rope_parameters`,
// transformers >= 5). Anything petrel cannot run exactly is refused with the key and the reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/util/status.h"

namespace petrel {

enum class RopeScalingType {
  kNone,    // plain RoPE: inv_freq_i = theta^(-2i/d)
  kLlama3,  // Llama 3.1 frequency-band scaling (transformers `_compute_llama3_parameters`)
  kLinear,  // positions divided by `factor` (transformers `_compute_linear_scaling_rope_parameters`)
};

struct RopeConfig {
  double theta = 10000.0;
  RopeScalingType scaling = RopeScalingType::kNone;
  double factor = 1.0;                         // llama3, linear
  double low_freq_factor = 1.0;                // llama3
  double high_freq_factor = 4.0;               // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

const char* rope_scaling_name(RopeScalingType type);

// `quantization_config` of a GPTQ checkpoint (ours or another tool's).
struct GptqConfig {
  int bits = 4;
  int64_t group_size = -1;  // -1: per output channel
  bool symmetric = true;
  bool desc_act = false;
  int zero_offset = 1;  // checkpoint_format "gptq" (v1) stores zero - 1; "gptq_v2" stores the zero
  bool lm_head_quantized = false;
  // GPTQModel's per-module overrides ("dynamic": {"+:REGEX": {"bits": 8, ...}}), in file order: a module whose
  // name the regex matches whole is stored with those bits ("-:" entries, modules left unquantized, are read
  // from the tensors themselves).
  struct Override {
    std::string pattern;
    std::regex regex;  // the pattern, compiled once when the config is read
    int bits = 4;
  };
  std::vector<Override> dynamic;
  nlohmann::json raw;  // the whole object, for tools that want petrel's extensions

  // The bits `module` ("model.layers.3.mlp.down_proj") is stored with: the first matching override's, else bits.
  int bits_for(const std::string& module) const;
};

struct LlamaConfig {
  std::string model_type;  // "llama"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // explicit in config.json, or hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-5;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // config.json's, plus generation_config.json's when loaded from a dir
  RopeConfig rope;
  std::string torch_dtype;  // as declared ("bfloat16"); informational
  std::optional<GptqConfig> quantization;  // set for GPTQ checkpoints

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // Parameters of the float model (embedding, layers, final norm, LM head unless tied).
  int64_t parameter_count() const;
};

// Parses and validates. `source` names the file in error messages.
Result<LlamaConfig> parse_llama_config(const nlohmann::json& config, const std::string& source);
// Reads DIR/config.json and, when present, DIR/generation_config.json (extra EOS ids).
Result<LlamaConfig> load_llama_config(const std::filesystem::path& dir);
// Reads one config.json-format file (no generation_config.json), e.g. a bundle's model_config.json.
Result<LlamaConfig> load_llama_config_file(const std::filesystem::path& file);

}  // namespace petrel
