// Internal to the text module: everything a loaded Tokenizer holds, filled by the file readers
// (tokenizer_json.cc, tokenizer_sentencepiece.cc) and completed by tokenizer.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "petrel/text/tokenizer_backend.h"
#include "petrel/util/status.h"

namespace petrel::text_internal {

struct TokenizerState {
  std::unique_ptr<TokenizerBackend> backend;
  std::vector<AddedToken> added_tokens;
  // What add_special puts around the ids (the post-processor's single-sequence template).
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;

  // Built by finish(): lookups by id and content, and the added-token matcher's index.
  std::unordered_map<int32_t, size_t> added_index_by_id;
  std::unordered_map<std::string, int32_t> added_id_by_content;
  // For each first byte, the added tokens that start with it, longest first (leftmost-longest matching).
  std::vector<std::vector<size_t>> added_by_first_byte;
  bool has_added_first_byte[256] = {};
  int32_t vocab_size = 0;

  void finish();
  const AddedToken* find_added(int32_t id) const {
    auto it = added_index_by_id.find(id);
    return it == added_index_by_id.end() ? nullptr : &added_tokens[it->second];
  }
};

// tokenizer.json -> state with backend, added tokens and post-processor. `source` names the file.
Result<std::unique_ptr<TokenizerState>> read_tokenizer_json(std::string_view json_text, const std::string& source);

// tokenizer.model (SentencePiece) -> state.
Result<std::unique_ptr<TokenizerState>> read_sentencepiece_model(const std::string& model_path);

}  // namespace petrel::text_internal
