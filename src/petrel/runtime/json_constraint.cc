#include "petrel/runtime/json_constraint.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>

#include "petrel/runtime/token_mask.h"

namespace petrel {

namespace {

bool is_whitespace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Whole UTF-8 characters with no quote, backslash or control byte, at most kMaxPlainBytes: text that leaves a
// plain string plain.
bool plain_string_bytes(std::string_view bytes) {
  if (bytes.empty() || bytes.size() > JsonTokenTable::kMaxPlainBytes) return false;
  JsonPrefix probe;
  // A string context: '{"' puts the automaton inside a key.
  probe.feed(std::string_view("{\"", 2));
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\' || c < 0x20) return false;
    if (!probe.feed(c)) return false;
  }
  return probe.in_plain_string();
}

}  // namespace

JsonPrefix JsonPrefix::any_value() {
  JsonPrefix p;
  p.mode_ = Mode::kValue;
  return p;
}

bool JsonPrefix::in_number() const {
  switch (mode_) {
    case Mode::kNumMinus: case Mode::kNumZero: case Mode::kNumInt: case Mode::kNumDot: case Mode::kNumFrac:
    case Mode::kNumExp: case Mode::kNumExpSign: case Mode::kNumExpDigits: return true;
    default: return false;
  }
}

bool JsonPrefix::can_end() const {
  if (mode_ == Mode::kDone) return true;
  const bool endable = mode_ == Mode::kNumZero || mode_ == Mode::kNumInt || mode_ == Mode::kNumFrac ||
                       mode_ == Mode::kNumExpDigits;
  return endable && depth_ == 0;
}

bool JsonPrefix::feed(unsigned char c) { return feed_byte_restoring(*this, c); }

bool JsonPrefix::feed(std::string_view bytes) { return feed_bytes(*this, bytes); }

bool JsonPrefix::after_value() {
  mode_ = depth_ == 0 ? Mode::kDone : Mode::kCommaOrClose;
  return true;
}

bool JsonPrefix::end_number(unsigned char c) {
  after_value();  // numbers only occur inside a container: this is kCommaOrClose
  return step(c);
}

bool JsonPrefix::open_value(unsigned char c) {
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= kMaxDepth) return false;
      stack_[depth_++] = static_cast<char>(c);
      mode_ = c == '{' ? Mode::kKeyOrClose : Mode::kValueOrClose;
      return true;
    case '"':
      mode_ = Mode::kString;
      string_is_key_ = false;
      return true;
    case '-': mode_ = Mode::kNumMinus; return true;
    case '0': mode_ = Mode::kNumZero; return true;
    case 't': literal_ = "rue"; mode_ = Mode::kLiteral; return true;
    case 'f': literal_ = "alse"; mode_ = Mode::kLiteral; return true;
    case 'n': literal_ = "ull"; mode_ = Mode::kLiteral; return true;
    default:
      if (c >= '1' && c <= '9') {
        mode_ = Mode::kNumInt;
        return true;
      }
      return false;
  }
}

bool JsonPrefix::string_byte(unsigned char c) {
  if (need_low_surrogate_ && c != '\\') return false;  // a high surrogate escape needs its low half next
  if (utf8_left_ > 0) {
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    --utf8_left_;
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    return true;
  }
  if (c == '"') {
    if (string_is_key_) {
      mode_ = Mode::kColon;
      return true;
    }
    return after_value();
  }
  if (c == '\\') {
    mode_ = Mode::kEscape;
    return true;
  }
  if (c < 0x20) return false;
  if (c < 0x80) return true;
  // A lead byte: how many continuation bytes follow, and the range of the first (RFC 3629's table).
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;
    if (c == 0xED) utf8_hi_ = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;  // nothing above U+10FFFF
  } else {
    return false;
  }
  return true;
}

bool JsonPrefix::step(unsigned char c) {
  switch (mode_) {
    case Mode::kString: return string_byte(c);
    case Mode::kEscape:
      if (need_low_surrogate_ && c != 'u') return false;
      if (c == 'u') {
        mode_ = Mode::kUnicode;
        unicode_left_ = 4;
        unicode_value_ = 0;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        mode_ = Mode::kString;
        return true;
      }
      return false;
    case Mode::kUnicode: {
      const int v = hex_value(c);
      if (v < 0) return false;
      unicode_value_ = static_cast<uint16_t>(unicode_value_ * 16 + v);
      if (--unicode_left_ > 0) return true;
      const bool high = unicode_value_ >= 0xD800 && unicode_value_ <= 0xDBFF;
      const bool low = unicode_value_ >= 0xDC00 && unicode_value_ <= 0xDFFF;
      if (need_low_surrogate_) {
        if (!low) return false;
        need_low_surrogate_ = false;
      } else if (low) {
        return false;  // a low surrogate with no high one before it
      } else if (high) {
        need_low_surrogate_ = true;
      }
      mode_ = Mode::kString;
      return true;
    }
    case Mode::kLiteral:
      if (static_cast<unsigned char>(*literal_) != c) return false;
      ++literal_;
      return *literal_ == '\0' ? after_value() : true;
    case Mode::kNumMinus:
      if (c == '0') mode_ = Mode::kNumZero;
      else if (c >= '1' && c <= '9') mode_ = Mode::kNumInt;
      else return false;
      return true;
    case Mode::kNumZero:
      if (c == '.') mode_ = Mode::kNumDot;
      else if (c == 'e' || c == 'E') mode_ = Mode::kNumExp;
      else return end_number(c);
      return true;
    case Mode::kNumInt:
      if (is_digit(c)) return true;
      if (c == '.') mode_ = Mode::kNumDot;
      else if (c == 'e' || c == 'E') mode_ = Mode::kNumExp;
      else return end_number(c);
      return true;
    case Mode::kNumDot:
      if (!is_digit(c)) return false;
      mode_ = Mode::kNumFrac;
      return true;
    case Mode::kNumFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        mode_ = Mode::kNumExp;
        return true;
      }
      return end_number(c);
    case Mode::kNumExp:
      if (c == '+' || c == '-') mode_ = Mode::kNumExpSign;
      else if (is_digit(c)) mode_ = Mode::kNumExpDigits;
      else return false;
      return true;
    case Mode::kNumExpSign:
      if (!is_digit(c)) return false;
      mode_ = Mode::kNumExpDigits;
      return true;
    case Mode::kNumExpDigits:
      if (is_digit(c)) return true;
      return end_number(c);
    case Mode::kDone: return false;
    default: break;
  }
  // Between tokens of the structure.
  if (is_whitespace(c)) return ws_.take(c, kMaxWhitespaceRun);
  ws_.reset();
  switch (mode_) {
    case Mode::kStart:
      if (c != '{') return false;
      stack_[depth_++] = '{';
      mode_ = Mode::kKeyOrClose;
      return true;
    case Mode::kValue: return open_value(c);
    case Mode::kValueOrClose:
      if (c == ']') {
        --depth_;
        return after_value();
      }
      return open_value(c);
    case Mode::kKeyOrClose:
      if (c == '}') {
        --depth_;
        return after_value();
      }
      [[fallthrough]];
    case Mode::kKey:
      if (c != '"') return false;
      mode_ = Mode::kString;
      string_is_key_ = true;
      return true;
    case Mode::kColon:
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kCommaOrClose: {
      const char top = stack_[depth_ - 1];
      if (c == ',') {
        mode_ = top == '{' ? Mode::kKey : Mode::kValue;
        return true;
      }
      if ((c == '}' && top == '{') || (c == ']' && top == '[')) {
        --depth_;
        return after_value();
      }
      return false;
    }
    default: return false;
  }
}

std::shared_ptr<const JsonTokenTable> JsonTokenTable::build(const Tokenizer& tokenizer, int32_t vocab_size) {
  auto table = std::make_shared<JsonTokenTable>();
  table->kind_.assign(static_cast<size_t>(vocab_size), kSpecial);
  table->offset_.reserve(static_cast<size_t>(vocab_size) + 1);
  table->offset_.push_back(0);
  const int32_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < vocab_size; ++id) {
    std::optional<std::string> bytes;
    if (id < known && !tokenizer.is_special(id)) bytes = tokenizer.token_bytes(id);
    if (bytes && !bytes->empty()) {
      table->kind_[static_cast<size_t>(id)] = plain_string_bytes(*bytes) ? kPlain : kOther;
      table->all_bytes_ += *bytes;
    }
    table->offset_.push_back(static_cast<uint32_t>(table->all_bytes_.size()));
  }
  const auto key = [&](int32_t id) {
    const std::string_view b = table->bytes(id);
    return std::pair<int, int>(static_cast<unsigned char>(b[0]), b.size() > 1 ? static_cast<unsigned char>(b[1]) : -1);
  };
  const auto group = [&](std::vector<int32_t>& ids, std::vector<Group>& groups) {
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key(a) < key(b); });
    for (uint32_t i = 0; i < ids.size(); ++i) {
      const auto [first, second] = key(ids[i]);
      if (groups.empty() || groups.back().first != first || groups.back().second != second) {
        groups.push_back(Group{static_cast<uint8_t>(first), static_cast<int16_t>(second), i, i});
      }
      groups.back().end = i + 1;
    }
  };
  table->plain_mask_.assign(static_cast<size_t>(vocab_size), 0);
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (table->special(id)) continue;
    table->by_bytes_.push_back(id);
    if (table->plain_string_content(id)) {
      table->plain_mask_[static_cast<size_t>(id)] = 1;
      table->any_plain_ = true;
    } else {
      table->other_by_bytes_.push_back(id);
    }
  }
  group(table->by_bytes_, table->groups_);
  group(table->other_by_bytes_, table->other_groups_);
  return table;
}


template class AutomatonConstraint<JsonPrefix>;

}  // namespace petrel
