// Splits template source into tokens the way Jinja2's lexer does with trim_blocks=True and
// lstrip_blocks=True: text between tags, tag delimiters, and the expression tokens inside tags.
// Whitespace control ({%- -%} {{- -}} {#- -#}, {%+ +%}), comments and {% raw %} are resolved here, so
// the parser sees only data, tags and expression tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/util/status.h"

namespace petrel::jinja {

enum class TokenKind : uint8_t {
  kData,           // literal template text
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,         // text holds the decoded value
  kInteger,
  kFloat,
  kOperator,       // text holds the operator, e.g. "//", "|", "("
  kEnd,            // end of the source
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  int64_t integer = 0;
  double number = 0.0;
  size_t offset = 0;  // byte offset in the normalized source, for line/column in errors
};

// Jinja2 normalizes "\r\n" and "\r" to "\n" and drops one trailing newline (keep_trailing_newline is
// false); the lexer and error positions work on this normalized text.
std::string normalize_template_source(std::string_view source);

// 1-based line and column (in bytes) of `offset`.
struct SourcePosition {
  int line = 1;
  int column = 1;
};
SourcePosition position_of(std::string_view source, size_t offset);

// "template 'name', line 3, column 7: message"
std::string located_message(std::string_view template_name, std::string_view source, size_t offset,
                            std::string_view message);

// Tokenizes normalized source. Errors (unterminated tags or strings, unexpected characters) carry the
// template name, line and column.
Result<std::vector<Token>> tokenize_template(std::string_view source, std::string_view template_name);

}  // namespace petrel::jinja
