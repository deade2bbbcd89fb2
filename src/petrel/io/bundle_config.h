// The bundle's config.json: Qualcomm Genie's dialog schema where it applies (`dialog.context`, `dialog.sampler`,
// `dialog.tokenizer`, `dialog.engine` with `backend`, `model.binary.ctx-bins` and `model.positional-encoding`),
// so `petrel run -c BUNDLE/config.json` takes the same file genie-t2t-run would, plus a top-level "petrel"
// section (format version, manifest, the Llama architecture). Parsed once into a typed struct; every key is
// checked (type, range, unknown keys are refused so a typo like "top_k" cannot be silently ignored), and
// every path is relative to the bundle directory and may not leave it. docs/BUNDLE_FORMAT.md lists the keys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/io/hf_config.h"
#include "petrel/util/status.h"

namespace petrel {

inline constexpr int64_t kBundleConfigVersion = 1;  // "petrel": {"version": 1}
inline constexpr const char* kBundleConfigFileName = "config.json";

enum class BundleBackend { kCpu, kCuda };
const char* bundle_backend_name(BundleBackend backend);  // "petrel-cpu", "petrel-cuda"
std::optional<BundleBackend> bundle_backend_from_name(std::string_view name);

// dialog.context
struct BundleContextConfig {
  int64_t size = 0;     // "size": context length in tokens
  int64_t n_vocab = 0;  // "n-vocab": logits per token
  std::optional<int32_t> bos_token;  // "bos-token"
  std::vector<int32_t> eos_tokens;   // "eos-token": one id or a list
};

// dialog.sampler.token-penalty
struct BundleTokenPenalty {
  double repetition_penalty = 1.0;  // "repetition-penalty", > 0, 1: off
  double presence_penalty = 0.0;    // "presence-penalty"
  double frequency_penalty = 0.0;   // "frequency-penalty"
  int64_t penalize_last_n = 64;     // "penalize-last-n", >= 0, 0: the whole history
};

// dialog.sampler, with Genie's defaults.
struct BundleSamplerConfig {
  std::optional<uint64_t> seed;  // "seed": unset (Genie's -1) means seeded from the clock
  double temp = 0.1;             // "temp", >= 0
  int64_t top_k = 0;             // "top-k", >= 0, 0: off
  double top_p = 0.8;            // "top-p", in (0, 1]
  std::optional<bool> greedy;    // "greedy"
  std::optional<BundleTokenPenalty> token_penalty;  // "token-penalty"
};

// petrel.architecture: the Llama shape the parts were exported for.
struct BundleArchitecture {
  std::string family = "llama";    // "family"
  int64_t hidden_size = 0;         // "hidden-size"
  int64_t n_layers = 0;            // "n-layers"
  int64_t n_heads = 0;             // "n-heads"
  int64_t n_kv_heads = 0;          // "n-kv-heads"
  int64_t head_dim = 0;            // "head-dim"
  int64_t ffn_size = 0;            // "ffn-size" (intermediate_size)
  int64_t vocab_size = 0;          // "vocab-size"
  double rms_norm_eps = 1e-5;      // "rms-norm-eps"
  bool tie_word_embeddings = false;  // "tie-word-embeddings"
};
BundleArchitecture bundle_architecture_from(const LlamaConfig& config);

struct BundleConfig {
  // dialog
  std::string dialog_type = "basic";       // "type"; only "basic"
  std::vector<std::string> stop_sequence;  // "stop-sequence" (optional)
  std::optional<int64_t> max_num_tokens;   // "max-num-tokens" (optional)
  BundleContextConfig context;
  BundleSamplerConfig sampler;
  std::string tokenizer_path = "tokenizer.json";  // dialog.tokenizer.path
  // dialog.engine
  std::optional<int64_t> n_threads;  // "n-threads"; unset: the runtime decides
  BundleBackend backend = BundleBackend::kCpu;  // engine.backend.type
  nlohmann::json backend_options = nlohmann::json::object();  // engine.backend[<type>], backend-defined
  std::vector<std::string> ctx_bins;  // engine.model.binary.ctx-bins: part_1_of_N.bin ... in part order
  // engine.model.positional-encoding
  int64_t rope_dim = 0;  // "rope-dim": head_dim / 2 (Genie's Llama 3.1 8B config: 64 for head_dim 128)
  RopeConfig rope;       // "rope-theta" and "rope-scaling" (llama3 or linear; absent: plain RoPE)
  // petrel
  std::string manifest_path = "manifest.json";       // petrel.manifest
  std::optional<std::string> tokenizer_config_path;  // petrel.tokenizer-config (chat template)
  BundleArchitecture architecture;                   // petrel.architecture

  // Not in the JSON: the directory the config was loaded from; paths above are relative to it.
  std::filesystem::path bundle_dir;
  std::filesystem::path ctx_bin_path(size_t i) const { return bundle_dir / ctx_bins.at(i); }
  std::filesystem::path tokenizer_file() const { return bundle_dir / tokenizer_path; }
  std::filesystem::path manifest_file() const { return bundle_dir / manifest_path; }
};

// Parses and validates everything that does not need the file system (types, ranges, consistency between
// context, positional encoding and architecture, lexical path checks). `source` names the file in errors.
Result<BundleConfig> parse_bundle_config(const nlohmann::json& config, const std::string& source);
// `config_json_or_dir`: BUNDLE/config.json (as genie-t2t-run's -c takes it) or BUNDLE. Parses, then resolves
// every path against the bundle directory, symbolic links included, and rejects one that leaves it. The files
// themselves need not exist yet (Bundle::open and inspect_bundle check them).
Result<BundleConfig> load_bundle_config(const std::filesystem::path& config_json_or_dir);
// The JSON written to config.json (Genie's key order).
nlohmann::ordered_json bundle_config_to_json(const BundleConfig& config);
// Validates like the reader (a config petrel writes is one petrel reads), then atomically writes
// BUNDLE_DIR/config.json.
Status write_bundle_config(const BundleConfig& config, const std::filesystem::path& bundle_dir);

// Resolves `relative` (the value of `key` in `source`) inside `bundle_dir`. Rejects an empty, absolute or
// ".."-containing path, and one whose resolution (weakly_canonical: symbolic links followed) leaves the
// bundle directory. The error names the source, the key and the path.
Result<std::filesystem::path> resolve_bundle_path(const std::filesystem::path& bundle_dir, const std::string& relative,
                                                  const std::string& key, const std::string& source);

}  // namespace petrel
