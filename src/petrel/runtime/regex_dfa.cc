// Pattern -> syntax tree (recursive descent) -> Thompson NFA over bytes -> DFA by subset construction.
#include "petrel/runtime/regex_dfa.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <memory>

namespace petrel {

namespace {

using ByteSet = std::bitset<256>;

// The syntax tree. A character class is a byte set over ASCII plus, where it matches them, every multi-byte
// character (`multibyte`) and a list of single multi-byte characters.
struct Node {
  enum Kind { kEmpty, kBytes, kSeq, kAlt, kRepeat } kind = kEmpty;
  ByteSet bytes;                                // kBytes
  std::vector<std::unique_ptr<Node>> children;  // kSeq, kAlt; kRepeat: one
  int min = 0, max = -1;                        // kRepeat: max -1 unbounded
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make(Node::Kind kind) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  return n;
}
NodePtr byte_range(int lo, int hi) {
  auto n = make(Node::kBytes);
  for (int b = lo; b <= hi; ++b) n->bytes.set(static_cast<size_t>(b));
  return n;
}
NodePtr seq(std::vector<NodePtr> parts) {
  auto n = make(Node::kSeq);
  n->children = std::move(parts);
  return n;
}
NodePtr alt(std::vector<NodePtr> parts) {
  if (parts.size() == 1) return std::move(parts[0]);
  auto n = make(Node::kAlt);
  n->children = std::move(parts);
  return n;
}
// Any character of two or more UTF-8 bytes (the lead byte's range; JsonPrefix checks the finer rules).
NodePtr any_multibyte() {
  std::vector<NodePtr> forms;
  for (int len = 2; len <= 4; ++len) {
    std::vector<NodePtr> parts;
    parts.push_back(len == 2 ? byte_range(0xC2, 0xDF) : len == 3 ? byte_range(0xE0, 0xEF) : byte_range(0xF0, 0xF4));
    for (int i = 1; i < len; ++i) parts.push_back(byte_range(0x80, 0xBF));
    forms.push_back(seq(std::move(parts)));
  }
  return alt(std::move(forms));
}
// The UTF-8 bytes of code point cp, one node each.
NodePtr code_point(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  std::vector<NodePtr> parts;
  for (unsigned char c : s) parts.push_back(byte_range(c, c));
  return seq(std::move(parts));
}

// A class being parsed: ASCII members, whether every multi-byte character is in, single multi-byte members.
struct ClassSet {
  ByteSet ascii;
  bool multibyte = false;
  std::vector<uint32_t> code_points;
  NodePtr node() const {
    std::vector<NodePtr> parts;
    if (ascii.any()) {
      auto n = make(Node::kBytes);
      n->bytes = ascii;
      parts.push_back(std::move(n));
    }
    if (multibyte) parts.push_back(any_multibyte());
    for (uint32_t cp : code_points) parts.push_back(code_point(cp));
    if (parts.empty()) return byte_range(1, 0);  // matches nothing
    return alt(std::move(parts));
  }
};

void add_ascii(ByteSet& set, int lo, int hi) {
  for (int b = lo; b <= hi; ++b) set.set(static_cast<size_t>(b));
}
ByteSet digit_set() {
  ByteSet s;
  add_ascii(s, '0', '9');
  return s;
}
ByteSet word_set() {
  ByteSet s = digit_set();
  add_ascii(s, 'a', 'z');
  add_ascii(s, 'A', 'Z');
  s.set('_');
  return s;
}
ByteSet space_set() {
  ByteSet s;
  for (char c : {' ', '\t', '\n', '\r', '\v', '\f'}) s.set(static_cast<unsigned char>(c));
  return s;
}
ByteSet ascii_complement(const ByteSet& s) {
  ByteSet out;
  for (int b = 0; b < 128; ++b) out[static_cast<size_t>(b)] = !s[static_cast<size_t>(b)];
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Result<NodePtr> parse() {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      ++i_;
    }
    PETREL_ASSIGN_OR_RETURN(NodePtr body, alternation());
    if (i_ < p_.size() && p_[i_] == '$' && i_ + 1 == p_.size()) {
      anchored_end = true;
      ++i_;
    }
    if ((anchored_start || anchored_end) && body->kind == Node::kAlt) {
      // `^a|b$` is (^a)|(b$) in ECMA-262, which anchoring the whole would change.
      return invalid_argument("pattern: '^' or '$' with a top-level '|' is not supported (write ^(a|b)$ or ^(?:a|b)$)");
    }
    if (i_ < p_.size()) {
      if (p_[i_] == ')') return error("')' without '('");
      if (p_[i_] == '$') return error("'$' is only supported at the pattern's end");
      return error("unexpected '" + std::string(1, p_[i_]) + "'");
    }
    std::vector<NodePtr> parts;
    if (!anchored_start) parts.push_back(any_string());
    parts.push_back(std::move(body));
    if (!anchored_end) parts.push_back(any_string());
    return seq(std::move(parts));
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("pattern at offset " + std::to_string(i_) + ": " + what);
  }
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

  static NodePtr any_string() {
    std::vector<NodePtr> any;
    any.push_back(byte_range(0, 0x7F));
    any.push_back(any_multibyte());
    auto rep = make(Node::kRepeat);
    rep->children.push_back(alt(std::move(any)));
    return rep;
  }

  Result<NodePtr> alternation() {
    std::vector<NodePtr> branches;
    PETREL_ASSIGN_OR_RETURN(NodePtr first, concatenation());
    branches.push_back(std::move(first));
    while (at('|')) {
      ++i_;
      PETREL_ASSIGN_OR_RETURN(NodePtr next, concatenation());
      branches.push_back(std::move(next));
    }
    return alt(std::move(branches));
  }

  Result<NodePtr> concatenation() {
    std::vector<NodePtr> parts;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) break;  // the end anchor, taken by parse()
      PETREL_ASSIGN_OR_RETURN(NodePtr atom, repeat());
      parts.push_back(std::move(atom));
    }
    if (parts.empty()) return make(Node::kEmpty);
    return seq(std::move(parts));
  }

  Result<NodePtr> repeat() {
    PETREL_ASSIGN_OR_RETURN(NodePtr node, atom());
    while (i_ < p_.size()) {
      int min = 0, max = -1;
      const char c = p_[i_];
      if (c == '*') {
        ++i_;
      } else if (c == '+') {
        min = 1;
        ++i_;
      } else if (c == '?') {
        max = 1;
        ++i_;
      } else if (c == '{' && braces(min, max)) {
        // braces() consumed {n}, {n,} or {n,m}
      } else {
        break;
      }
      if (at('?')) ++i_;  // lazy: the same strings match
      auto rep = make(Node::kRepeat);
      rep->min = min;
      rep->max = max;
      rep->children.push_back(std::move(node));
      node = std::move(rep);
    }
    return node;
  }

  // {n}, {n,}, {n,m} at i_ (ECMA-262 reads any other '{' as a literal brace).
  bool braces(int& min, int& max) {
    size_t j = i_ + 1;
    auto number = [&](int& out) {
      const size_t begin = j;
      long v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && v <= 100000) v = v * 10 + (p_[j++] - '0');
      out = static_cast<int>(v);
      return j > begin;
    };
    if (!number(min)) return false;
    max = min;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      max = -1;
      if (j < p_.size() && p_[j] != '}' && !number(max)) return false;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    i_ = j + 1;
    return true;
  }

  // One UTF-8 character of the pattern at i_, as a code point.
  Result<uint32_t> utf8_char() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const int len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || i_ + static_cast<size_t>(len) > p_.size()) return error("not UTF-8");
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len; ++k) {
      const auto cb = static_cast<unsigned char>(p_[i_ + static_cast<size_t>(k)]);
      if ((cb & 0xC0) != 0x80) return error("not UTF-8");
      cp = (cp << 6) | (cb & 0x3F);
    }
    i_ += static_cast<size_t>(len);
    return cp;
  }

  Result<uint32_t> hex_digits(int n) {
    if (i_ + static_cast<size_t>(n) > p_.size()) return error("expected " + std::to_string(n) + " hexadecimal digits");
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const char c = p_[i_++];
      const int d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
      if (d < 0) return error("expected a hexadecimal digit");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // An escape after '\' (i_ past it): a class (set, multibyte = whether multi-byte characters are in) or one
  // code point.
  struct Escape {
    bool is_class = false;
    ByteSet set;
    bool multibyte = false;
    uint32_t cp = 0;
  };
  Result<Escape> escape() {
    if (i_ >= p_.size()) return error("pattern ends with '\\'");
    const char c = p_[i_++];
    Escape e;
    switch (c) {
      case 'd': e.is_class = true; e.set = digit_set(); return e;
      case 'D': e.is_class = true; e.set = ascii_complement(digit_set()); e.multibyte = true; return e;
      case 'w': e.is_class = true; e.set = word_set(); return e;
      case 'W': e.is_class = true; e.set = ascii_complement(word_set()); e.multibyte = true; return e;
      case 's': e.is_class = true; e.set = space_set(); return e;
      case 'S': e.is_class = true; e.set = ascii_complement(space_set()); e.multibyte = true; return e;
      case 't': e.cp = '\t'; return e;
      case 'n': e.cp = '\n'; return e;
      case 'r': e.cp = '\r'; return e;
      case 'f': e.cp = '\f'; return e;
      case 'v': e.cp = '\v'; return e;
      case '0': e.cp = 0; return e;
      case 'x': {
        PETREL_ASSIGN_OR_RETURN(e.cp, hex_digits(2));
        return e;
      }
      case 'u': {
        PETREL_ASSIGN_OR_RETURN(e.cp, hex_digits(4));
        if (e.cp >= 0xD800 && e.cp <= 0xDFFF) return error("surrogate escapes are not supported");
        return e;
      }
      case 'b': case 'B': --i_; return error("word boundaries (\\b, \\B) are not supported");
      default:
        if (c >= '1' && c <= '9') {
          --i_;
          return error("back-references are not supported");
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          --i_;
          return error("unknown escape '\\" + std::string(1, c) + "'");
        }
        --i_;
        PETREL_ASSIGN_OR_RETURN(e.cp, utf8_char());  // '\' before punctuation (or any other character): itself
        return e;
    }
  }

  Result<NodePtr> atom() {
    const char c = p_[i_];
    if (c == '(') {
      if (++depth_ > kMaxDepth) return error("groups nested more than " + std::to_string(kMaxDepth) + " deep");
      ++i_;
      if (at('?')) {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
          i_ += 2;
        } else if (i_ + 1 < p_.size() && p_[i_ + 1] == '<' && i_ + 2 < p_.size() && p_[i_ + 2] != '=' && p_[i_ + 2] != '!') {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) return error("unterminated group name");
          i_ = close + 1;
        } else {
          return error("lookaround and other (? groups are not supported");
        }
      }
      PETREL_ASSIGN_OR_RETURN(NodePtr inner, alternation());
      if (!at(')')) return error("missing ')'");
      ++i_;
      --depth_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      ClassSet s;
      s.ascii = ascii_complement(ByteSet().set('\n').set('\r'));
      s.multibyte = true;
      return s.node();
    }
    if (c == '\\') {
      ++i_;
      PETREL_ASSIGN_OR_RETURN(Escape e, escape());
      if (!e.is_class) return code_point(e.cp);
      ClassSet s;
      s.ascii = e.set;
      s.multibyte = e.multibyte;
      return s.node();
    }
    if (c == '*' || c == '+' || c == '?') return error("nothing to repeat");
    if (c == '^') return error("'^' is only supported at the pattern's start");
    if (c == '$') return error("'$' is only supported at the pattern's end");
    if (c == '{') {
      int min = 0, max = 0;
      const size_t save = i_;
      if (braces(min, max)) {
        i_ = save;
        return error("nothing to repeat");
      }
    }
    PETREL_ASSIGN_OR_RETURN(uint32_t cp, utf8_char());
    return code_point(cp);
  }

  Result<NodePtr> char_class() {
    ++i_;  // '['
    bool negated = false;
    if (at('^')) {
      negated = true;
      ++i_;
    }
    ClassSet s;
    while (i_ < p_.size() && p_[i_] != ']') {
      uint32_t lo = 0;
      if (p_[i_] == '\\') {
        ++i_;
        PETREL_ASSIGN_OR_RETURN(Escape e, escape());
        if (e.is_class) {
          s.ascii |= e.set;
          s.multibyte = s.multibyte || e.multibyte;
          continue;
        }
        lo = e.cp;
      } else {
        PETREL_ASSIGN_OR_RETURN(lo, utf8_char());
      }
      uint32_t hi = lo;
      if (at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          PETREL_ASSIGN_OR_RETURN(Escape e, escape());
          if (e.is_class) return error("a class escape cannot end a range");
          hi = e.cp;
        } else {
          PETREL_ASSIGN_OR_RETURN(hi, utf8_char());
        }
        if (hi < lo) return error("range out of order");
      }
      if (hi < 0x80) {
        add_ascii(s.ascii, static_cast<int>(lo), static_cast<int>(hi));
      } else if (lo == hi) {
        s.code_points.push_back(lo);
      } else {
        return error("ranges of non-ASCII characters in a class are not supported");
      }
    }
    if (!at(']')) return error("missing ']'");
    ++i_;
    if (negated) {
      if (!s.code_points.empty()) return error("non-ASCII characters in a negated class are not supported");
      ClassSet n;
      n.ascii = ascii_complement(s.ascii);
      n.multibyte = !s.multibyte;
      return n.node();
    }
    return s.node();
  }

  static constexpr int kMaxDepth = 64;
  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
};

// Thompson NFA: a state moves on a byte of `bytes` to `next`, or by epsilon to eps[0] / eps[1].
struct NfaState {
  ByteSet bytes;
  int32_t next = -1;
  int32_t eps[2] = {-1, -1};
};

class NfaBuilder {
 public:
  static constexpr size_t kMaxNfaStates = 20000;
  std::vector<NfaState> states;

  int32_t add() {
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
  void link(int32_t from, int32_t to) {
    NfaState& s = states[static_cast<size_t>(from)];
    (s.eps[0] < 0 ? s.eps[0] : s.eps[1]) = to;
  }
  // The fragment of `n` from state `in` to a new state, returned (-1 when too large).
  int32_t build(const Node& n, int32_t in) {
    if (states.size() > kMaxNfaStates) return -1;
    switch (n.kind) {
      case Node::kEmpty: return in;
      case Node::kBytes: {
        const int32_t out = add();
        states[static_cast<size_t>(in)].bytes = n.bytes;
        states[static_cast<size_t>(in)].next = out;
        return out;
      }
      case Node::kSeq: {
        int32_t at = in;
        for (const auto& c : n.children) {
          // A byte state moves on bytes only: give each child a fresh entry so that `in`'s kind stays single.
          const int32_t entry = add();
          link(at, entry);
          at = build(*c, entry);
          if (at < 0) return -1;
        }
        return at;
      }
      case Node::kAlt: {
        const int32_t out = add();
        int32_t from = in;
        for (size_t k = 0; k < n.children.size(); ++k) {
          // A chain of two-way splits: from -> (branch k, next split).
          const int32_t entry = add();
          link(from, entry);
          const int32_t end = build(*n.children[k], entry);
          if (end < 0) return -1;
          link(end, out);
          if (k + 1 < n.children.size()) {
            const int32_t split = add();
            link(from, split);
            from = split;
          }
        }
        return out;
      }
      case Node::kRepeat: {
        const Node& body = *n.children[0];
        int32_t at = in;
        for (int k = 0; k < n.min; ++k) {
          const int32_t entry = add();
          link(at, entry);
          at = build(body, entry);
          if (at < 0) return -1;
        }
        if (n.max < 0) {  // a loop: at -> body -> at, and at -> out
          const int32_t loop = add();
          link(at, loop);
          const int32_t entry = add();
          const int32_t out = add();
          link(loop, entry);
          link(loop, out);
          const int32_t end = build(body, entry);
          if (end < 0) return -1;
          link(end, loop);
          return out;
        }
        const int32_t out = add();
        for (int k = n.min; k < n.max; ++k) {  // optional copies, each may be skipped to the end
          const int32_t entry = add();
          link(at, entry);
          link(at, out);
          at = build(body, entry);
          if (at < 0) return -1;
        }
        link(at, out);
        return out;
      }
    }
    return -1;
  }
};

void closure(const std::vector<NfaState>& nfa, std::vector<int32_t>& set, std::vector<uint8_t>& mark) {
  std::vector<int32_t> stack(set.begin(), set.end());
  for (int32_t s : set) mark[static_cast<size_t>(s)] = 1;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t e : nfa[static_cast<size_t>(s)].eps) {
      if (e >= 0 && !mark[static_cast<size_t>(e)]) {
        mark[static_cast<size_t>(e)] = 1;
        set.push_back(e);
        stack.push_back(e);
      }
    }
  }
  for (int32_t s : set) mark[static_cast<size_t>(s)] = 0;
  std::sort(set.begin(), set.end());
}

}  // namespace

Result<RegexDfa> RegexDfa::compile(std::string_view pattern) {
  Parser parser(pattern);
  PETREL_ASSIGN_OR_RETURN(NodePtr tree, parser.parse());
  NfaBuilder nfa;
  const int32_t start = nfa.add();
  const int32_t accept = nfa.build(*tree, start);
  if (accept < 0) return invalid_argument("pattern: too large (more than " + std::to_string(NfaBuilder::kMaxNfaStates) + " automaton states; smaller repetition counts?)");

  // Bytes that every NFA state's set treats alike form one class; the subset construction steps one
  // representative byte a class (a few dozen classes, not 256 bytes, per DFA state).
  std::vector<int> byte_class(256, 0);
  int n_classes = 1;
  {
    std::vector<ByteSet> distinct;
    for (const NfaState& st : nfa.states) {
      if (st.next >= 0 && std::find(distinct.begin(), distinct.end(), st.bytes) == distinct.end()) distinct.push_back(st.bytes);
    }
    for (const ByteSet& set : distinct) {  // split every class by membership in `set`
      std::map<std::pair<int, bool>, int> split;
      for (int c = 0; c < 256; ++c) {
        const auto key = std::make_pair(byte_class[static_cast<size_t>(c)], static_cast<bool>(set[static_cast<size_t>(c)]));
        auto [it, inserted] = split.emplace(key, static_cast<int>(split.size()));
        byte_class[static_cast<size_t>(c)] = it->second;
      }
      n_classes = static_cast<int>(split.size());
    }
  }
  std::vector<int> representative(static_cast<size_t>(n_classes), -1);
  for (int c = 0; c < 256; ++c) {
    if (representative[static_cast<size_t>(byte_class[static_cast<size_t>(c)])] < 0) {
      representative[static_cast<size_t>(byte_class[static_cast<size_t>(c)])] = c;
    }
  }

  RegexDfa dfa;
  dfa.pattern_ = std::string(pattern);
  constexpr size_t kMaxEntries = size_t{4} << 20;
  size_t entries = 0;
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  std::vector<uint8_t> mark(nfa.states.size(), 0);
  std::vector<int32_t> first{start};
  closure(nfa.states, first, mark);
  ids.emplace(first, 0);
  sets.push_back(std::move(first));
  for (size_t d = 0; d < sets.size(); ++d) {
    dfa.table_.resize((d + 1) * 256, kDead);
    const std::vector<int32_t> current = sets[d];  // a copy: sets grows below
    dfa.accepting_.push_back(std::binary_search(current.begin(), current.end(), accept) ? 1 : 0);
    std::vector<int32_t> to_class(static_cast<size_t>(n_classes), kDead);
    for (int k = 0; k < n_classes; ++k) {
      const auto c = static_cast<size_t>(representative[static_cast<size_t>(k)]);
      std::vector<int32_t> next;
      for (int32_t s : current) {
        const NfaState& st = nfa.states[static_cast<size_t>(s)];
        if (st.next >= 0 && st.bytes[c]) next.push_back(st.next);
      }
      if (next.empty()) continue;
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      closure(nfa.states, next, mark);
      auto [it, inserted] = ids.emplace(next, static_cast<int32_t>(sets.size()));
      if (inserted) {
        // Bounds on what a hostile pattern can cost (a request's schema): states, and NFA states held over all
        // DFA states (memory, and the work per state), ~0.1 s and ~40 MB at most.
        entries += next.size();
        if (sets.size() >= static_cast<size_t>(kMaxStates) || entries > kMaxEntries) {
          return invalid_argument("pattern: its automaton needs more than " + std::to_string(kMaxStates) +
                                  " states or is too large to build (a shorter or less ambiguous pattern?)");
        }
        sets.push_back(std::move(next));
      }
      to_class[static_cast<size_t>(k)] = it->second;
    }
    for (int c = 0; c < 256; ++c) dfa.table_[d * 256 + static_cast<size_t>(c)] = to_class[static_cast<size_t>(byte_class[static_cast<size_t>(c)])];
  }
  dfa.minimize();
  dfa.find_open_states();
  return dfa;
}

Result<RegexDfa> RegexDfa::intersect(const RegexDfa& a, const RegexDfa& b) {
  RegexDfa dfa;
  dfa.pattern_ = "(" + a.pattern_ + ") and (" + b.pattern_ + ")";
  std::map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs{{a.start(), b.start()}};
  ids.emplace(pairs[0], 0);
  for (size_t d = 0; d < pairs.size(); ++d) {
    const auto [sa, sb] = pairs[d];
    dfa.table_.resize((d + 1) * 256, kDead);
    dfa.accepting_.push_back(a.accepting(sa) && b.accepting(sb) ? 1 : 0);
    for (int c = 0; c < 256; ++c) {
      const int32_t ta = a.next(sa, static_cast<unsigned char>(c)), tb = b.next(sb, static_cast<unsigned char>(c));
      if (ta == kDead || tb == kDead) continue;
      auto [it, inserted] = ids.emplace(std::make_pair(ta, tb), static_cast<int32_t>(pairs.size()));
      if (inserted) {
        if (pairs.size() >= static_cast<size_t>(kMaxStates)) {
          return invalid_argument("pattern: the automaton of strings both '" + a.pattern_ + "' and '" + b.pattern_ +
                                  "' match needs more than " + std::to_string(kMaxStates) + " states");
        }
        pairs.emplace_back(ta, tb);
      }
      dfa.table_[d * 256 + static_cast<size_t>(c)] = it->second;
    }
  }
  // States that can still reach an accepting one (backwards from the accepting states); the others dead.
  const size_t n = pairs.size();
  std::vector<std::vector<int32_t>> from(n);
  for (size_t d = 0; d < n; ++d) {
    for (int c = 0; c < 256; ++c) {
      const int32_t t = dfa.table_[d * 256 + static_cast<size_t>(c)];
      if (t != kDead) from[static_cast<size_t>(t)].push_back(static_cast<int32_t>(d));
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> work;
  for (size_t d = 0; d < n; ++d) {
    if (dfa.accepting_[d]) {
      live[d] = 1;
      work.push_back(static_cast<int32_t>(d));
    }
  }
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (int32_t s : from[static_cast<size_t>(t)]) {
      if (!live[static_cast<size_t>(s)]) {
        live[static_cast<size_t>(s)] = 1;
        work.push_back(s);
      }
    }
  }
  if (!live[0]) return invalid_argument("pattern: no string matches both '" + a.pattern_ + "' and '" + b.pattern_ + "'");
  for (int32_t& t : dfa.table_) {
    if (t != kDead && !live[static_cast<size_t>(t)]) t = kDead;
  }
  dfa.minimize();  // the states turned dead are unreachable now: not kept
  dfa.find_open_states();
  return dfa;
}

// Moore's partition refinement: states start split by acceptance, and a block splits while two of its states go
// to different blocks on some byte (bytes whose columns of the table are equal stepped once); the blocks are the
// minimal automaton's states, numbered by their first state (the start stays 0) and holding only the states
// reachable from the start. The subset construction gives equivalent states (an unanchored pattern's, a format's
// repeated shapes), and a product's size follows its inputs'. Each round costs states x byte classes; past
// kMaxWork the automaton is kept as built (correct, only larger): `^a{4000}$` (already minimal, one block split a
// round) stops there after ~15 ms, where the whole refinement took ~0.5 s.
void RegexDfa::minimize() {
  constexpr size_t kMaxWork = size_t{2} << 20;
  const size_t n = accepting_.size();
  if (n <= 1) return;
  std::vector<int> classes;  // a representative byte of each distinct column
  {
    std::map<std::vector<int32_t>, int> columns;
    std::vector<int32_t> column(n);
    for (int c = 0; c < 256; ++c) {
      for (size_t s = 0; s < n; ++s) column[s] = table_[s * 256 + static_cast<size_t>(c)];
      if (columns.emplace(column, c).second) classes.push_back(c);
    }
  }
  std::vector<int32_t> block(n), next(n);
  for (size_t s = 0; s < n; ++s) block[s] = accepting_[s];
  size_t blocks = 0, work = 0;
  std::vector<int32_t> signature(classes.size() + 1);
  for (;;) {
    std::map<std::vector<int32_t>, int32_t> ids;
    for (size_t s = 0; s < n; ++s) {
      signature[0] = block[s];
      for (size_t k = 0; k < classes.size(); ++k) {
        const int32_t t = table_[s * 256 + static_cast<size_t>(classes[k])];
        signature[k + 1] = t == kDead ? -1 : block[static_cast<size_t>(t)];
      }
      next[s] = ids.emplace(signature, static_cast<int32_t>(ids.size())).first->second;
    }
    work += n * signature.size();
    if (ids.size() == blocks) break;  // no block split: stable (next numbers the blocks by first state)
    if (work > kMaxWork) return;
    blocks = ids.size();
    block.swap(next);
  }
  // Blocks reachable from the start's, renumbered in the order they are found (the start's is 0).
  std::vector<int32_t> first_state(blocks, -1);
  for (size_t s = n; s-- > 0;) first_state[static_cast<size_t>(next[s])] = static_cast<int32_t>(s);
  std::vector<int32_t> id(blocks, -1), order{next[0]};
  id[static_cast<size_t>(next[0])] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto s = static_cast<size_t>(first_state[static_cast<size_t>(order[i])]);
    for (int c = 0; c < 256; ++c) {
      const int32_t t = table_[s * 256 + static_cast<size_t>(c)];
      if (t == kDead) continue;
      const auto b = static_cast<size_t>(next[static_cast<size_t>(t)]);
      if (id[b] < 0) {
        id[b] = static_cast<int32_t>(order.size());
        order.push_back(static_cast<int32_t>(b));
      }
    }
  }
  std::vector<int32_t> table(order.size() * 256, kDead);
  std::vector<uint8_t> accepting(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const auto s = static_cast<size_t>(first_state[static_cast<size_t>(order[i])]);
    accepting[i] = accepting_[s];
    for (int c = 0; c < 256; ++c) {
      const int32_t t = table_[s * 256 + static_cast<size_t>(c)];
      if (t != kDead) table[i * 256 + static_cast<size_t>(c)] = id[static_cast<size_t>(next[static_cast<size_t>(t)])];
    }
  }
  table_ = std::move(table);
  accepting_ = std::move(accepting);
}

// The largest set F of states such that every string character (an ASCII byte from 0x20 but '"' and
// '\\', or a lead byte C2-F4 and its 1-3 continuation bytes 80-BF: a superset of valid UTF-8) leads from a state
// of F to a state of F: a greatest fixpoint, states removed until none must be.
void RegexDfa::find_open_states() {
  const auto n = static_cast<size_t>(state_count());
  open_.assign(n, 1);
  // Where a character of `len` bytes beginning with `lead` can lead from `s` (kDead among them if it can die).
  auto targets = [&](int32_t s, int lead, int len, std::vector<int32_t>& out) {
    out.assign(1, next(s, static_cast<unsigned char>(lead)));
    for (int k = 1; k < len; ++k) {
      std::vector<int32_t> step;
      for (int32_t t : out) {
        if (t == kDead) return;  // out holds kDead
        for (int c = 0x80; c <= 0xBF; ++c) step.push_back(next(t, static_cast<unsigned char>(c)));
        std::sort(step.begin(), step.end());
        step.erase(std::unique(step.begin(), step.end()), step.end());
      }
      out = std::move(step);
    }
  };
  std::vector<int32_t> reach;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < n; ++s) {
      if (!open_[s]) continue;
      bool ok = true;
      for (int c = 0x20; c < 0x80 && ok; ++c) {
        if (c == '"' || c == '\\') continue;
        const int32_t t = next(static_cast<int32_t>(s), static_cast<unsigned char>(c));
        ok = t != kDead && open_[static_cast<size_t>(t)];
      }
      for (int lead = 0xC2; lead <= 0xF4 && ok; ++lead) {
        targets(static_cast<int32_t>(s), lead, lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4, reach);
        for (int32_t t : reach) ok = ok && t != kDead && open_[static_cast<size_t>(t)];
      }
      if (!ok) {
        open_[s] = 0;
        changed = true;
      }
    }
  }
}

bool RegexDfa::matches(std::string_view text) const {
  int32_t s = start();
  for (unsigned char c : text) {
    s = next(s, c);
    if (s == kDead) return false;
  }
  return accepting(s);
}

}  // namespace petrel
