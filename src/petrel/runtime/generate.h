// Generation over a LlamaModel: new tokens through the prompt processor, then the token generator one token at a
// time. `continue_generation` is the one decoding loop; `generate` (fresh context) and Session (a dialog that
// keeps its KV cache) are built on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "petrel/model/llama.h"
#include "petrel/runtime/sampler.h"
#include "petrel/util/status.h"

namespace petrel {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  int64_t prompt_chunk_size = 128;  // the prompt processor's sequence length
  int64_t context_length = 4096;    // generate(): capped at the model's max_position_embeddings
  SamplerConfig sampler;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these (it is reported)
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;  // the first included
  double prompt_seconds = 0;  // prefill and sampling of the first token (time to first token)
  double decode_seconds = 0;  // the tokens after the first
};

enum class StopReason { kEndOfSequence, kStopString, kMaxTokens, kContextFull, kAborted, kCallback };
const char* stop_reason_name(StopReason reason);

// Called for each generated token (stop tokens included); return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

struct Continuation {
  std::vector<int32_t> tokens;
  StopReason reason = StopReason::kMaxTokens;
  GenerateStats stats;
};

// Appends `new_tokens` to the dialog held by `cache` and `history` (the tokens whose keys and values the cache
// holds) and generates. The last generated token is not fed, so it is not in the cache or the history.
// Fails with kOutOfRange, changing nothing, when `new_tokens` do not fit. `abort` is polled between tokens.
Result<Continuation> continue_generation(const LlamaModel& model, KvCache& cache, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token = {},
                                         const std::atomic<bool>* abort = nullptr);

// A fresh context of options.context_length positions.
Result<std::vector<int32_t>> generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenCallback& on_token = {},
                                      GenerateStats* stats = nullptr);

}  // namespace petrel
