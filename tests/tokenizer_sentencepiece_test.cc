// The SentencePiece path (tokenizer.model, Llama 2 style) on a tiny model trained for these tests by
// scripts/tokenizer_make_sentencepiece_fixture.py; expected ids and decodes come from the Python
// sentencepiece library.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "petrel/text/tokenizer.h"
#include "petrel/text/utf8.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::data_dir;

std::filesystem::path sentencepiece_dir() { return data_dir() / "tokenizers" / "sentencepiece-tiny"; }

TEST(TokenizerSentencePieceTest, MatchesPythonSentencePiece) {
  auto tokenizer = Tokenizer::load(sentencepiece_dir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_STREQ(tokenizer->kind(), "sentencepiece");
  const auto expected =
      nlohmann::json::parse(*read_text_file(sentencepiece_dir() / "tokenizer_sp_expected.json"));
  EXPECT_EQ(tokenizer->vocab_size(), expected["vocab_size"].get<int32_t>());
  EXPECT_EQ(tokenizer->bos_id(), expected["bos_id"].get<int32_t>());
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int32_t>{expected["eos_id"].get<int32_t>()});
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    // Python's sentencepiece never looks for "<s>" in text; parse_special off does the same.
    EncodeOptions options;
    options.parse_special = false;
    auto ids = tokenizer->encode(text, options);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << text;
    auto decoded = tokenizer->decode(*ids);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>()) << text;
    // Streaming gives the same text, in valid UTF-8 pieces.
    StreamingDecoder stream(*tokenizer);
    std::string streamed;
    for (int32_t id : *ids) {
      auto piece = stream.push(id);
      ASSERT_TRUE(piece.ok());
      EXPECT_FALSE(utf8::find_invalid(*piece).has_value());
      streamed += *piece;
    }
    EXPECT_EQ(streamed + stream.flush(), *decoded);
  }
}

TEST(TokenizerSentencePieceTest, SpecialTokensAndBos) {
  auto tokenizer = Tokenizer::from_sentencepiece(sentencepiece_dir() / "tokenizer.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  const int32_t bos = *tokenizer->bos_id();
  EXPECT_TRUE(tokenizer->is_special(bos));
  EXPECT_EQ(tokenizer->token_to_id("<s>"), bos);
  EXPECT_EQ(tokenizer->id_to_token(bos), "<s>");
  EncodeOptions options;
  options.add_special = true;
  auto ids = tokenizer->encode("Hello", options);
  ASSERT_TRUE(ids.ok());
  ASSERT_FALSE(ids->empty());
  EXPECT_EQ(ids->front(), bos);
  // "<s>" written in the text is the control token unless it is untrusted.
  auto parsed = tokenizer->encode("<s>Hello");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->front(), bos);
  options.add_special = false;
  options.untrusted_ranges = {{0, 3}};
  auto untrusted = tokenizer->encode("<s>Hello", options);
  ASSERT_TRUE(untrusted.ok());
  EXPECT_EQ(std::count(untrusted->begin(), untrusted->end(), bos), 0);
  EXPECT_EQ(*tokenizer->decode(*untrusted), "<s>Hello");
  EXPECT_EQ(*tokenizer->decode(*parsed, /*skip_special=*/true), "Hello");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{tokenizer->vocab_size()}).status().code(), ErrorCode::kOutOfRange);
}

TEST(TokenizerSentencePieceTest, RejectsCorruptModel) {
  testing::TempDir dir("tokenizer_sentencepiece");
  ASSERT_TRUE(write_file_atomic(dir / "tokenizer.model", "this is not a protobuf").ok());
  auto tokenizer = Tokenizer::load(dir.path());
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), ErrorCode::kInvalidData);
  EXPECT_NE(tokenizer.status().message().find("tokenizer.model"), std::string::npos) << tokenizer.status().message();
  EXPECT_EQ(Tokenizer::from_sentencepiece(dir / "missing.model").status().code(), ErrorCode::kNotFound);
}

TEST(TokenizerSentencePieceTest, FallsBackFromUnsupportedTokenizerJson) {
  // A Llama 2 checkpoint has both files; its tokenizer.json (byte_fallback BPE) is refused, so the
  // SentencePiece model is used.
  testing::TempDir dir("tokenizer_sentencepiece_fallback");
  std::filesystem::copy_file(sentencepiece_dir() / "tokenizer.model", dir / "tokenizer.model");
  ASSERT_TRUE(write_file_atomic(dir / "tokenizer.json",
                                R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []}})")
                  .ok());
  auto tokenizer = Tokenizer::load(dir.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_STREQ(tokenizer->kind(), "sentencepiece");
}

}  // namespace
}  // namespace petrel
