// Plain generation over a LlamaModel: the prompt through the prompt processor, then the token generator one
// token at a time. The session/dialog API with stop strings, abort and KV save/restore builds on this.
#pragma once

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
  int64_t context_length = 4096;    // capped at the model's max_position_embeddings
  SamplerConfig sampler;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these (it is reported)
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prompt_seconds = 0;  // prefill and sampling of the first token (time to first token)
  double decode_seconds = 0;  // the tokens after the first
};

// Called for each generated token; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

Result<std::vector<int32_t>> generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenCallback& on_token = {},
                                      GenerateStats* stats = nullptr);

}  // namespace petrel
