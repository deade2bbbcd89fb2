// petrel inspect: what a checkpoint holds.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "commands.h"
#include "petrel/io/bundle.h"
#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors.h"
#include "petrel/model/llama.h"

namespace petrel::cli {

namespace {

std::string human_bytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  return buf;
}

// A bundle: its dialog config, parts, sizes and checksum status (every part is checked, not only the first
// bad one).
int run_inspect_bundle(const std::string& path) {
  auto summary = inspect_bundle(path);
  if (!summary.ok()) return report_error("inspect", summary.status());
  std::printf("bundle:          %s\n", summary->dir.c_str());
  if (summary->config) {
    const BundleConfig& c = *summary->config;
    std::printf("backend:         %s\n", bundle_backend_name(c.backend));
    std::printf("context:         %lld tokens, vocabulary %lld\n", (long long)c.context.size, (long long)c.context.n_vocab);
    std::printf("architecture:    %lld layers, hidden %lld, %lld/%lld heads, head_dim %lld, FFN %lld\n",
                (long long)c.architecture.n_layers, (long long)c.architecture.hidden_size, (long long)c.architecture.n_heads,
                (long long)c.architecture.n_kv_heads, (long long)c.architecture.head_dim, (long long)c.architecture.ffn_size);
  } else {
    std::printf("config:          UNREADABLE: %s\n", summary->config_error.c_str());
  }
  std::printf("parts:\n");
  for (const auto& p : summary->parts) {
    std::printf("  %-20s %10s  %4zu tensors  checksum %s%s%s\n", p.name.c_str(), human_bytes(p.file_size).c_str(),
                p.tensor_count, checksum_status_name(p.checksum), p.error.empty() ? "" : ": ", p.error.c_str());
  }
  std::printf("total:           %s in %zu tensors\n", human_bytes(summary->total_bytes()).c_str(), summary->total_tensors());
  std::string layouts;  // "plain 173, padded_rows 13" (padded_rows: qweight rows padded for the CPU kernels)
  for (const auto& [layout, count] : summary->total_layouts()) {
    layouts += (layouts.empty() ? "" : ", ") + layout + " " + std::to_string(count);
  }
  if (!layouts.empty()) std::printf("layouts:         %s\n", layouts.c_str());
  for (const auto& problem : summary->problems) std::printf("problem:         %s\n", problem.c_str());
  if (!summary->ok()) {
    std::fprintf(stderr, "petrel inspect: error: invalid data: the bundle has problems (see above)\n");
    return 3;
  }
  return 0;
}

// How one weight is stored: "BF16", "GPTQ w4 per-channel", "GPTQ w8 g128".
std::string weight_format(const LinearWeight& w) {
  if (w.kind == LinearWeight::Kind::kDense) return std::string(dtype_name(w.dense.dtype));
  const ref::GptqMatrix& g = w.gptq;
  return "GPTQ w" + std::to_string(g.bits) + (g.group_size == g.cols ? " per-channel" : " g" + std::to_string(g.group_size)) +
         (g.g_idx ? " act-order" : "");
}

int run_inspect(const std::string& dir) {
  if (is_bundle_path(dir)) return run_inspect_bundle(dir);
  auto config = load_llama_config(dir);
  if (!config.ok()) return report_error("inspect", config.status());
  auto ckpt = SafetensorsCheckpoint::open(dir);
  if (!ckpt.ok()) return report_error("inspect", ckpt.status());
  const LlamaConfig& c = *config;
  std::map<std::string, int64_t> params_by_dtype;
  for (const std::string& name : ckpt->tensor_names()) {
    TensorView v = ckpt->tensor(name).value();
    params_by_dtype[std::string(dtype_name(v.dtype))] += v.num_elements();
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
  // The model's parameters (the float model's count: a quantized checkpoint stores fewer, packed, elements), and
  // the files' size over them: llama.cpp's "bits per weight" of a whole file.
  const int64_t params = c.parameter_count();
  uint64_t file_bytes = 0;
  for (const auto& f : ckpt->files()) file_bytes += f->file_size();
  std::printf("\nparameters:      %lld (%.3f B); files %.2f bits per weight\n", (long long)params, params / 1e9,
              8.0 * static_cast<double>(file_bytes) / static_cast<double>(params));
  if (c.quantization) {
    auto model = LlamaModel::load(dir);
    if (!model.ok()) return report_error("inspect", model.status());
    const LlamaWeights& w = (*model)->weights();
    std::printf("weights:         layers %s, LM head %s, embedding %s\n", weight_format(w.layers.at(0).q_proj).c_str(),
                weight_format(w.lm_head).c_str(), weight_format(w.embed_tokens).c_str());
  }
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
  CLI::App* cmd = app.add_subcommand("inspect", "Show what a checkpoint or bundle holds: architecture, parameters, dtypes, files; checks bundle checksums");
  cmd->add_option("path", *dir, "Checkpoint directory, bundle directory or BUNDLE/config.json")->required();
  cmd->callback([dir, &ctx] { ctx.exit_code = run_inspect(*dir); });
}

}  // namespace petrel::cli
