// UTF-8 helpers for the tokenizer: validation with the offending offset, and the boundary arithmetic that
// the streaming decoder needs to hold back an incomplete multi-byte sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace petrel::utf8 {

// The byte offset of the first byte that does not start or continue a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF are malformed), or nullopt when `text` is
// valid. A sequence cut off by the end of `text` is malformed too.
std::optional<size_t> find_invalid(std::string_view text);

// How many leading bytes of `bytes` can be emitted without splitting a sequence: everything except a
// trailing, still-completable prefix of a multi-byte sequence (at most 3 bytes). Malformed bytes are not
// held back, since more input can never complete them; callers replace them (see sanitize).
size_t complete_prefix_length(std::string_view bytes);

// A copy of `bytes` with every malformed sequence replaced by U+FFFD, so the result is valid UTF-8.
std::string sanitize(std::string_view bytes);

// Appends the UTF-8 encoding of `code_point` (which must be a valid scalar value) to `out`.
void append_code_point(uint32_t code_point, std::string& out);

// Decodes the code point that starts at text[pos] in already validated UTF-8 and advances pos past it.
uint32_t decode_valid(std::string_view text, size_t& pos);

}  // namespace petrel::utf8
