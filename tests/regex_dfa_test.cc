// runtime/regex_dfa.h against PCRE2, an independent regex engine: on every string of a random and a mutated
// sample, the automaton accepts exactly the strings PCRE2 finds the pattern in; and on every prefix of them it
// is still alive exactly when PCRE2 (partial matching) says some continuation could match, which is what lets
// constrained decoding refuse a byte at once.
#include "petrel/runtime/regex_dfa.h"

#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>
#include <utility>
#include <random>
#include <string>
#include <vector>

namespace petrel {
namespace {

// PCRE2 with the options that make it read a pattern as ECMA-262 does for this subset: UTF-8, `$` only at the
// very end, \uHHHH escapes (ALT_BSUX), ASCII \d \w \s (PCRE2's default without UCP).
class Pcre {
 public:
  explicit Pcre(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX,
                          &error, &offset, nullptr);
    data_ = code_ ? pcre2_match_data_create_from_pattern(code_, nullptr) : nullptr;
  }
  ~Pcre() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  bool ok() const { return code_ != nullptr; }
  // 1 a match, 0 a partial match (the subject could go on to match), -1 neither.
  int match(const std::string& s, bool partial) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                               partial ? PCRE2_PARTIAL_HARD : 0, data_, nullptr);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_PARTIAL ? 0 : -1;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

// Code points to build test strings from: what the patterns below name, their neighbours, and multi-byte ones.
const std::vector<std::string> kAlphabet = {"a", "b", "c", "x", "z", "A", "B", "Z", "0", "1", "5", "9", "-", "_", ".",
                                            " ", "@", "+", "(", ")", "/", "é", "ß", "日", "😀"};

const char* const kPatterns[] = {
    "^[A-Z]{3}-\\d{4}$",
    "^\\+?[0-9 ()-]{7,15}$",
    "^[a-z0-9._-]+@[a-z0-9-]+\\.[a-z]{2,}$",
    "ab+c",
    "^(ab|cd)*x?$",
    "^[^0-9]*$",
    "^.{2,4}$",
    "^\\w+(\\s\\w+)*$",
    "^[a-c]{0,3}[x-z]?$",
    "^(?:a|b)+(?<tail>z{2})$",
    "é+日",
    "^\\D\\W?\\S$",
    "^a{2}b{1,}c{0,2}$",
    "^[\\d\\-]+\\.?$",
    "^(\\(\\d{3}\\) )?\\d{3}-\\d{4}$",
    "^\\x41\\u00e9[\\u0041-\\u0043]$",
    "^$",
    "",
    "x|y",
    "^[^a-z]+$",
};

std::string random_string(std::mt19937& rng, int max_len) {
  std::string s;
  const int len = static_cast<int>(rng() % static_cast<unsigned>(max_len + 1));
  for (int i = 0; i < len; ++i) s += kAlphabet[rng() % kAlphabet.size()];
  return s;
}

// A string of alphabet characters along which the automaton stays alive, stopping in an accepting state (none
// when the walk gets stuck elsewhere): candidates for matching strings, which PCRE2 then judges like any other.
std::optional<std::string> walk(const RegexDfa& dfa, std::mt19937& rng) {
  std::string s;
  int32_t state = dfa.start();
  for (int step = 0; step < 16; ++step) {
    if (dfa.accepting(state) && rng() % 3 == 0) return s;
    std::vector<std::pair<std::string, int32_t>> options;
    for (const std::string& ch : kAlphabet) {
      int32_t t = state;
      for (unsigned char c : ch) {
        if (t != RegexDfa::kDead) t = dfa.next(t, c);
      }
      if (t != RegexDfa::kDead) options.emplace_back(ch, t);
    }
    if (options.empty()) break;
    const auto& pick = options[rng() % options.size()];
    s += pick.first;
    state = pick.second;
  }
  if (!dfa.accepting(state)) return std::nullopt;
  return s;
}

TEST(RegexDfa, MatchesWhatPcre2FindsAndDiesWhenNoContinuationCan) {
  std::mt19937 rng(23);
  for (const char* pattern : kPatterns) {
    auto dfa = petrel::RegexDfa::compile(pattern);
    ASSERT_TRUE(dfa.ok()) << pattern << ": " << dfa.status().to_string();
    Pcre pcre(pattern);
    ASSERT_TRUE(pcre.ok()) << pattern;
    const bool anchored = pattern[0] == '^';
    // Strings: random ones, walks along the automaton, and the ones of either that PCRE2 says match, mutated by
    // a character.
    std::vector<std::string> subjects;
    std::vector<std::string> matching;
    for (int i = 0; i < 1500; ++i) {
      std::string s = random_string(rng, 10);
      if (pcre.match(s, false) == 1) matching.push_back(s);
      subjects.push_back(std::move(s));
      if (auto w = walk(*dfa, rng)) {
        if (pcre.match(*w, false) == 1 && matching.size() < 300) matching.push_back(*w);
        subjects.push_back(std::move(*w));
      }
    }
    for (const std::string& m : matching) {
      subjects.push_back(m);
      std::string mutated = m;  // one character (not byte: the subject stays UTF-8) dropped
      if (!mutated.empty()) {
        size_t at = rng() % mutated.size(), len = 1;
        while (at > 0 && (static_cast<unsigned char>(mutated[at]) & 0xC0) == 0x80) --at;
        while (at + len < mutated.size() && (static_cast<unsigned char>(mutated[at + len]) & 0xC0) == 0x80) ++len;
        mutated.erase(at, len);
      }
      subjects.push_back(mutated + kAlphabet[rng() % kAlphabet.size()]);
      subjects.push_back(kAlphabet[rng() % kAlphabet.size()] + m);
    }
    int checked = 0;
    for (const std::string& s : subjects) {
      ASSERT_EQ(dfa->matches(s), pcre.match(s, false) == 1) << "pattern " << pattern << " subject '" << s << "'";
      if (!anchored) continue;  // unanchored: a match may always begin later, so no prefix is ever dead
      // Every prefix at a character boundary: alive exactly when PCRE2 sees a (partial) match from the start.
      int32_t state = dfa->start();
      for (size_t i = 0; i <= s.size(); ++i) {
        // (PCRE2 reports no partial match of the empty subject: it inspected no character.)
        if (i > 0 && (i == s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80)) {
          const bool alive = state != RegexDfa::kDead;
          ASSERT_EQ(alive, pcre.match(s.substr(0, i), true) >= 0)
              << "pattern " << pattern << " prefix '" << s.substr(0, i) << "'";
          ++checked;
        }
        if (i == s.size() || state == RegexDfa::kDead) break;
        state = dfa->next(state, static_cast<unsigned char>(s[i]));
      }
    }
    if (anchored) {
      EXPECT_GT(checked, 1000) << pattern;
    }
    EXPECT_GT(matching.size(), 0u) << pattern << ": nothing matched; the test proves little";
  }
}

// open(): no continuation by string characters kills the state. Checked by definition on random continuations
// (and, the other way, that a state some continuation kills is not open), and on the cases constrained decoding
// relies on.
TEST(RegexDfa, OpenStatesSurviveEveryContinuation) {
  std::mt19937 rng(29);
  auto state_after = [](const RegexDfa& dfa, const std::string& s) {
    int32_t state = dfa.start();
    for (unsigned char c : s) state = state == RegexDfa::kDead ? state : dfa.next(state, c);
    return state;
  };
  for (const char* pattern : kPatterns) {
    auto dfa = petrel::RegexDfa::compile(pattern);
    ASSERT_TRUE(dfa.ok()) << pattern;
    for (int i = 0; i < 300; ++i) {
      const std::string prefix = random_string(rng, 6);
      const int32_t state = state_after(*dfa, prefix);
      if (state == RegexDfa::kDead) continue;
      bool killed = false;
      for (int k = 0; k < 20; ++k) {
        const std::string more = prefix + random_string(rng, 8);
        killed = killed || state_after(*dfa, more) == RegexDfa::kDead;
      }
      if (dfa->open(state)) {
        EXPECT_FALSE(killed) << pattern << ": open after '" << prefix << "' but a continuation dies";
      }
      if (killed) {
        EXPECT_FALSE(dfa->open(state)) << pattern << " after '" << prefix << "'";
      }
    }
  }
  auto letters = RegexDfa::compile("[a-z]{2}");  // unanchored: every state is open
  ASSERT_TRUE(letters.ok());
  EXPECT_TRUE(letters->open(state_after(*letters, "1a")));
  EXPECT_TRUE(letters->open(state_after(*letters, "1ab日\"x")));
  auto prefix = RegexDfa::compile("^ab");
  ASSERT_TRUE(prefix.ok());
  EXPECT_FALSE(prefix->open(state_after(*prefix, "a")));
  EXPECT_TRUE(prefix->open(state_after(*prefix, "ab")));
  auto exact = RegexDfa::compile("^ab$");
  ASSERT_TRUE(exact.ok());
  EXPECT_FALSE(exact->open(state_after(*exact, "ab")));
  auto dot = RegexDfa::compile("^a.*");  // '.' refuses \n and \r, which a JSON string holds only escaped
  ASSERT_TRUE(dot.ok());
  EXPECT_TRUE(dot->open(state_after(*dot, "a")));
}

// allOf of two patterns: the product automaton, its states that cannot finish a match of both turned dead.
TEST(RegexDfa, IntersectionMatchesWhatBothMatchAndHasNoDeadEnds) {
  auto hex = RegexDfa::compile("^[0-9a-f]+$"), lower = RegexDfa::compile("^[a-z0-9]{2,4}$");
  ASSERT_TRUE(hex.ok() && lower.ok());
  auto both = RegexDfa::intersect(*hex, *lower);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  for (const char* s : {"ab", "0f3e", "99"}) EXPECT_TRUE(both->matches(s)) << s;
  for (const char* s : {"a", "abcde", "xy", "AB", ""}) EXPECT_FALSE(both->matches(s)) << s;
  // (ab)* and a*: only the empty string; after "a" nothing can finish both, so "a" is dead at once.
  auto pairs = RegexDfa::compile("^(ab)*$"), as = RegexDfa::compile("^a*$");
  ASSERT_TRUE(pairs.ok() && as.ok());
  auto empty_only = RegexDfa::intersect(*pairs, *as);
  ASSERT_TRUE(empty_only.ok()) << empty_only.status().to_string();
  EXPECT_TRUE(empty_only->matches(""));
  EXPECT_EQ(empty_only->next(empty_only->start(), 'a'), RegexDfa::kDead);
  // Every live state of a random walk can still reach an accepting state (no dead ends for constrained decoding).
  auto has_digit = RegexDfa::compile("[0-9]"), short_word = RegexDfa::compile("^[a-z0-9]{1,6}$");
  ASSERT_TRUE(has_digit.ok() && short_word.ok());
  auto mixed = RegexDfa::intersect(*has_digit, *short_word);
  ASSERT_TRUE(mixed.ok());
  std::mt19937 rng(5);
  for (int walk = 0; walk < 200; ++walk) {
    int32_t state = mixed->start();
    for (int step = 0; step < 8; ++step) {
      const int32_t next = mixed->next(state, static_cast<unsigned char>("abz019"[rng() % 6]));
      if (next == RegexDfa::kDead) break;
      state = next;
      // Finishable: some continuation of at most 6 characters of [a-z0-9] reaches acceptance.
      std::vector<int32_t> frontier{state};
      bool finishable = mixed->accepting(state);
      for (int depth = 0; depth < 6 && !finishable; ++depth) {
        std::vector<int32_t> next_frontier;
        for (int32_t f : frontier) {
          for (unsigned char c : std::string("abcdefghijklmnopqrstuvwxyz0123456789")) {
            const int32_t t = mixed->next(f, c);
            if (t == RegexDfa::kDead) continue;
            finishable = finishable || mixed->accepting(t);
            next_frontier.push_back(t);
          }
        }
        std::sort(next_frontier.begin(), next_frontier.end());
        next_frontier.erase(std::unique(next_frontier.begin(), next_frontier.end()), next_frontier.end());
        frontier = std::move(next_frontier);
      }
      EXPECT_TRUE(finishable) << "a live state that cannot finish, walk " << walk;
    }
  }
  // Against PCRE2 on pairs of the patterns above: the product matches a string iff PCRE2 finds both patterns in it,
  // on random strings and on walks of the product (which end in its accepting states).
  std::mt19937 pair_rng(11);
  int pairs_checked = 0;
  for (int t = 0; t < 60; ++t) {
    const std::string pa = kPatterns[pair_rng() % std::size(kPatterns)], pb = kPatterns[pair_rng() % std::size(kPatterns)];
    auto da = RegexDfa::compile(pa), db = RegexDfa::compile(pb);
    ASSERT_TRUE(da.ok() && db.ok());
    const Pcre ra(pa), rb(pb);
    ASSERT_TRUE(ra.ok() && rb.ok());
    auto product = RegexDfa::intersect(*da, *db);
    if (!product.ok()) {  // nothing in common: no random string may match both
      for (int i = 0; i < 300; ++i) {
        const std::string str = random_string(pair_rng, 8);
        EXPECT_FALSE(ra.match(str, false) == 1 && rb.match(str, false) == 1) << pa << " & " << pb << " on " << str;
      }
      continue;
    }
    ++pairs_checked;
    for (int i = 0; i < 300; ++i) {
      std::string str = random_string(pair_rng, 8);
      if (i % 3 == 0) {
        if (auto w = walk(*product, pair_rng)) str = *w;
      }
      EXPECT_EQ(product->matches(str), ra.match(str, false) == 1 && rb.match(str, false) == 1)
          << pa << " & " << pb << " on '" << str << "'";
    }
  }
  EXPECT_GT(pairs_checked, 20);
  // Nothing in common, and unanchored patterns (search semantics): strings that contain both.
  auto xs = RegexDfa::compile("^x+$"), ys = RegexDfa::compile("^y");
  ASSERT_TRUE(xs.ok() && ys.ok());
  auto none = RegexDfa::intersect(*xs, *ys);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no string matches both"), std::string::npos) << none.status().message();
  auto a = RegexDfa::compile("a"), b = RegexDfa::compile("b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto contains_both = RegexDfa::intersect(*a, *b);
  ASSERT_TRUE(contains_both.ok());
  EXPECT_TRUE(contains_both->matches("xbyaz"));
  EXPECT_FALSE(contains_both->matches("aaa"));
  // Unanchored on both sides: no continuation can make a match impossible, from any state (as each part's).
  EXPECT_TRUE(contains_both->open(contains_both->start()));
  EXPECT_TRUE(contains_both->open(contains_both->next(contains_both->start(), 'a')));
  EXPECT_FALSE(both->open(both->start()));  // anchored: a wrong character kills the match
}

TEST(RegexDfa, RefusesWhatItDoesNotSupportNamingTheOffset) {
  struct Case {
    const char* pattern;
    const char* why;
  };
  for (const Case& c : std::initializer_list<Case>{{"(a)\\1", "back-references"},
                                                   {"a(?=b)", "lookaround"},
                                                   {"\\bword", "word boundaries"},
                                                   {"a^b", "'^' is only supported at the pattern's start"},
                                                   {"a$b", "'$' is only supported at the pattern's end"},
                                                   {"^a|b$", "top-level '|'"},
                                                   {"(ab", "missing ')'"},
                                                   {"ab)", "')' without '('"},
                                                   {"[a-", "missing ']'"},
                                                   {"[z-a]", "range out of order"},
                                                   {"*a", "nothing to repeat"},
                                                   {"[é-ü]", "ranges of non-ASCII characters"},
                                                   {"[^é]", "non-ASCII characters in a negated class"},
                                                   {"\\q", "unknown escape"},
                                                   {"\\u12", "hexadecimal"},
                                                   {"(a|b)*a(a|b){14}", "states"},
                                                   {"a{100000}", "too large"},
                                                   {".{0,1200}x", "too large"},
                                                   {"^[a-z]{0,3000}x", "states or is too large"},
                                                   {"(.{0,100}){0,100}", "too large"}}) {
    const auto start = std::chrono::steady_clock::now();
    auto dfa = RegexDfa::compile(c.pattern);
    ASSERT_FALSE(dfa.ok()) << c.pattern;
    EXPECT_EQ(dfa.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(dfa.status().message().find(c.why), std::string::npos) << c.pattern << ": " << dfa.status().message();
    EXPECT_NE(dfa.status().message().find("pattern"), std::string::npos) << dfa.status().message();
    // A hostile pattern in a request is refused quickly (generous: CI machines are slow and shared).
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0) << c.pattern;
  }
  auto nested = RegexDfa::compile(std::string(100, '(') + "a" + std::string(100, ')'));
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("nested"), std::string::npos) << nested.status().message();
}

}  // namespace
}  // namespace petrel

// Automata are minimal: states that no string tells apart are one (the subset construction makes `^(ab|cb)$`'s
// "after a" and "after c" two), and a product of two automata is built from minimal inputs. Matches are checked
// against PCRE2 by the tests above on the minimized automata.
TEST(RegexDfa, AutomataAreMinimal) {
  const std::pair<const char*, int32_t> cases[] = {
      {"^(ab|cb)$", 3},          // start, after a or c, after b
      {"^(a|b)*$", 1},           // one accepting state
      {"^(xa|ya|za)*$", 2},      // start (accepting), after x/y/z
      {"^[0-9]{2}$", 3},
  };
  for (const auto& [pattern, states] : cases) {
    auto dfa = petrel::RegexDfa::compile(pattern);
    ASSERT_TRUE(dfa.ok()) << pattern << ": " << dfa.status().to_string();
    EXPECT_EQ(dfa->state_count(), states) << pattern;
  }
  // A product's redundant pairs merged too: an unanchored search beside an anchored shape.
  auto a = petrel::RegexDfa::compile("^[a-z]{1,12}@[a-z]{1,12}\\.com$");
  auto b = petrel::RegexDfa::compile("x");
  ASSERT_TRUE(a.ok() && b.ok());
  auto both = petrel::RegexDfa::intersect(*a, *b);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_TRUE(both->matches("ax@b.com"));
  EXPECT_FALSE(both->matches("ab@c.com"));
  EXPECT_LE(both->state_count(), 2 * a->state_count());
}
