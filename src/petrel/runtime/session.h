// The runtime library API: an Engine holds a loaded model (checkpoint or bundle) and its tokenizer and chat
// template; a Session is one dialog over it with its own KV cache (Genie's dialog handle).
//
//   auto engine = Engine::load("bundle/config.json");
//   Session session(*engine, 4096);
//   auto result = session.query(messages, GenerationConfig{}, ChatPromptOptions{}, on_token);
//
// Multi-turn: query() renders the whole conversation and processes only the tokens after the longest prefix
// already in the KV cache, so earlier turns are not processed again. abort() may be called from another thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/model/llama.h"
#include "petrel/runtime/generate.h"
#include "petrel/runtime/prompt.h"
#include "petrel/runtime/sampler.h"
#include "petrel/text/chat_template.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/status.h"

namespace petrel {

struct GenerationConfig {
  SamplerConfig sampler;
  int64_t max_new_tokens = 256;
  std::optional<std::vector<int32_t>> stop_token_ids;  // unset: the model's EOS ids
  std::vector<std::string> stop_strings;               // generation ends when the text contains one (not emitted)
  int64_t prompt_chunk_size = 128;
};

// Timings of one query; rates follow Genie's definitions (see profile.h).
struct QueryStats {
  int64_t prompt_tokens = 0;     // processed by this query
  int64_t reused_tokens = 0;     // found in the KV cache already
  int64_t generated_tokens = 0;  // the first included
  double time_to_first_token_s = 0;
  double generation_s = 0;  // the tokens after the first
  double prompt_rate() const { return time_to_first_token_s > 0 ? prompt_tokens / time_to_first_token_s : 0; }
  double generation_rate() const { return generation_s > 0 ? generated_tokens / generation_s : 0; }
};

struct QueryResult {
  std::vector<int32_t> tokens;
  std::string text;  // decoded, stop string removed
  StopReason reason = StopReason::kMaxTokens;
  QueryStats stats;
};

// Streaming callback: each token and the text it completes (possibly empty); return false to stop.
using StreamCallback = std::function<bool(int32_t token, std::string_view text)>;

class Engine {
 public:
  static Result<std::shared_ptr<Engine>> load(const std::filesystem::path& model_path, const ModelLoadOptions& options = {});
  const LlamaModel& model() const { return *model_; }
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  const text::ChatTemplateSet* templates() const { return templates_ ? &*templates_ : nullptr; }

 private:
  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<text::ChatTemplateSet> templates_;
};

class Session {
 public:
  // kv_type: the KV cache's element type (f16 by default; q8 quarters float32's memory, f32 is the reference).
  Session(std::shared_ptr<const Engine> engine, int64_t context_length, KvType kv_type = KvType::kF16);

  // Appends `tokens` to the dialog and generates. Fails with kOutOfRange ("Context Size was exceeded") when
  // they do not fit, leaving the session as it was.
  Result<QueryResult> query_tokens(std::span<const int32_t> tokens, const GenerationConfig& config,
                                   const StreamCallback& on_token = {});
  // Renders `messages` (the whole conversation) with the model's chat template and reuses the cached prefix.
  Result<QueryResult> query(const nlohmann::ordered_json& messages, const GenerationConfig& config,
                            const ChatPromptOptions& prompt_options = {}, const StreamCallback& on_token = {},
                            const nlohmann::ordered_json* tools = nullptr);

  void abort() { abort_.store(true); }  // thread-safe; the running query stops after its current token
  void reset();
  Status save(const std::filesystem::path& path) const;  // the dialog's tokens and KV cache
  Status restore(const std::filesystem::path& path);

  int64_t position() const { return cache_.n_past; }
  int64_t context_length() const { return cache_.context_length; }
  const std::vector<int32_t>& history() const { return history_; }

 private:
  std::shared_ptr<const Engine> engine_;
  KvCache cache_;
  std::vector<int32_t> history_;  // tokens whose keys/values are in the cache, in order
  std::atomic<bool> abort_{false};
};

}  // namespace petrel
