// UTF-8 helpers used by the tokenizer, and the byte-level alphabet.
#include <gtest/gtest.h>

#include "petrel/text/bpe_model.h"
#include "petrel/text/utf8.h"

namespace petrel {
namespace {

TEST(Utf8Test, FindInvalid) {
  EXPECT_FALSE(utf8::find_invalid("").has_value());
  EXPECT_FALSE(utf8::find_invalid("plain ascii that is longer than eight bytes").has_value());
  EXPECT_FALSE(utf8::find_invalid("é中🦙\xF4\x8F\xBF\xBF").has_value());  // U+10FFFF is the last valid
  EXPECT_EQ(utf8::find_invalid("0123456789\xFF"), 10u);
  EXPECT_EQ(utf8::find_invalid("\xE0\x80\x80"), 0u);  // overlong
  EXPECT_EQ(utf8::find_invalid("ab\xED\xBF\xBF"), 2u);  // surrogate
  EXPECT_EQ(utf8::find_invalid("ab\xF0\x9F\xA6"), 2u);  // truncated
}

TEST(Utf8Test, CompletePrefixLengthHoldsOnlyCompletableTails) {
  EXPECT_EQ(utf8::complete_prefix_length("abc"), 3u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\xA6"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\xA6\x99"), 6u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xE4"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xFF"), 3u);      // never completable: not held
  EXPECT_EQ(utf8::complete_prefix_length("ab\xE4z"), 4u);     // broken already: not held
  EXPECT_EQ(utf8::complete_prefix_length("\x80"), 1u);
}

TEST(Utf8Test, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::sanitize("ok é"), "ok é");
  EXPECT_EQ(utf8::sanitize("a\xFF"
                           "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(utf8::sanitize("\xF0\x9F"
                           "x"),
            "\xEF\xBF\xBD"
            "x");                                                // one U+FFFD for the cut-off sequence
  EXPECT_EQ(utf8::sanitize("\xE4\xB8"), "\xEF\xBF\xBD");        // cut off by the end
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // two bytes that start nothing
}

TEST(BpeByteLevelTest, AlphabetRoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = text_internal::bytes_to_byte_level(all);
  EXPECT_EQ(text_internal::bytes_to_byte_level(" "), "Ġ");
  EXPECT_EQ(text_internal::bytes_to_byte_level("\n"), "Ċ");
  EXPECT_EQ(text_internal::byte_level_to_bytes(spelled), all);
  EXPECT_FALSE(text_internal::byte_level_to_bytes("☃").has_value());
  EXPECT_FALSE(text_internal::byte_level_to_bytes(" ").has_value());  // a raw space is not in the alphabet
}

}  // namespace
}  // namespace petrel
