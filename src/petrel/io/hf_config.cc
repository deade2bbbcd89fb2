#include "petrel/io/hf_config.h"

#include <algorithm>
#include <regex>

#include "petrel/util/file.h"

namespace petrel {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* rope_scaling_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone: return "none";
    case RopeScalingType::kLlama3: return "llama3";
    case RopeScalingType::kLinear: return "linear";
  }
  return "?";
}

int GptqConfig::bits_for(const std::string& module) const {
  for (const Override& o : dynamic) {
    if (std::regex_match(module, o.regex)) return o.bits;
  }
  return bits;
}

int64_t LlamaConfig::parameter_count() const {
  const int64_t h = hidden_size;
  const int64_t per_layer = h * q_dim() + 2 * h * kv_dim() + q_dim() * h  // attention
                            + 3 * h * intermediate_size                  // gate, up, down
                            + 2 * h;                                     // two RMSNorms
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * per_layer + h;
}

namespace {

// Small typed accessors that name the file and key on error.
class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  Status require_int(const char* key, int64_t* out) const {
    if (!j_.contains(key)) return invalid_data(source_ + ": missing required key '" + key + "'");
    return get_int(key, out);
  }
  Status optional_int(const char* key, int64_t* out) const {
    if (!j_.contains(key) || j_[key].is_null()) return ok_status();
    return get_int(key, out);
  }
  Status optional_double(const char* key, double* out) const {
    if (!j_.contains(key) || j_[key].is_null()) return ok_status();
    if (!j_[key].is_number()) return invalid_data(source_ + ": '" + key + "' must be a number, found " + j_[key].dump());
    *out = j_[key].get<double>();
    return ok_status();
  }
  Status optional_bool(const char* key, bool* out) const {
    if (!j_.contains(key) || j_[key].is_null()) return ok_status();
    if (!j_[key].is_boolean()) return invalid_data(source_ + ": '" + key + "' must be true or false, found " + j_[key].dump());
    *out = j_[key].get<bool>();
    return ok_status();
  }
  Status optional_string(const char* key, std::string* out) const {
    if (!j_.contains(key) || j_[key].is_null()) return ok_status();
    if (!j_[key].is_string()) return invalid_data(source_ + ": '" + key + "' must be a string, found " + j_[key].dump());
    *out = j_[key].get<std::string>();
    return ok_status();
  }
  // An id, a list of ids, or null.
  Status optional_ids(const char* key, std::vector<int32_t>* out) const {
    if (!j_.contains(key) || j_[key].is_null()) return ok_status();
    const json& v = j_[key];
    auto add = [&](const json& x) -> Status {
      if (!x.is_number_integer()) return invalid_data(source_ + ": '" + key + "' must hold integer ids, found " + v.dump());
      out->push_back(x.get<int32_t>());
      return ok_status();
    };
    if (v.is_array()) {
      for (const json& x : v) PETREL_RETURN_IF_ERROR(add(x));
      return ok_status();
    }
    return add(v);
  }

 private:
  Status get_int(const char* key, int64_t* out) const {
    const json& v = j_[key];
    if (!v.is_number_integer()) return invalid_data(source_ + ": '" + key + "' must be an integer, found " + v.dump());
    *out = v.get<int64_t>();
    return ok_status();
  }
  const json& j_;
  std::string source_;
};

// `rope` holds either the classic `rope_scaling` object or the newer `rope_parameters` object.
Status parse_rope_object(const json& rope, const std::string& where, RopeConfig* out) {
  if (rope.is_null()) return ok_status();
  if (!rope.is_object()) return invalid_data(where + " must be an object or null, found " + rope.dump());
  Reader r(rope, where);
  PETREL_RETURN_IF_ERROR(r.optional_double("rope_theta", &out->theta));
  std::string type;
  PETREL_RETURN_IF_ERROR(r.optional_string("rope_type", &type));
  if (type.empty()) PETREL_RETURN_IF_ERROR(r.optional_string("type", &type));  // older key
  if (type.empty() || type == "default") {
    out->scaling = RopeScalingType::kNone;
  } else if (type == "llama3") {
    out->scaling = RopeScalingType::kLlama3;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!rope.contains(key)) return invalid_data(where + ": llama3 scaling needs '" + key + "'");
    }
    PETREL_RETURN_IF_ERROR(r.optional_double("factor", &out->factor));
    PETREL_RETURN_IF_ERROR(r.optional_double("low_freq_factor", &out->low_freq_factor));
    PETREL_RETURN_IF_ERROR(r.optional_double("high_freq_factor", &out->high_freq_factor));
    PETREL_RETURN_IF_ERROR(r.optional_int("original_max_position_embeddings", &out->original_max_position_embeddings));
    if (out->factor <= 0 || out->low_freq_factor <= 0 || out->high_freq_factor <= out->low_freq_factor ||
        out->original_max_position_embeddings <= 0) {
      return invalid_data(where + ": llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor, "
                                  "original_max_position_embeddings > 0; found " + rope.dump());
    }
  } else if (type == "linear") {
    out->scaling = RopeScalingType::kLinear;
    if (!rope.contains("factor")) return invalid_data(where + ": linear scaling needs 'factor'");
    PETREL_RETURN_IF_ERROR(r.optional_double("factor", &out->factor));
    if (out->factor <= 0) return invalid_data(where + ": linear scaling factor must be > 0");
  } else {
    return unsupported(where + ": rope type '" + type +
                       "' is not supported (petrel runs default, llama3 and linear RoPE exactly; "
                       "dynamic, yarn and longrope are not implemented)");
  }
  return ok_status();
}

Result<GptqConfig> parse_gptq_config(const json& q, const std::string& where) {
  if (!q.is_object()) return invalid_data(where + " must be an object");
  GptqConfig g;
  g.raw = q;
  Reader r(q, where);
  std::string method;
  PETREL_RETURN_IF_ERROR(r.optional_string("quant_method", &method));
  if (method != "gptq") {
    return unsupported(where + ": quant_method '" + method + "' is not supported (petrel reads GPTQ checkpoints)");
  }
  int64_t bits = 4;
  PETREL_RETURN_IF_ERROR(r.optional_int("bits", &bits));
  if (bits != 4 && bits != 8) return unsupported(where + ": " + std::to_string(bits) + "-bit GPTQ (petrel reads 4 and 8)");
  g.bits = static_cast<int>(bits);
  PETREL_RETURN_IF_ERROR(r.optional_int("group_size", &g.group_size));
  PETREL_RETURN_IF_ERROR(r.optional_bool("sym", &g.symmetric));
  PETREL_RETURN_IF_ERROR(r.optional_bool("desc_act", &g.desc_act));
  PETREL_RETURN_IF_ERROR(r.optional_bool("lm_head", &g.lm_head_quantized));
  if (q.contains("dynamic") && q["dynamic"].is_object()) {
    for (auto it = q["dynamic"].begin(); it != q["dynamic"].end(); ++it) {
      std::string key = it.key();
      if (key.rfind("-:", 0) == 0) continue;
      if (key.rfind("+:", 0) == 0) key = key.substr(2);
      const json& o = it.value();
      if (!o.is_object() || !o.contains("bits")) continue;
      if (!o["bits"].is_number_integer() || (o["bits"].get<int>() != 4 && o["bits"].get<int>() != 8)) {
        return unsupported(where + ".dynamic[\"" + it.key() + "\"].bits: petrel reads 4 and 8");
      }
      std::regex regex;
      try {
        regex = std::regex(key);
      } catch (const std::regex_error&) {
        return invalid_data(where + ".dynamic: '" + it.key() + "' is not a regular expression");
      }
      g.dynamic.push_back({key, std::move(regex), o["bits"].get<int>()});
    }
  }
  std::string format = "gptq";
  PETREL_RETURN_IF_ERROR(r.optional_string("checkpoint_format", &format));
  if (format == "gptq") g.zero_offset = 1;
  else if (format == "gptq_v2") g.zero_offset = 0;
  else return unsupported(where + ": checkpoint_format '" + format + "' (petrel reads gptq and gptq_v2)");
  return g;
}

}  // namespace

Result<LlamaConfig> parse_llama_config(const json& j, const std::string& source) {
  if (!j.is_object()) return invalid_data(source + ": not a JSON object");
  LlamaConfig c;
  Reader r(j, source);
  PETREL_RETURN_IF_ERROR(r.optional_string("model_type", &c.model_type));
  if (c.model_type != "llama") {
    return unsupported(source + ": model_type '" + c.model_type +
                       "' is not supported; petrel runs Llama-family checkpoints (model_type \"llama\")");
  }
  std::string act = "silu";
  PETREL_RETURN_IF_ERROR(r.optional_string("hidden_act", &act));
  if (act != "silu") return unsupported(source + ": hidden_act '" + act + "' is not supported (only silu)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    PETREL_RETURN_IF_ERROR(r.optional_bool(key, &bias));
    if (bias) return unsupported(source + ": '" + key + "': true is not supported (Llama 3 has no biases)");
  }
  PETREL_RETURN_IF_ERROR(r.require_int("hidden_size", &c.hidden_size));
  PETREL_RETURN_IF_ERROR(r.require_int("intermediate_size", &c.intermediate_size));
  PETREL_RETURN_IF_ERROR(r.require_int("num_hidden_layers", &c.num_hidden_layers));
  PETREL_RETURN_IF_ERROR(r.require_int("num_attention_heads", &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;  // transformers' default when absent
  PETREL_RETURN_IF_ERROR(r.optional_int("num_key_value_heads", &c.num_key_value_heads));
  PETREL_RETURN_IF_ERROR(r.require_int("vocab_size", &c.vocab_size));
  PETREL_RETURN_IF_ERROR(r.optional_double("rms_norm_eps", &c.rms_norm_eps));
  c.max_position_embeddings = 2048;  // transformers' LlamaConfig default
  PETREL_RETURN_IF_ERROR(r.optional_int("max_position_embeddings", &c.max_position_embeddings));
  PETREL_RETURN_IF_ERROR(r.optional_bool("tie_word_embeddings", &c.tie_word_embeddings));
  PETREL_RETURN_IF_ERROR(r.optional_string("torch_dtype", &c.torch_dtype));
  if (c.torch_dtype.empty()) PETREL_RETURN_IF_ERROR(r.optional_string("dtype", &c.torch_dtype));
  std::vector<int32_t> bos;
  PETREL_RETURN_IF_ERROR(r.optional_ids("bos_token_id", &bos));
  if (!bos.empty()) c.bos_token_id = bos.front();
  PETREL_RETURN_IF_ERROR(r.optional_ids("eos_token_id", &c.eos_token_ids));

  for (auto [name, value] : {std::pair{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                             {"num_hidden_layers", c.num_hidden_layers}, {"num_attention_heads", c.num_attention_heads},
                             {"num_key_value_heads", c.num_key_value_heads}, {"vocab_size", c.vocab_size},
                             {"max_position_embeddings", c.max_position_embeddings}}) {
    if (value <= 0) return invalid_data(source + ": '" + name + "' must be positive, found " + std::to_string(value));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return invalid_data(source + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                        ") is not a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    PETREL_RETURN_IF_ERROR(r.optional_int("head_dim", &c.head_dim));
    if (c.head_dim <= 0) return invalid_data(source + ": 'head_dim' must be positive");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return invalid_data(source + ": hidden_size (" + std::to_string(c.hidden_size) +
                          ") is not divisible by num_attention_heads and no head_dim is given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return invalid_data(source + ": head_dim " + std::to_string(c.head_dim) + " must be even for RoPE");
  if (c.rms_norm_eps <= 0) return invalid_data(source + ": rms_norm_eps must be positive");

  // RoPE: classic `rope_theta` + `rope_scaling`, or the newer `rope_parameters`.
  PETREL_RETURN_IF_ERROR(r.optional_double("rope_theta", &c.rope.theta));
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const json& params = j["rope_parameters"];
    // rope_parameters may also be keyed by layer type ({"full_attention": {...}}); Llama uses one set.
    if (params.is_object() && params.contains("full_attention") && params["full_attention"].is_object()) {
      PETREL_RETURN_IF_ERROR(parse_rope_object(params["full_attention"], source + ": rope_parameters.full_attention", &c.rope));
    } else {
      PETREL_RETURN_IF_ERROR(parse_rope_object(params, source + ": rope_parameters", &c.rope));
    }
  } else if (j.contains("rope_scaling")) {
    RopeConfig scaled = c.rope;
    PETREL_RETURN_IF_ERROR(parse_rope_object(j["rope_scaling"], source + ": rope_scaling", &scaled));
    scaled.theta = c.rope.theta;  // rope_scaling never carries theta in the classic layout
    c.rope = scaled;
  }
  if (c.rope.theta <= 0) return invalid_data(source + ": rope_theta must be positive");
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    PETREL_ASSIGN_OR_RETURN(c.quantization, parse_gptq_config(j["quantization_config"], source + ": quantization_config"));
  }
  return c;
}

Result<LlamaConfig> load_llama_config_file(const fs::path& path) {
  PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_data(path.string() + ": not valid JSON");
  return parse_llama_config(j, path.string());
}

Result<LlamaConfig> load_llama_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_data(path.string() + ": not valid JSON");
  PETREL_ASSIGN_OR_RETURN(LlamaConfig config, parse_llama_config(j, path.string()));
  // AutoGPTQ writes its settings to quantize_config.json instead of config.json.
  const fs::path autogptq_path = dir / "quantize_config.json";
  std::error_code exists_ec;
  if (!config.quantization && fs::exists(autogptq_path, exists_ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string qtext, read_text_file(autogptq_path));
    json q = json::parse(qtext, nullptr, false);
    if (q.is_discarded()) return invalid_data(autogptq_path.string() + ": not valid JSON");
    if (!q.contains("quant_method")) q["quant_method"] = "gptq";
    PETREL_ASSIGN_OR_RETURN(config.quantization, parse_gptq_config(q, autogptq_path.string()));
  }
  const fs::path gen_path = dir / "generation_config.json";
  std::error_code ec;
  if (fs::exists(gen_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string gen_text, read_text_file(gen_path));
    json g = json::parse(gen_text, nullptr, false);
    if (g.is_discarded() || !g.is_object()) return invalid_data(gen_path.string() + ": not a JSON object");
    std::vector<int32_t> eos;
    PETREL_RETURN_IF_ERROR(Reader(g, gen_path.string()).optional_ids("eos_token_id", &eos));
    for (int32_t id : eos) {
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) == config.eos_token_ids.end()) {
        config.eos_token_ids.push_back(id);
      }
    }
  }
  return config;
}

}  // namespace petrel
