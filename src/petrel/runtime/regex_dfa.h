// A JSON Schema string "pattern" (an ECMA-262 regular expression) compiled to a deterministic automaton over
// the UTF-8 bytes of the string's value, so that schema-constrained decoding (json_schema.h) can refuse a byte
// the moment no matching string continues that way, in O(1) a byte.
//
// The subset (what tool and structured-output schemas write: identifiers, codes, phone numbers, dates):
//  - literals (UTF-8 too), `.` (any character but \n and \r), classes `[a-z_]`, `[^...]` with ranges and the
//    escapes below, groups `(...)`, `(?:...)`, `(?<name>...)`, alternation `|`;
//  - quantifiers `*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}` (lazy forms `*?` ... match the same strings);
//  - escapes `\d \D \w \W \s \S` (ASCII classes, as ECMA-262 without the u flag; `\s` also misses the Unicode
//    spaces), `\t \n \r \f \v \0`, `\xHH`, `\uHHHH`, and `\` before any punctuation for the character itself;
//  - `^` at the pattern's start and `$` at its end; without them the match may begin / end anywhere, as JSON
//    Schema says (the pattern is searched for, not matched against the whole string).
// Refused with an error naming the place: back-references, lookaround, `\b`, `^`/`$` elsewhere, non-ASCII
// ranges in a class and non-ASCII characters in a negated class, and patterns whose automaton would exceed
// kMaxStates states (e.g. `(a|b)*a(a|b){12}`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/util/status.h"

namespace petrel {

class RegexDfa {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kMaxStates = 4096;

  // kInvalidArgument naming the character offset for what the subset above does not hold.
  static Result<RegexDfa> compile(std::string_view pattern);
  // The strings both match (allOf of two patterns or formats): the product automaton, with the states from which
  // no string both accept is reachable turned dead, so that a live state can always be finished. Both compile()
  // and intersect() give minimal automata (states no string tells apart merged), within a bound on the work.
  // kInvalidArgument when no string matches both, or the product needs more than kMaxStates states.
  static Result<RegexDfa> intersect(const RegexDfa& a, const RegexDfa& b);

  int32_t start() const { return 0; }
  // The state after byte c, or kDead when no matching string goes on this way.
  int32_t next(int32_t state, unsigned char c) const { return table_[static_cast<size_t>(state) * 256 + c]; }
  // The bytes so far are a string the pattern matches.
  bool accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // No continuation by whole UTF-8 characters other than '"', '\\' and control characters (what a JSON string's
  // plain tokens hold) can make a match impossible: every state of an unanchored pattern, `^ab` after "ab", not
  // `^ab$` after "ab". Constrained decoding then lets plain tokens through without stepping each one (the
  // closing quote is still checked against accepting()).
  bool open(int32_t state) const { return open_[static_cast<size_t>(state)] != 0; }
  // The whole of `text` matches (a test and debugging helper).
  bool matches(std::string_view text) const;
  int32_t state_count() const { return static_cast<int32_t>(accepting_.size()); }
  const std::string& pattern() const { return pattern_; }

 private:
  void minimize();
  void find_open_states();

  std::string pattern_;
  std::vector<int32_t> table_;     // [states, 256]
  std::vector<uint8_t> accepting_;  // [states]
  std::vector<uint8_t> open_;       // [states]
};

}  // namespace petrel
