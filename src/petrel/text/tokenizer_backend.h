// Internal to the text module: what a tokenizer model (byte-level BPE, SentencePiece) provides to
// petrel::Tokenizer, which adds the parts common to both (added/special tokens, untrusted ranges, the
// post-processor, validation, streaming). Not part of the public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/util/status.h"

namespace petrel::text_internal {

// A token matched in the text before the model sees it (tokenizer.json "added_tokens", or SentencePiece
// control pieces). `special` tokens are the ones parse_special and untrusted ranges govern.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // the match also takes the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matched when not inside a word
};

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;

  // Appends the ids of `text`, a stretch of valid UTF-8 that contains no recognized added token.
  virtual Status encode_segment(std::string_view text, std::vector<int32_t>& out) const = 0;

  // Appends the bytes that token `id` stands for (not an added token). `at_start` is true when nothing
  // has been decoded before it: SentencePiece drops the space of its dummy prefix there.
  // Returns false when the model has no such id.
  virtual bool append_token_bytes(int32_t id, bool at_start, std::string& out) const = 0;

  // The token's string as the model file spells it (byte-level BPE: "Ġthe"; SentencePiece: "▁the").
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;

  // One more than the largest id of the model (added tokens are counted by the caller).
  virtual int32_t vocab_size() const = 0;

  virtual const char* kind() const = 0;
};

}  // namespace petrel::text_internal
