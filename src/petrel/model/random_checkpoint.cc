#include "petrel/model/random_checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors_writer.h"
#include "petrel/util/dtype.h"
#include "petrel/util/file.h"
#include "petrel/util/parallel.h"

namespace petrel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// config.json of the public checkpoints (meta-llama/Llama-3.1-8B-Instruct, which
// nvidia/Llama-3.1-Nemotron-Nano-8B-v1 shares, and meta-llama/Llama-3.2-{1B,3B}-Instruct).
const std::map<std::string, const char*>& preset_table() {
  static const std::map<std::string, const char*> table = {
      {"llama-3.1-8b", R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"hidden_act":"silu","hidden_size":4096,
"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":131072,"mlp_bias":false,
"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"pretraining_tp":1,
"rms_norm_eps":1e-05,"rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":false,
"torch_dtype":"bfloat16","transformers_version":"4.43.0.dev0","use_cache":true,"vocab_size":128256})"},
      {"llama-3.2-1b", R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"head_dim":64,"hidden_act":"silu","hidden_size":2048,
"initializer_range":0.02,"intermediate_size":8192,"max_position_embeddings":131072,"mlp_bias":false,
"model_type":"llama","num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,"pretraining_tp":1,
"rms_norm_eps":1e-05,"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":true,
"torch_dtype":"bfloat16","transformers_version":"4.45.0.dev0","use_cache":true,"vocab_size":128256})"},
      {"llama-3.2-3b", R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"head_dim":128,"hidden_act":"silu","hidden_size":3072,
"initializer_range":0.02,"intermediate_size":8192,"max_position_embeddings":131072,"mlp_bias":false,
"model_type":"llama","num_attention_heads":24,"num_hidden_layers":28,"num_key_value_heads":8,"pretraining_tp":1,
"rms_norm_eps":1e-05,"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":true,
"torch_dtype":"bfloat16","transformers_version":"4.45.0.dev0","use_cache":true,"vocab_size":128256})"},
  };
  return table;
}

const char* kGenerationConfig =
    R"({"bos_token_id":128000,"do_sample":true,"eos_token_id":[128001,128008,128009],"temperature":0.6,"top_p":0.9})";

// splitmix64: a tiny, fast, well-distributed generator; each tensor gets its own stream so the output
// does not depend on the thread count.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct PlannedTensor {
  TensorSpec spec;
  bool is_norm = false;  // RMSNorm weights are ones, as transformers initialises them
};

// Fills bf16 values for elements [first, first + count) of a tensor: uniform with std 0.02
// (transformers' initializer_range), or 1.0 for norms. Deterministic per (seed, tensor, element block).
void fill_bf16(uint16_t* out, uint64_t first, uint64_t count, uint64_t tensor_seed, bool is_norm) {
  if (is_norm) {
    std::fill_n(out, count, f32_to_bf16(1.0f));
    return;
  }
  const float half_width = 0.02f * std::sqrt(3.0f);  // uniform(-a, a) has std a / sqrt(3)
  constexpr uint64_t kBlock = 4;  // one 64-bit draw gives four 16-bit uniforms
  uint64_t i = 0;
  while (i < count) {
    const uint64_t element = first + i;
    uint64_t state = tensor_seed ^ (element / kBlock) * 0xd1342543de82ef95ull;
    uint64_t bits = splitmix64(state);
    for (uint64_t k = element % kBlock; k < kBlock && i < count; ++k, ++i) {
      const int16_t u = static_cast<int16_t>((bits >> (16 * k)) & 0xffff);
      out[i] = f32_to_bf16(static_cast<float>(u) * (half_width / 32768.0f));
    }
  }
}

}  // namespace

std::vector<std::string> random_checkpoint_presets() {
  std::vector<std::string> names;
  for (const auto& [name, json] : preset_table()) names.push_back(name);
  return names;
}

Result<ojson> random_checkpoint_preset_config(const std::string& preset) {
  auto it = preset_table().find(preset);
  if (it == preset_table().end()) {
    std::string known;
    for (const auto& name : random_checkpoint_presets()) known += (known.empty() ? "" : ", ") + name;
    return invalid_argument("unknown preset '" + preset + "'; known presets: " + known);
  }
  return ojson::parse(it->second);
}

Status write_random_checkpoint(const fs::path& out_dir, const RandomCheckpointOptions& options,
                               const std::function<void(uint64_t, uint64_t)>& progress) {
  PETREL_ASSIGN_OR_RETURN(ojson config_json, random_checkpoint_preset_config(options.preset));
  if (options.num_layers) {
    if (*options.num_layers <= 0) return invalid_argument("--layers must be positive");
    config_json["num_hidden_layers"] = *options.num_layers;
  }
  if (!options.config_overrides.is_object()) return invalid_argument("config overrides must be a JSON object");
  for (auto it = options.config_overrides.begin(); it != options.config_overrides.end(); ++it) {
    config_json[it.key()] = it.value();
  }
  PETREL_ASSIGN_OR_RETURN(LlamaConfig c, parse_llama_config(nlohmann::json::parse(config_json.dump()), options.preset));

  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (!options.overwrite) return invalid_argument(out_dir.string() + ": already exists (pass --force to replace it)");
  }
  // Tensors in save_pretrained's order.
  std::vector<PlannedTensor> plan;
  const int64_t h = c.hidden_size;
  plan.push_back({{"model.embed_tokens.weight", DType::kBF16, {c.vocab_size, h}}, false});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    plan.push_back({{p + "input_layernorm.weight", DType::kBF16, {h}}, true});
    plan.push_back({{p + "mlp.down_proj.weight", DType::kBF16, {h, c.intermediate_size}}, false});
    plan.push_back({{p + "mlp.gate_proj.weight", DType::kBF16, {c.intermediate_size, h}}, false});
    plan.push_back({{p + "mlp.up_proj.weight", DType::kBF16, {c.intermediate_size, h}}, false});
    plan.push_back({{p + "post_attention_layernorm.weight", DType::kBF16, {h}}, true});
    plan.push_back({{p + "self_attn.k_proj.weight", DType::kBF16, {c.kv_dim(), h}}, false});
    plan.push_back({{p + "self_attn.o_proj.weight", DType::kBF16, {h, c.q_dim()}}, false});
    plan.push_back({{p + "self_attn.q_proj.weight", DType::kBF16, {c.q_dim(), h}}, false});
    plan.push_back({{p + "self_attn.v_proj.weight", DType::kBF16, {c.kv_dim(), h}}, false});
  }
  plan.push_back({{"model.norm.weight", DType::kBF16, {h}}, true});
  if (!c.tie_word_embeddings) plan.push_back({{"lm_head.weight", DType::kBF16, {c.vocab_size, h}}, false});

  // Shards: consecutive tensors up to max_shard_bytes each.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const uint64_t bytes = plan[i].spec.num_bytes();
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  PETREL_ASSIGN_OR_RETURN(auto staging, StagingDirectory::create(out_dir));
  const fs::path tmp_dir = staging->path();

  const bool sharded = shards.size() > 1;
  nlohmann::ordered_json weight_map;
  constexpr uint64_t kChunkElements = 8u << 20;  // 16 MiB of bf16 per write
  std::vector<uint16_t> buffer(kChunkElements);
  uint64_t done = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    if (sharded) std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    else std::snprintf(name, sizeof name, "model.safetensors");
    std::vector<TensorSpec> specs;
    for (size_t i : shards[s]) {
      specs.push_back(plan[i].spec);
      weight_map[plan[i].spec.name] = name;
    }
    PETREL_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(tmp_dir / name, specs, {{"format", "pt"}}));
    for (size_t i : shards[s]) {
      const PlannedTensor& t = plan[i];
      const uint64_t n = t.spec.num_bytes() / 2;
      uint64_t tensor_seed = options.seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
      for (uint64_t first = 0; first < n; first += kChunkElements) {
        const uint64_t count = std::min<uint64_t>(kChunkElements, n - first);
        ThreadPool::global().parallel_for(
            static_cast<int64_t>(count),
            [&](int64_t b, int64_t e) { fill_bf16(buffer.data() + b, first + b, e - b, tensor_seed, t.is_norm); },
            /*min_block=*/1 << 16);
        PETREL_RETURN_IF_ERROR(writer->write(buffer.data(), count * 2));
        done += count * 2;
        if (progress) progress(done, total_bytes);
      }
    }
    PETREL_RETURN_IF_ERROR(writer->finish());
  }
  if (sharded) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    PETREL_RETURN_IF_ERROR(write_file_atomic(tmp_dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  }
  PETREL_RETURN_IF_ERROR(write_file_atomic(tmp_dir / "config.json", config_json.dump(2) + "\n"));
  PETREL_RETURN_IF_ERROR(write_file_atomic(tmp_dir / "generation_config.json",
                                           nlohmann::ordered_json::parse(kGenerationConfig).dump(2) + "\n"));
  if (options.tokenizer_dir) {
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      const fs::path src = *options.tokenizer_dir / file;
      if (fs::exists(src, ec)) {
        fs::copy_file(src, tmp_dir / file, fs::copy_options::overwrite_existing, ec);
        if (ec) return io_error("cannot copy " + src.string() + ": " + ec.message());
      } else if (std::string(file) == "tokenizer.json") {
        return not_found(src.string() + ": no tokenizer.json to copy");
      }
    }
  }
  PETREL_RETURN_IF_ERROR(staging->commit());
  return ok_status();
}

}  // namespace petrel
