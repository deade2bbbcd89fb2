// petrel::Tokenizer: text <-> token ids for Llama-family checkpoints.
//
// Loaded from a checkpoint directory:
//  - tokenizer.json (Hugging Face `tokenizers` format), byte-level BPE: Llama 3.x, GPT-2 style. The
//    pre-tokenizer, merges (either spelling), ignore_merges, added/special tokens and the post-processor
//    are read from the file; ids equal Hugging Face's.
//  - tokenizer.model (SentencePiece, Llama 2 style) through libsentencepiece, when there is no
//    tokenizer.json or the tokenizer.json is of a kind petrel does not read.
//  - tokenizer_config.json (optional) names bos/eos; generation_config.json (optional) adds eos ids.
// Anything else (another model type, normalizer or pre-tokenizer) is refused at load with a Status that
// names the file and the JSON path.
//
// Input text must be valid UTF-8: encode() returns kInvalidArgument naming the byte offset of the first
// bad byte rather than guessing (Hugging Face cannot be given such input either).
//
// A Tokenizer is immutable after load; encode/decode are safe to call from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "petrel/util/status.h"

namespace petrel {

struct EncodeOptions {
  // Apply the post-processor: for Llama 3, prepend <|begin_of_text|> (SentencePiece: BOS, and EOS when
  // tokenizer_config.json sets add_eos_token).
  bool add_special = false;
  // Recognize special tokens written in the text ("<|eot_id|>" -> 128009). When false they are encoded as
  // ordinary text. Non-special added tokens (tokenizer.json "special": false) are always recognized, as
  // Hugging Face does: they are vocabulary, not control.
  bool parse_special = true;
  // Byte ranges [begin, end) of the text that came from users or tools. A special token whose match
  // overlaps one of them is not recognized, so a user who types "<|eot_id|>" cannot end a turn. The text
  // is still pre-tokenized as a whole, so the ids equal Hugging Face's whenever those ranges hold no
  // special token. Ranges may overlap and come in any order; each must lie within the text.
  std::vector<std::pair<size_t, size_t>> untrusted_ranges;
};

namespace text_internal {
struct TokenizerState;
}

class Tokenizer {
 public:
  // Reads `directory` as described above.
  static Result<Tokenizer> load(const std::filesystem::path& directory);
  // Builds from the text of a tokenizer.json (and optionally a tokenizer_config.json; empty = none).
  // `source` names the file in error messages.
  static Result<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json = {},
                                     const std::string& source = "tokenizer.json");
  // Loads a SentencePiece model file.
  static Result<Tokenizer> from_sentencepiece(const std::filesystem::path& model_file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  Result<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The text of `ids`, byte for byte: decode(encode(x)) == x for byte-level BPE. Ids that split a
  // multi-byte character leave that partial sequence in the result as is (use StreamingDecoder or
  // utf8::sanitize for output that must be valid UTF-8). kOutOfRange for an id that is not a token.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Token strings as the tokenizer file spells them: "Ġthe" for byte-level BPE, "▁the" for SentencePiece,
  // "<|eot_id|>" for added tokens.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // The bytes token `id` decodes to on its own (" the"); nullopt for an unknown id.
  std::optional<std::string> token_bytes(int32_t id) const;

  // One more than the largest id, added tokens included (Llama 3.1: 128256).
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  // Every id that ends generation: tokenizer_config.json eos_token, generation_config.json eos_token_id,
  // and the Llama 3 end-of-turn/end-of-message tokens (<|eot_id|>, <|eom_id|>, <|end_of_text|>) when the
  // vocabulary has them as special tokens. Sorted, unique.
  const std::vector<int32_t>& eos_ids() const;
  bool is_special(int32_t id) const;
  // "bpe" or "sentencepiece".
  const char* kind() const;

 private:
  friend class StreamingDecoder;
  explicit Tokenizer(std::unique_ptr<text_internal::TokenizerState> state);
  // Appends the bytes of one id. at_start: no model token decoded yet (SentencePiece drops its dummy
  // prefix space there); cleared once one is. kOutOfRange for an unknown id.
  Status append_decoded(int32_t id, bool skip_special, bool& at_start, std::string& out) const;

  std::unique_ptr<text_internal::TokenizerState> state_;
};

// Turns ids into text one at a time, as a model generates them, and never emits a broken UTF-8 sequence:
// bytes of a character that is not complete yet are held until the ids that complete it arrive. Bytes
// that can never form a character are emitted as U+FFFD. Keeps a reference to the tokenizer.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  // The text that became complete with `id` (often empty while a character is incomplete).
  Result<std::string> push(int32_t id);
  // The held bytes at the end of generation, each incomplete sequence as U+FFFD; resets the decoder.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool at_start_ = true;
  std::string pending_;
};

}  // namespace petrel
