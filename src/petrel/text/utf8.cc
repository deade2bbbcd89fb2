#include "petrel/text/utf8.h"

namespace petrel::utf8 {

namespace {

// Length of the well-formed sequence starting at text[pos]: 1..4; 0 when malformed, with *bad_length set
// to the length of the maximal malformed subpart (the bytes one U+FFFD replaces); and -n when the first n
// bytes are a valid but incomplete beginning cut off by the end of `text`.
// Follows the table of well-formed byte sequences in the Unicode standard (Table 3-7).
int sequence_length(std::string_view text, size_t pos, size_t* bad_length = nullptr) {
  if (bad_length) *bad_length = 1;
  const auto byte_at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte_at(pos);
  if (lead < 0x80) return 1;
  int length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // overlong
    if (lead == 0xED) second_max = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // overlong
    if (lead == 0xF4) second_max = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  const size_t available = text.size() - pos;
  for (int i = 1; i < length; ++i) {
    if (static_cast<size_t>(i) >= available) return -i;
    const uint8_t b = byte_at(pos + i);
    const uint8_t lo = i == 1 ? second_min : 0x80;
    const uint8_t hi = i == 1 ? second_max : 0xBF;
    if (b < lo || b > hi) {
      if (bad_length) *bad_length = static_cast<size_t>(i);
      return 0;
    }
  }
  return length;
}

}  // namespace

std::optional<size_t> find_invalid(std::string_view text) {
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    // ASCII fast path, 8 bytes at a time: most of any real text.
    while (pos + 8 <= n) {
      uint64_t word = 0;
      for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(static_cast<uint8_t>(text[pos + i])) << (8 * i);
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= n) break;
    const int length = sequence_length(text, pos);
    if (length <= 0) return pos;
    pos += static_cast<size_t>(length);
  }
  return std::nullopt;
}

size_t complete_prefix_length(std::string_view bytes) {
  // Only the last 3 bytes can be the start of an incomplete sequence.
  const size_t n = bytes.size();
  const size_t first_candidate = n > 3 ? n - 3 : 0;
  for (size_t pos = first_candidate; pos < n; ++pos) {
    const uint8_t b = static_cast<uint8_t>(bytes[pos]);
    if (b < 0xC0) continue;  // ASCII or a continuation byte: not a lead
    if (sequence_length(bytes, pos) < 0) return pos;
  }
  return n;
}

std::string sanitize(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t bad_length = 1;
    const int length = sequence_length(bytes, pos, &bad_length);
    if (length > 0) {
      out.append(bytes.substr(pos, static_cast<size_t>(length)));
      pos += static_cast<size_t>(length);
    } else {
      // One replacement character per maximal malformed subpart, as the Unicode standard recommends.
      out.append("\xEF\xBF\xBD");
      pos += length < 0 ? static_cast<size_t>(-length) : bad_length;
    }
  }
  return out;
}

void append_code_point(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t decode_valid(std::string_view text, size_t& pos) {
  const uint8_t lead = static_cast<uint8_t>(text[pos]);
  int length = 1;
  uint32_t cp = lead;
  if (lead >= 0xF0) {
    length = 4;
    cp = lead & 0x07;
  } else if (lead >= 0xE0) {
    length = 3;
    cp = lead & 0x0F;
  } else if (lead >= 0xC0) {
    length = 2;
    cp = lead & 0x1F;
  }
  for (int i = 1; i < length && pos + i < text.size(); ++i) {
    cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  }
  pos += static_cast<size_t>(length);
  return cp;
}

}  // namespace petrel::utf8
