#include "petrel/text/bpe_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

namespace petrel::text_internal {

namespace {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

// PCRE2 match state for one split() call. The JIT stack is only made when the default (32 KiB on the
// machine stack) runs out, which takes a pathological input such as a megabyte of one repeated class.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  explicit MatchScratch(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchScratch() {
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    if (context) pcre2_match_context_free(context);
    if (data) pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

  bool grow_jit_stack() {
    if (jit_stack) return false;  // already at the maximum
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    if (!context || !jit_stack) return false;
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
    return true;
  }
};

// Unicode's White_Space property, which is what \s means to Oniguruma (Hugging Face's regex engine) and to
// Rust's regex. PCRE2's \s differs: it also matches U+180E MONGOLIAN VOWEL SEPARATOR, a format character
// since Unicode 6.3, which would split "  \u180e" differently from Hugging Face.
constexpr const char* kWhiteSpaceClassBody =
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// Rewrites \s and \S into explicit White_Space classes. Tracks character classes so that [^\s\p{L}] becomes
// [^<list>\p{L}]; a \S inside a class has no class-body spelling and is left to PCRE2.
std::string with_unicode_white_space(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody) : "[" + std::string(kWhiteSpaceClassBody) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceClassBody) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (close != std::string::npos) {
        out.append(pattern, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Result<std::shared_ptr<const RegexSplitter>> RegexSplitter::compile(const std::string& pattern, bool literal,
                                                                    SplitBehavior behavior, bool invert) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2 refuses UCP together with LITERAL, and a literal has no classes for UCP to affect anyway.
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  const std::string effective = literal ? pattern : with_unicode_white_space(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(effective.data()), effective.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (!code) {
    return invalid_data("cannot compile the regex /" + pattern + "/ at offset " + std::to_string(error_offset) +
                        ": " + pcre2_error_text(error_code));
  }
  std::shared_ptr<RegexSplitter> splitter(new RegexSplitter());
  splitter->code_ = code;
  // JIT is an optimisation only: a PCRE2 built without it still matches, through the interpreter.
  splitter->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  splitter->behavior_ = behavior;
  splitter->invert_ = invert;
  return std::shared_ptr<const RegexSplitter>(std::move(splitter));
}

RegexSplitter::~RegexSplitter() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Status RegexSplitter::for_each_match(std::string_view text,
                                     const std::function<void(size_t, size_t)>& on_match) const {
  const auto* code = static_cast<const pcre2_code*>(code_);
  MatchScratch scratch(code);
  if (!scratch.data) return internal_error("out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    int rc;
    for (;;) {
      // The caller validated the UTF-8 once for the whole input; without NO_UTF_CHECK the interpreter
      // would re-validate the whole subject on every call, which is quadratic.
      rc = jit_ ? pcre2_jit_match(code, subject, text.size(), start, 0, scratch.data, scratch.context)
                : pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && scratch.grow_jit_stack()) continue;
      break;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return internal_error("regex match failed at byte " + std::to_string(start) + ": " + pcre2_error_text(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      on_match(begin, end);
      start = end;
    } else {
      // An empty match splits nothing; step over one character so the scan always advances.
      start = begin + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  return ok_status();
}

Status RegexSplitter::split(std::string_view text, const std::function<void(size_t, size_t)>& emit) const {
  // Streams the text as alternating gaps and matches (flipped when inverted) and groups them into pieces
  // as the behavior says. `pending` is a piece being built that may still grow.
  std::optional<std::pair<size_t, size_t>> pending;
  bool pending_is_match = false;
  const auto flush = [&] {
    if (pending && pending->second > pending->first) emit(pending->first, pending->second);
    pending.reset();
  };
  const auto on_interval = [&](size_t begin, size_t end, bool is_match) {
    if (end <= begin) return;
    if (invert_) is_match = !is_match;
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        emit(begin, end);
        break;
      case SplitBehavior::kRemoved:
        if (!is_match) emit(begin, end);
        break;
      case SplitBehavior::kMergedWithPrevious:
        // A match closes the piece before it.
        if (!pending) pending = std::make_pair(begin, end);
        pending->second = end;
        if (is_match) flush();
        break;
      case SplitBehavior::kMergedWithNext:
        // A match opens a new piece.
        if (is_match) flush();
        if (!pending) pending = std::make_pair(begin, end);
        pending->second = end;
        break;
      case SplitBehavior::kContiguous:
        // Consecutive intervals of the same kind form one piece (with invert, that joins adjacent gaps).
        if (pending && is_match != pending_is_match) flush();
        if (!pending) pending = std::make_pair(begin, end);
        pending->second = end;
        pending_is_match = is_match;
        break;
    }
  };
  size_t last_end = 0;
  PETREL_RETURN_IF_ERROR(for_each_match(text, [&](size_t begin, size_t end) {
    on_interval(last_end, begin, false);
    on_interval(begin, end, true);
    last_end = end;
  }));
  on_interval(last_end, text.size(), false);
  flush();
  return ok_status();
}

Status PreTokenizer::run(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (text.empty()) return ok_status();
  // The common case, one split stage (Llama 3 and GPT-2 are exactly that): no intermediate copies.
  if (stages_.size() == 1 && stages_[0].splitter && !stages_[0].add_prefix_space) {
    return stages_[0].splitter->split(text, [&](size_t b, size_t e) { emit(text.substr(b, e - b)); });
  }
  // General pipeline: each stage refines every piece of the previous one, as Hugging Face's
  // PreTokenizedString does. Pieces are owned here because ByteLevel may prepend a space.
  std::vector<std::string> pieces{std::string(text)};
  for (const Stage& stage : stages_) {
    std::vector<std::string> next;
    next.reserve(pieces.size());
    for (std::string& piece : pieces) {
      if (stage.add_prefix_space && !piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
      if (!stage.splitter) {
        if (!piece.empty()) next.push_back(std::move(piece));
        continue;
      }
      PETREL_RETURN_IF_ERROR(stage.splitter->split(
          piece, [&](size_t b, size_t e) { next.emplace_back(piece.substr(b, e - b)); }));
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) emit(piece);
  return ok_status();
}

}  // namespace petrel::text_internal
