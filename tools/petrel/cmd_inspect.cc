// petrel inspect: what a checkpoint holds.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "commands.h"
#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors.h"

namespace petrel::cli {

namespace {

std::string human_bytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  return buf;
}

int run_inspect(const std::string& dir) {
  auto config = load_llama_config(dir);
  if (!config.ok()) return report_error("inspect", config.status());
  auto ckpt = SafetensorsCheckpoint::open(dir);
  if (!ckpt.ok()) return report_error("inspect", ckpt.status());
  const LlamaConfig& c = *config;
  std::map<std::string, int64_t> params_by_dtype;
  int64_t stored_params = 0;
  for (const std::string& name : ckpt->tensor_names()) {
    TensorView v = ckpt->tensor(name).value();
    params_by_dtype[std::string(dtype_name(v.dtype))] += v.num_elements();
    stored_params += v.num_elements();
  }
  std::printf("checkpoint:      %s\n", dir.c_str());
  std::printf("architecture:    %s, %lld layers, hidden %lld, FFN %lld\n", c.model_type.c_str(),
              (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.intermediate_size);
  std::printf("attention:       %lld query heads, %lld KV heads, head_dim %lld\n", (long long)c.num_attention_heads,
              (long long)c.num_key_value_heads, (long long)c.head_dim);
  std::printf("vocabulary:      %lld, %s embeddings\n", (long long)c.vocab_size,
              c.tie_word_embeddings ? "tied" : "untied");
  std::printf("context length:  %lld (max_position_embeddings)\n", (long long)c.max_position_embeddings);
  std::printf("rope:            theta %g, scaling %s", c.rope.theta, rope_scaling_name(c.rope.scaling));
  if (c.rope.scaling == RopeScalingType::kLlama3) {
    std::printf(" (factor %g, low %g, high %g, original context %lld)", c.rope.factor, c.rope.low_freq_factor,
                c.rope.high_freq_factor, (long long)c.rope.original_max_position_embeddings);
  } else if (c.rope.scaling == RopeScalingType::kLinear) {
    std::printf(" (factor %g)", c.rope.factor);
  }
  std::printf("\nparameters:      %lld (%.3f B)\n", (long long)stored_params, stored_params / 1e9);
  std::printf("dtypes:         ");
  for (const auto& [dtype, n] : params_by_dtype) std::printf(" %s %lld", dtype.c_str(), (long long)n);
  std::printf("\nbos / eos:       %s / ", c.bos_token_id ? std::to_string(*c.bos_token_id).c_str() : "none");
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i) std::printf(i ? ",%d" : "%d", c.eos_token_ids[i]);
  std::printf("\nfiles:\n");
  std::vector<const SafetensorsFile*> files;
  for (const auto& f : ckpt->files()) files.push_back(f.get());
  std::sort(files.begin(), files.end(), [](auto* a, auto* b) { return a->path() < b->path(); });
  for (const SafetensorsFile* f : files) {
    std::printf("  %-40s %10s  %zu tensors\n", f->path().filename().c_str(), human_bytes(f->file_size()).c_str(),
                f->tensors().size());
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, CliContext& ctx) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show what a checkpoint holds: architecture, parameters, dtypes, files");
  cmd->add_option("path", *dir, "Checkpoint directory")->required();
  cmd->callback([dir, &ctx] { ctx.exit_code = run_inspect(*dir); });
}

}  // namespace petrel::cli
