// Small helpers shared by the CLI's command files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "petrel/runtime/session.h"
#include "petrel/util/status.h"

namespace petrel::cli {

// Parses "1,2,3", "1 2 3" or any mix of commas and whitespace into ids; names the bad item on error.
Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& what);

// Loads a model for run-time commands (chat, serve, eval): --backend's name checked, the CPU thread pool sized
// (threads 0: all cores), the GPU's KV cache for context_length positions, --deterministic, serve's --host-masks.
Result<std::shared_ptr<Engine>> load_engine(const std::string& model, const std::string& backend, int64_t context_length,
                                            bool deterministic, int threads, bool host_masks = false);

// Held-out text as tokens for perplexity-style evaluation (validate, eval ppl/kld): `text_path`, or when empty
// the last `tail` of the shipped WikiText-2 corpus (quantize calibrates on the rest); tokenized with the model
// directory's tokenizer, BOS first. *bos gets the BOS id (the tokenizer's, else config_bos); *described says
// which text was read.
struct HeldOutTokens {
  std::vector<int32_t> tokens;
  int32_t bos = 0;
  std::string description;
};
Result<HeldOutTokens> held_out_tokens(const std::string& model_dir, const std::string& text_path, double tail,
                                      std::optional<int32_t> config_bos);
Result<HeldOutTokens> held_out_tokens(const Tokenizer& tokenizer, const std::string& text_path, double tail,
                                      std::optional<int32_t> config_bos);

}  // namespace petrel::cli
