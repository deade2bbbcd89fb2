// JSON mode (OpenAI's response_format {"type": "json_object"}): generation constrained so that the answer is one
// JSON object and nothing else. Before each token is sampled, every token whose bytes cannot continue a valid
// JSON object is masked out; once the object closes, only an end-of-sequence token may follow.
//
// JsonPrefix is the byte-level automaton: it accepts exactly the prefixes of RFC 8259 JSON texts whose top-level
// value is an object (strings checked as UTF-8 the way strict parsers check them: no overlong forms, surrogates
// or code points above U+10FFFF; no control characters), with limits a model needs and a parser does not:
// nesting at most kMaxDepth, and at most kMaxWhitespaceRun whitespace bytes in a row with at most one line break
// among them (a sampled model can otherwise emit whitespace forever; formatted JSON never needs more). Its state is a small fixed-size value, so trying a token is a copy and a
// few byte steps.
//
// JsonTokenTable holds each token's bytes and a precomputed class (plain string content: no quote, backslash or
// control byte and whole UTF-8 characters), which lets the mask accept most tokens inside a string without
// stepping through them; built once per tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/runtime/generate.h"
#include "petrel/text/tokenizer.h"

namespace petrel {

// Whitespace between JSON tokens, as the automata here allow it: at most `limit` bytes in a row with at most one
// line break among them (\n, or \r\n). take() a whitespace byte (false when over the limit); reset() at any
// other byte.
struct WhitespaceRun {
  uint8_t length = 0;
  bool newline = false, last_cr = false;
  bool take(unsigned char c, int limit) {
    if (++length > limit) return false;
    if (c == '\n' || c == '\r') {
      if (newline && !(c == '\n' && last_cr)) return false;
      newline = true;
    }
    last_cr = c == '\r';
    return true;
  }
  void reset() { *this = WhitespaceRun{}; }
};

// feed() for the automata here: one byte with the state restored on failure, or bytes (state unspecified on
// failure), over their step().
template <typename Automaton>
bool feed_byte_restoring(Automaton& a, unsigned char c) {
  const Automaton saved = a;
  if (a.step(c)) return true;
  a = saved;
  return false;
}
template <typename Automaton>
bool feed_bytes(Automaton& a, std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (!a.step(c)) return false;
  }
  return true;
}

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespaceRun = 16;

  // Any one JSON value instead of an object (json_schema.h embeds it for values its schema leaves free). A
  // number at the top level has no end of its own: can_end() says when the next byte may belong to what follows.
  static JsonPrefix any_value();
  bool can_end() const;
  bool in_number() const;

  // Feeds one byte; false (state unchanged) when no JSON object text continues this way.
  bool feed(unsigned char c);
  // Feeds bytes; false when one of them is rejected (the state is then unspecified: feed a copy).
  bool feed(std::string_view bytes);
  // The top-level object has closed: the text so far is a complete JSON object.
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string with no escape, multi-byte character or low surrogate pending: where plain text continues
  // the string, and where a byte other than the closing quote begins a new character.
  bool in_plain_string() const { return mode_ == Mode::kString && utf8_left_ == 0 && !need_low_surrogate_; }

 private:
  enum class Mode : uint8_t {
    kStart,         // before the top-level '{'
    kValue,         // a value must start (after ':' or ',' in an array)
    kKeyOrClose,    // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kCommaOrClose,  // after a value inside a container
    kValueOrClose,  // after '[': a value or ']'
    kString,
    kEscape,
    kUnicode,  // \uXXXX: hex digits left in unicode_left_
    kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits,
    kLiteral,  // true/false/null: literal_ points at the rest
    kDone,
  };
  template <typename A> friend bool feed_byte_restoring(A&, unsigned char);
  template <typename A> friend bool feed_bytes(A&, std::string_view);
  bool step(unsigned char c);  // feed() without restoring the state on failure
  bool open_value(unsigned char c);
  bool after_value();  // a value ended: what follows depends on the container
  bool end_number(unsigned char c);
  bool string_byte(unsigned char c);

  Mode mode_ = Mode::kStart;
  bool string_is_key_ = false;
  uint8_t depth_ = 0;
  WhitespaceRun ws_;
  uint8_t unicode_left_ = 0;
  uint16_t unicode_value_ = 0;
  bool need_low_surrogate_ = false;  // a \uD800-\uDBFF escape must be followed by a \uDC00-\uDFFF one
  uint8_t utf8_left_ = 0;              // continuation bytes still expected in a string
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the range of the next continuation byte
  const char* literal_ = nullptr;
  std::array<char, kMaxDepth> stack_{};  // '{' or '['
};

class JsonTokenTable {
 public:
  // Token bytes for every id of the vocabulary; special tokens can never be part of the JSON.
  static std::shared_ptr<const JsonTokenTable> build(const Tokenizer& tokenizer, int32_t vocab_size);
  int32_t size() const { return static_cast<int32_t>(kind_.size()); }
  std::string_view bytes(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return std::string_view(all_bytes_).substr(offset_[i], offset_[i + 1] - offset_[i]);
  }
  bool special(int32_t id) const { return kind_[static_cast<size_t>(id)] == kSpecial; }
  // Whole characters with no quote, backslash or control byte, at most kMaxPlainBytes long: tokens that leave a
  // plain string plain (and add at most kMaxPlainBytes characters to it, which a maxLength needs to know).
  bool plain_string_content(int32_t id) const { return kind_[static_cast<size_t>(id)] == kPlain; }
  static constexpr uint32_t kMaxPlainBytes = 64;
  // The non-special tokens grouped by their first two bytes (a one-byte token in its own group, `second` -1),
  // groups in byte order, each a range of by_bytes(): the mask visits only the groups whose two bytes a state
  // can take (after '{' ~500 of the Llama 3 vocabulary's 58,000 space-led tokens).
  struct Group {
    uint8_t first = 0;
    int16_t second = -1;
    uint32_t begin = 0, end = 0;
  };
  const std::vector<Group>& groups() const { return groups_; }
  const std::vector<int32_t>& by_bytes() const { return by_bytes_; }
  // The same over the tokens that are not plain_string_content (inside a plain string, what needs judging), and
  // those plain ones as a mask [size()] (1: plain), with whether there is any.
  const std::vector<Group>& other_groups() const { return other_groups_; }
  const std::vector<int32_t>& other_by_bytes() const { return other_by_bytes_; }
  const std::vector<uint8_t>& plain_mask() const { return plain_mask_; }
  bool any_plain() const { return any_plain_; }

 private:
  enum Kind : uint8_t { kOther, kPlain, kSpecial };
  std::vector<Group> groups_, other_groups_;
  std::vector<int32_t> by_bytes_, other_by_bytes_;
  std::vector<uint8_t> plain_mask_;
  bool any_plain_ = false;
  std::string all_bytes_;         // every token's bytes, one after another (the mask scans them in id order)
  std::vector<uint32_t> offset_;  // [size + 1]
  std::vector<uint8_t> kind_;
};

// A constraint's token mask for its current state (token_mask.h computes and applies it): computed ahead by
// LogitConstraint::prepare() or else at mask(), and forgotten when accept() moves the state.
struct PreparedMask {
  std::vector<uint8_t> allowed;  // [vocabulary]: 1 where the state can take the token next
  bool any = false;              // some token is allowed
  bool ready = false;
};

// A constraint over one generation (GenerateOptions::constraint) by a byte automaton (JsonPrefix, SchemaPrefix,
// CallShape): the token mask of its state (token_mask.h defines these), prepared ahead or at mask(), applied to
// logits or written as bits; accept() steps the state through the token's bytes.
template <typename Automaton>
class AutomatonConstraint : public LogitConstraint {
 public:
  void prepare() override;
  void mask(std::span<float> logits) override;
  bool writes_bits() const override { return true; }
  void write_bits(std::span<uint32_t> bits) override;
  void accept(int32_t token) override;
  bool complete() const { return state_.complete(); }

 protected:
  AutomatonConstraint(std::shared_ptr<const JsonTokenTable> table, std::vector<int32_t> end_ids, Automaton state)
      : table_(std::move(table)), end_ids_(std::move(end_ids)), state_(state) {}

  std::shared_ptr<const JsonTokenTable> table_;
  std::vector<int32_t> end_ids_;
  Automaton state_;
  PreparedMask mask_;
};

extern template class AutomatonConstraint<JsonPrefix>;  // json_constraint.cc

// JSON mode.
class JsonObjectConstraint final : public AutomatonConstraint<JsonPrefix> {
 public:
  JsonObjectConstraint(std::shared_ptr<const JsonTokenTable> table, std::vector<int32_t> end_ids)
      : AutomatonConstraint(std::move(table), std::move(end_ids), JsonPrefix()) {}
};

}  // namespace petrel
