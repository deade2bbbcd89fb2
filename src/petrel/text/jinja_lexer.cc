#include "petrel/text/jinja_lexer.h"

#include <cstring>

#include "petrel/text/jinja_value.h"

namespace petrel::jinja {

std::string normalize_template_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

SourcePosition position_of(std::string_view source, size_t offset) {
  SourcePosition position;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++position.line;
      position.column = 1;
    } else {
      ++position.column;
    }
  }
  return position;
}

std::string located_message(std::string_view template_name, std::string_view source, size_t offset,
                            std::string_view message) {
  SourcePosition p = position_of(source, offset);
  return "template '" + std::string(template_name) + "', line " + std::to_string(p.line) + ", column " +
         std::to_string(p.column) + ": " + std::string(message);
}

namespace {

bool starts_with_at(std::string_view s, size_t pos, std::string_view prefix) {
  return pos <= s.size() && s.substr(pos, prefix.size()) == prefix;
}

// Skips Python `\s*` (Unicode whitespace) from pos.
size_t skip_whitespace(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_python_space(next_codepoint(s, next))) break;
    pos = next;
  }
  return pos;
}

// Python str.rstrip(): the length of s without trailing Unicode whitespace.
size_t rstrip_length(std::string_view s) {
  size_t keep = 0;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = next_codepoint(s, i);
    if (!is_python_space(cp)) keep = i;
  }
  return keep;
}

bool all_whitespace(std::string_view s) {
  if (s.empty()) return false;  // Jinja2 tests `\s+`, which needs one character
  return skip_whitespace(s, 0) == s.size();
}

// The whitespace rules for the text in front of a tag (Jinja2's OptionalLStrip): "-" strips all
// whitespace before the tag; otherwise lstrip_blocks removes the spaces and tabs between a line start
// and a block or comment tag when nothing else is on that line.
std::string_view strip_text_before_tag(std::string_view text, char strip_sign, char tag_kind,
                                       bool line_starting) {
  if (strip_sign == '-') return text.substr(0, rstrip_length(text));
  if (strip_sign == '+' || tag_kind == '{') return text;
  size_t line_start = text.rfind('\n');
  line_start = (line_start == std::string_view::npos) ? 0 : line_start + 1;
  if ((line_start > 0 || line_starting) && all_whitespace(text.substr(line_start))) {
    return text.substr(0, line_start);
  }
  return text;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Digits with single underscores between them (Python/Jinja2 numeric literal groups).
size_t scan_digit_groups(std::string_view s, size_t pos) {
  if (pos >= s.size() || !is_digit(s[pos])) return pos;
  while (pos < s.size()) {
    if (is_digit(s[pos])) {
      ++pos;
    } else if (s[pos] == '_' && pos + 1 < s.size() && is_digit(s[pos + 1])) {
      ++pos;
    } else {
      break;
    }
  }
  return pos;
}

std::string without_underscores(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '_') out.push_back(c);
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal body, as Jinja2 applies it.
Result<std::string> decode_string_literal(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t cp = 0;
        for (int k = 0; k < digits; ++k) {
          int h = (i + 1 < body.size()) ? hex_value(body[i + 1]) : -1;
          if (h < 0) return invalid_data(std::string("truncated \\") + e + " escape");
          cp = cp * 16 + static_cast<uint32_t>(h);
          ++i;
        }
        if (cp > 0x10ffff) return invalid_data("illegal Unicode character");
        append_utf8(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          append_utf8(out, cp);
        } else if (e == 'N') {
          return invalid_data("\\N{...} escapes are not supported");
        } else {
          out.push_back('\\');  // unknown escapes stay as written
          out.push_back(e);
        }
    }
  }
  return out;
}

const char* const kTwoCharOperators[] = {"//", "**", "==", "!=", ">=", "<="};
const char kOneCharOperators[] = "+-/*%~[](){},.:|=<>;";

class Lexer {
 public:
  Lexer(std::string_view source, std::string_view name) : src_(source), name_(name) {}

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = find_tag_start(pos);
      if (tag == std::string_view::npos) {
        emit_data(src_.substr(pos), pos);
        break;
      }
      char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string_view text = strip_text_before_tag(src_.substr(pos, tag - pos), sign, kind, line_starting);
      emit_data(text, pos);

      size_t end = 0;
      size_t raw_body = 0;
      if (kind == '%' && match_raw_begin(after, raw_body)) {
        PETREL_ASSIGN_OR_RETURN(end, lex_raw(tag, raw_body));
      } else if (kind == '#') {
        PETREL_ASSIGN_OR_RETURN(end, lex_comment(tag, after));
      } else {
        PETREL_ASSIGN_OR_RETURN(end, lex_tag(tag, after, kind));
      }
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos = end;
    }
    Token eof;
    eof.kind = TokenKind::kEnd;
    eof.offset = src_.size();
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  Status error(size_t offset, std::string_view message) {
    return invalid_data(located_message(name_, src_, offset, message));
  }

  size_t find_tag_start(size_t pos) const {
    while (true) {
      pos = src_.find('{', pos);
      if (pos == std::string_view::npos || pos + 1 >= src_.size()) return std::string_view::npos;
      char next = src_[pos + 1];
      if (next == '{' || next == '%' || next == '#') return pos;
      ++pos;
    }
  }

  void emit_data(std::string_view text, size_t offset) {
    if (text.empty()) return;
    Token t;
    t.kind = TokenKind::kData;
    t.text = std::string(text);
    t.offset = offset;
    tokens_.push_back(std::move(t));
  }

  void emit(TokenKind kind, std::string text, size_t offset) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.offset = offset;
    tokens_.push_back(std::move(t));
  }

  // `{% raw %}` / `{%- raw -%}`: sets body_start after the tag.
  bool match_raw_begin(size_t after, size_t& body_start) const {
    size_t p = skip_whitespace(src_, after);
    if (!starts_with_at(src_, p, "raw")) return false;
    p = skip_whitespace(src_, p + 3);
    if (starts_with_at(src_, p, "-%}")) {
      body_start = skip_whitespace(src_, p + 3);
      return true;
    }
    if (starts_with_at(src_, p, "%}")) {
      body_start = p + 2;
      return true;
    }
    return false;
  }

  Result<size_t> lex_raw(size_t tag, size_t body_start) {
    bool body_line_starting = body_start > 0 && src_[body_start - 1] == '\n';
    for (size_t q = src_.find("{%", body_start); q != std::string_view::npos; q = src_.find("{%", q + 1)) {
      size_t p = q + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = skip_whitespace(src_, p);
      if (!starts_with_at(src_, p, "endraw")) continue;
      p = skip_whitespace(src_, p + 6);
      size_t end;
      if (starts_with_at(src_, p, "+%}")) {
        end = p + 3;
      } else if (starts_with_at(src_, p, "-%}")) {
        end = skip_whitespace(src_, p + 3);
      } else if (starts_with_at(src_, p, "%}")) {
        end = p + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_data(strip_text_before_tag(src_.substr(body_start, q - body_start), sign, '%', body_line_starting),
                body_start);
      return end;
    }
    return error(tag, "Missing end of raw directive");
  }

  Result<size_t> lex_comment(size_t tag, size_t after) {
    for (size_t q = after; q < src_.size(); ++q) {
      if (starts_with_at(src_, q, "+#}")) return q + 3;
      if (starts_with_at(src_, q, "-#}")) return skip_whitespace(src_, q + 3);
      if (starts_with_at(src_, q, "#}")) {
        size_t end = q + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
        return end;
      }
    }
    return error(tag, "Missing end of comment tag");
  }

  // Returns the end of the tag if one starts at p (and brackets are balanced), else 0.
  size_t match_tag_end(size_t p, char kind) const {
    if (kind == '%') {
      if (starts_with_at(src_, p, "+%}")) return p + 3;
      if (starts_with_at(src_, p, "-%}")) return skip_whitespace(src_, p + 3);
      if (starts_with_at(src_, p, "%}")) {
        size_t end = p + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
        return end;
      }
      return 0;
    }
    if (starts_with_at(src_, p, "-}}")) return skip_whitespace(src_, p + 3);
    if (starts_with_at(src_, p, "}}")) return p + 2;
    return 0;
  }

  Result<size_t> lex_tag(size_t tag, size_t after, char kind) {
    emit(kind == '%' ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, "", tag);
    std::vector<char> open_brackets;
    size_t p = after;
    while (true) {
      if (p >= src_.size()) {
        return error(tag, kind == '%' ? "unexpected end of template: block tag not closed with '%}'"
                                      : "unexpected end of template: expression not closed with '}}'");
      }
      if (open_brackets.empty()) {
        size_t end = match_tag_end(p, kind);
        if (end != 0) {
          emit(kind == '%' ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", p);
          return end;
        }
      }
      char c = src_[p];
      size_t ws_end = skip_whitespace(src_, p);
      if (ws_end != p) {
        p = ws_end;
        continue;
      }
      if (is_digit(c)) {
        PETREL_ASSIGN_OR_RETURN(p, lex_number(p));
        continue;
      }
      if (is_name_start(c)) {
        size_t q = p + 1;
        while (q < src_.size() && is_name_char(src_[q])) ++q;
        emit(TokenKind::kName, std::string(src_.substr(p, q - p)), p);
        p = q;
        continue;
      }
      if (c == '\'' || c == '"') {
        PETREL_ASSIGN_OR_RETURN(p, lex_string(p));
        continue;
      }
      std::string op;
      for (const char* two : kTwoCharOperators) {
        if (starts_with_at(src_, p, two)) op = two;
      }
      if (op.empty() && std::strchr(kOneCharOperators, c) != nullptr && c != '\0') op = std::string(1, c);
      if (op.empty()) return error(p, std::string("unexpected char '") + c + "'");
      if (op == "(" || op == "[" || op == "{") {
        open_brackets.push_back(op == "(" ? ')' : (op == "[" ? ']' : '}'));
      } else if (op == ")" || op == "]" || op == "}") {
        if (open_brackets.empty()) return error(p, "unexpected '" + op + "'");
        if (open_brackets.back() != op[0]) {
          return error(p, "unexpected '" + op + "', expected '" + std::string(1, open_brackets.back()) + "'");
        }
        open_brackets.pop_back();
      }
      emit(TokenKind::kOperator, op, p);
      p += op.size();
    }
  }

  Result<size_t> lex_number(size_t p) {
    // Floats first, like Jinja2 (but never right after a '.', so `x.0.1` is two item lookups).
    bool after_dot = p > 0 && src_[p - 1] == '.';
    size_t q = scan_digit_groups(src_, p);
    if (!after_dot) {
      size_t f = q;
      bool is_float = false;
      if (f + 1 < src_.size() && src_[f] == '.' && is_digit(src_[f + 1])) {
        f = scan_digit_groups(src_, f + 1);
        is_float = true;
      }
      if (f < src_.size() && (src_[f] == 'e' || src_[f] == 'E')) {
        size_t e = f + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        size_t digits_end = scan_digit_groups(src_, e);
        if (digits_end > e) {
          f = digits_end;
          is_float = true;
        }
      }
      if (is_float) {
        Token t;
        t.kind = TokenKind::kFloat;
        t.text = std::string(src_.substr(p, f - p));
        t.number = std::strtod(without_underscores(t.text).c_str(), nullptr);
        t.offset = p;
        tokens_.push_back(std::move(t));
        return f;
      }
    }
    int base = 10;
    size_t digits_begin = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      char x = src_[p + 1] | 0x20;
      if (x == 'b' || x == 'o' || x == 'x') {
        base = x == 'b' ? 2 : (x == 'o' ? 8 : 16);
        digits_begin = p + 2;
        q = digits_begin;
        while (q < src_.size() && (hex_value(src_[q]) >= 0 || src_[q] == '_') && hex_value(src_[q]) < base) ++q;
        if (q == digits_begin) return error(p, "invalid integer literal");
      }
    }
    std::string digits = without_underscores(src_.substr(digits_begin, q - digits_begin));
    Token t;
    t.kind = TokenKind::kInteger;
    t.text = std::string(src_.substr(p, q - p));
    errno = 0;
    t.integer = static_cast<int64_t>(std::strtoull(digits.c_str(), nullptr, base));
    if (errno == ERANGE || (base == 10 && digits.size() > 18 && digits > "9223372036854775807")) {
      return error(p, "integer literal does not fit in 64 bits");
    }
    t.offset = p;
    tokens_.push_back(std::move(t));
    return q;
  }

  Result<size_t> lex_string(size_t p) {
    char quote = src_[p];
    size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) {
      if (src_[q] == '\\') ++q;
      ++q;
    }
    if (q >= src_.size()) return error(p, "unterminated string literal");
    auto decoded = decode_string_literal(src_.substr(p + 1, q - p - 1));
    if (!decoded.ok()) return error(p, decoded.status().message());
    Token t;
    t.kind = TokenKind::kString;
    t.text = std::move(decoded).value();
    t.offset = p;
    tokens_.push_back(std::move(t));
    return q + 1;
  }

  std::string_view src_;
  std::string_view name_;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> tokenize_template(std::string_view source, std::string_view template_name) {
  return Lexer(source, template_name).run();
}

}  // namespace petrel::jinja
