// Python str operations on TStrings. Each keeps the untrusted byte ranges of its input: results that
// are slices of the input keep the slices' ranges; where bytes change (case mapping that changes
// length), the whole result is marked untrusted if any input byte was.
#include <algorithm>

#include "petrel/text/jinja_builtins.h"

namespace petrel::jinja {
namespace {

uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 32;
  if (c == 0xff) return 0x178;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x3b1 && c <= 0x3c9) return c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

bool is_upper_letter(uint32_t c) { return to_lower(c) != c; }
bool is_lower_letter(uint32_t c) { return to_upper(c) != c || c == 0xdf; }
bool is_cased(uint32_t c) { return is_upper_letter(c) || is_lower_letter(c); }

// Carries taint over a per-codepoint transformation: exact when the byte length did not change.
TString with_taint_of(const TString& source, std::string text) {
  TString out(std::move(text));
  if (!source.has_untrusted()) return out;
  if (out.size() == source.size()) {
    for (const ByteRange& r : source.untrusted_ranges()) out.mark_untrusted(r.begin, r.end);
  } else {
    out.mark_all_untrusted();
  }
  return out;
}

bool is_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

}  // namespace

TString strip_tstring(const TString& s, const std::string* chars, bool left, bool right) {
  const std::string& text = s.text();
  std::vector<uint32_t> strip_set;
  if (chars != nullptr) {
    for (size_t i = 0; i < chars->size();) strip_set.push_back(next_codepoint(*chars, i));
  }
  auto strippable = [&](uint32_t cp) {
    if (chars == nullptr) return is_python_space(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!strippable(next_codepoint(text, next))) break;
      begin = next;
    }
  }
  if (right) {
    // Walk forward to find the end of the last non-strippable codepoint.
    size_t last_keep = begin;
    for (size_t i = begin; i < end;) {
      uint32_t cp = next_codepoint(text, i);
      if (!strippable(cp)) last_keep = i;
    }
    end = last_keep;
  }
  return s.substr(begin, end);
}

TString change_case(const TString& s, CaseMapping mapping) {
  const std::string& text = s.text();
  std::string out;
  out.reserve(text.size());
  bool previous_cased = false;
  bool first = true;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = next_codepoint(text, i);
    uint32_t mapped = cp;
    switch (mapping) {
      case CaseMapping::kUpper: mapped = to_upper(cp); break;
      case CaseMapping::kLower: mapped = to_lower(cp); break;
      case CaseMapping::kSwapCase: mapped = is_upper_letter(cp) ? to_lower(cp) : to_upper(cp); break;
      case CaseMapping::kCapitalize: mapped = first ? to_upper(cp) : to_lower(cp); break;
      case CaseMapping::kTitle:
        mapped = previous_cased ? to_lower(cp) : to_upper(cp);
        previous_cased = is_cased(cp);
        break;
    }
    first = false;
    append_utf8(out, mapped);
  }
  return with_taint_of(s, std::move(out));
}

TString replace_tstring(const TString& s, const std::string& old_text, const TString& new_text, int64_t count) {
  const std::string& text = s.text();
  TString out;
  if (count < 0) count = INT64_MAX;
  if (old_text.empty()) {
    // Python inserts `new` before every character and at the end.
    size_t i = 0;
    int64_t done = 0;
    while (i < text.size()) {
      if (done < count) {
        out.append(new_text);
        ++done;
      }
      size_t start = i;
      next_codepoint(text, i);
      out.append_slice(s, start, i);
    }
    if (done < count) out.append(new_text);
    return out;
  }
  size_t cursor = 0;
  int64_t done = 0;
  while (done < count) {
    size_t found = text.find(old_text, cursor);
    if (found == std::string::npos) break;
    out.append_slice(s, cursor, found);
    out.append(new_text);
    cursor = found + old_text.size();
    ++done;
  }
  out.append_slice(s, cursor, text.size());
  return out;
}

std::vector<TString> split_tstring(const TString& s, const std::string* sep, int64_t maxsplit, bool from_right) {
  const std::string& text = s.text();
  std::vector<TString> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep == nullptr) {
    // Runs of whitespace separate; leading and trailing whitespace produce no empty parts.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < text.size()) {
      size_t start = i;
      uint32_t cp = next_codepoint(text, i);
      if (is_python_space(cp)) continue;
      size_t end = i;
      while (i < text.size()) {
        size_t before = i;
        if (is_python_space(next_codepoint(text, i))) {
          i = before;
          break;
        }
        end = i;
      }
      words.emplace_back(start, end);
    }
    if (static_cast<int64_t>(words.size()) - 1 > maxsplit) {
      // The words beyond maxsplit stay one part with the original text between them (as CPython does).
      if (!from_right) {
        size_t keep = static_cast<size_t>(maxsplit);
        for (size_t w = 0; w < keep; ++w) parts.push_back(s.substr(words[w].first, words[w].second));
        parts.push_back(s.substr(words[keep].first, text.size()));
      } else {
        size_t first_kept = words.size() - static_cast<size_t>(maxsplit);
        parts.push_back(s.substr(0, words[first_kept - 1].second));
        for (size_t w = first_kept; w < words.size(); ++w) parts.push_back(s.substr(words[w].first, words[w].second));
      }
      return parts;
    }
    for (const auto& [b, e] : words) parts.push_back(s.substr(b, e));
    return parts;
  }
  std::vector<size_t> cuts;  // start offsets of separators used
  if (!from_right) {
    size_t cursor = 0;
    while (static_cast<int64_t>(cuts.size()) < maxsplit) {
      size_t found = text.find(*sep, cursor);
      if (found == std::string::npos) break;
      cuts.push_back(found);
      cursor = found + sep->size();
    }
  } else {
    size_t limit = text.size();
    while (static_cast<int64_t>(cuts.size()) < maxsplit && limit >= sep->size()) {
      size_t found = text.rfind(*sep, limit - sep->size());
      if (found == std::string::npos) break;
      cuts.push_back(found);
      if (found == 0) break;
      limit = found;
    }
    std::reverse(cuts.begin(), cuts.end());
  }
  size_t cursor = 0;
  for (size_t cut : cuts) {
    parts.push_back(s.substr(cursor, cut));
    cursor = cut + sep->size();
  }
  parts.push_back(s.substr(cursor, text.size()));
  return parts;
}

std::vector<TString> splitlines_tstring(const TString& s, bool keep_ends) {
  const std::string& text = s.text();
  std::vector<TString> lines;
  size_t line_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t before = i;
    uint32_t cp = next_codepoint(text, i);
    if (!is_line_break(cp)) continue;
    size_t break_end = i;
    if (cp == '\r' && i < text.size() && text[i] == '\n') break_end = ++i;
    lines.push_back(s.substr(line_start, keep_ends ? break_end : before));
    line_start = break_end;
  }
  if (line_start < text.size()) lines.push_back(s.substr(line_start, text.size()));
  return lines;
}

std::vector<TString> characters(const TString& s) {
  std::vector<TString> out;
  const std::string& text = s.text();
  for (size_t i = 0; i < text.size();) {
    size_t start = i;
    next_codepoint(text, i);
    out.push_back(s.substr(start, i));
  }
  return out;
}

bool python_is_lower(std::string_view s) {
  bool any_cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = next_codepoint(s, i);
    if (is_upper_letter(cp)) return false;
    any_cased = any_cased || is_lower_letter(cp);
  }
  return any_cased;
}

bool python_is_upper(std::string_view s) {
  bool any_cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = next_codepoint(s, i);
    if (is_lower_letter(cp)) return false;
    any_cased = any_cased || is_upper_letter(cp);
  }
  return any_cased;
}

}  // namespace petrel::jinja
