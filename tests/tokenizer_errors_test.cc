// Byte-level BPE from synthetic tokenizer.json files (split behaviors, ignore_merges, merge spellings,
// ByteLevel prefix space; expected ids from Hugging Face tokenizers 0.23.3 on the same JSON), and the
// refusals: malformed JSON, a missing model, merges naming unknown tokens, unsupported components.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "petrel/text/bpe_model.h"
#include "petrel/text/tokenizer.h"
#include "test_util.h"

namespace petrel {
namespace {

using Json = nlohmann::json;
using testing::data_dir;

// A byte-level BPE whose ids 0..255 are the bytes themselves, plus "a " (256), " b" (257), "  " (258),
// "abc" (259) and "bc" (260), and a pre-tokenizer that leaves the text whole unless a test sets one.
Json synthetic_tokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[text_internal::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  }
  vocab["aĠ"] = 256;
  vocab["Ġb"] = 257;
  vocab["ĠĠ"] = 258;
  vocab["abc"] = 259;
  vocab["bc"] = 260;
  Json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", Json::array({Json::array({"a", "Ġ"}), Json::array({"Ġ", "b"}), Json::array({"Ġ", "Ġ"}),
                                Json::array({"b", "c"})})}}},
  };
  return tokenizer;
}

std::vector<int32_t> encode_with(const Json& tokenizer_json, const std::string& text) {
  auto tokenizer = Tokenizer::from_json(tokenizer_json.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  if (!tokenizer.ok()) return {};
  auto ids = tokenizer->encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  if (!ids.ok()) return {};
  EXPECT_EQ(*tokenizer->decode(*ids), text) << "round trip";
  return *ids;
}

Json split_on_space(const std::string& behavior, bool invert) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           Json::array({{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", behavior}, {"invert", invert}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

TEST(BpeSyntheticTest, SplitBehaviorsMatchHuggingFace) {
  struct Case {
    const char* behavior;
    bool invert;
    std::vector<int32_t> expected;  // for "a  b"
  };
  const Case cases[] = {
      {"Isolated", false, {97, 32, 32, 98}},         {"Isolated", true, {97, 32, 32, 98}},
      {"MergedWithPrevious", false, {256, 32, 98}},  {"MergedWithPrevious", true, {97, 32, 257}},
      {"MergedWithNext", false, {97, 32, 257}},      {"MergedWithNext", true, {256, 32, 98}},
      {"Contiguous", false, {97, 258, 98}},          {"Contiguous", true, {97, 258, 98}},
  };
  for (const Case& c : cases) {
    Json tokenizer = synthetic_tokenizer();
    tokenizer["pre_tokenizer"] = split_on_space(c.behavior, c.invert);
    EXPECT_EQ(encode_with(tokenizer, "a  b"), c.expected) << c.behavior << " invert=" << c.invert;
  }
  // Removed drops text, so it cannot round-trip; check the ids only.
  Json tokenizer = synthetic_tokenizer();
  tokenizer["pre_tokenizer"] = split_on_space("Removed", false);
  EXPECT_EQ(*Tokenizer::from_json(tokenizer.dump())->encode("a  b"), (std::vector<int32_t>{97, 98}));
  tokenizer["pre_tokenizer"] = split_on_space("Removed", true);
  EXPECT_EQ(*Tokenizer::from_json(tokenizer.dump())->encode(" a  b "), (std::vector<int32_t>{32, 32, 32, 32}));
}

TEST(BpeSyntheticTest, ByteLevelPrefixSpace) {
  Json tokenizer = synthetic_tokenizer();
  tokenizer["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto loaded = Tokenizer::from_json(tokenizer.dump());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(*loaded->encode("b a"), (std::vector<int32_t>{257, 32, 97}));
  EXPECT_EQ(*loaded->encode("<x>b"), (std::vector<int32_t>{32, 60, 120, 62, 98}));
}

TEST(BpeSyntheticTest, IgnoreMergesEmitsWholeTokens) {
  Json tokenizer = synthetic_tokenizer();
  EXPECT_EQ(encode_with(tokenizer, "abc"), (std::vector<int32_t>{97, 260}));
  tokenizer["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode_with(tokenizer, "abc"), (std::vector<int32_t>{259}));
  EXPECT_EQ(encode_with(tokenizer, "abcabc"), (std::vector<int32_t>{97, 260, 97, 260}));
}

TEST(BpeSyntheticTest, BothMergeSpellingsGiveTheSameIds) {
  // tiny-llama31 writes merges as ["a", "b"] pairs; the Llama 3.1 file as "a b" strings.
  const auto original = Json::parse(*read_text_file(data_dir() / "models" / "tiny-llama31" / "tokenizer.json"));
  Json as_strings = original;
  for (auto& merge : as_strings["model"]["merges"]) {
    merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  }
  auto a = Tokenizer::from_json(original.dump());
  auto b = Tokenizer::from_json(as_strings.dump());
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string text = read_text_file(data_dir() / "corpora" / "wiki.test.raw")->substr(0, 20000);
  EXPECT_EQ(*a->encode(text), *b->encode(text));
}

TEST(BpeSyntheticTest, MergeLoopsAgreeOnShortAndLongPieces) {
  // The same word repeated past the short-piece limit must merge exactly as the short copy does.
  Json tokenizer = synthetic_tokenizer();
  std::string longer;
  std::vector<int32_t> expected;
  for (int i = 0; i < 40; ++i) {
    longer += "a bc";
    for (int32_t id : {256, 260}) expected.push_back(id);
  }
  EXPECT_EQ(encode_with(tokenizer, longer), expected);
}

class TokenizerErrorsTest : public ::testing::Test {
 protected:
  static Json tiny() {
    return Json::parse(*read_text_file(data_dir() / "models" / "tiny-llama31" / "tokenizer.json"));
  }
  static Status load_error(const std::string& json_text) {
    auto tokenizer = Tokenizer::from_json(json_text, {}, "broken/tokenizer.json");
    EXPECT_FALSE(tokenizer.ok());
    return tokenizer.ok() ? Status() : tokenizer.status();
  }
  static void expect_error(const Status& status, ErrorCode code, std::initializer_list<std::string> parts) {
    EXPECT_EQ(status.code(), code) << status.to_string();
    for (const std::string& part : parts) {
      EXPECT_NE(status.message().find(part), std::string::npos) << "'" << part << "' not in: " << status.message();
    }
  }
};

TEST_F(TokenizerErrorsTest, TruncatedJson) {
  const std::string text = tiny().dump();
  expect_error(load_error(text.substr(0, text.size() / 2)), ErrorCode::kInvalidData,
               {"broken/tokenizer.json", "not valid JSON"});
  expect_error(load_error(""), ErrorCode::kInvalidData, {"not valid JSON"});
  expect_error(load_error("[1, 2]"), ErrorCode::kInvalidData, {"expected a JSON object"});
}

TEST_F(TokenizerErrorsTest, MissingModel) {
  Json j = tiny();
  j.erase("model");
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"broken/tokenizer.json", "model: missing"});
  j["model"] = {{"type", "BPE"}, {"merges", Json::array()}};
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"model.vocab"});
}

TEST_F(TokenizerErrorsTest, MergesReferencingUnknownTokens) {
  Json j = tiny();
  j["model"]["merges"].push_back(Json::array({"Ġ", "zzzz_unknown"}));
  const size_t index = j["model"]["merges"].size() - 1;
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData,
               {"model.merges[" + std::to_string(index) + "]", "zzzz_unknown", "not in model.vocab"});
  // Both parts known, but their concatenation is not a token.
  j = tiny();
  j["model"]["merges"].push_back(Json::array({"<", ">"}));
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"merged token", "\"<>\""});
  j = tiny();
  j["model"]["merges"].push_back("nospace");
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {R"(expected "left right")"});
}

TEST_F(TokenizerErrorsTest, UnsupportedComponents) {
  Json j = tiny();
  j["model"]["type"] = "WordPiece";
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"broken/tokenizer.json", "model.type", "WordPiece"});
  j = tiny();
  j["model"]["type"] = "Unigram";
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"model.type", "Unigram"});
  j = tiny();
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"pre_tokenizer.pretokenizers[0].type", "Whitespace"});
  j = tiny();
  j["normalizer"] = {{"type", "NFC"}};
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"normalizer.type", "NFC"});
  j = tiny();
  j["post_processor"] = {{"type", "SomethingNew"}};
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"post_processor.type"});
  j = tiny();
  j["model"]["byte_fallback"] = true;
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"model.byte_fallback", "tokenizer.model"});
  j = tiny();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"decoder.type"});
}

TEST_F(TokenizerErrorsTest, MalformedValues) {
  Json j = tiny();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"pre_tokenizer.pretokenizers[0].pattern", "regex"});
  j = tiny();
  j["model"]["vocab"]["Ġthe"] = "not a number";
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"model.vocab[\"Ġthe\"]", "token id"});
  j = tiny();
  j["model"]["vocab"]["not byte level ☃"] = 5000;
  expect_error(load_error(j.dump()), ErrorCode::kUnsupported, {"not a byte-level token"});
  j = tiny();
  j["added_tokens"][0]["id"] = -3;
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"added_tokens[0].id"});
  j = tiny();
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<|nowhere|>";
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"post_processor.single[0]", "<|nowhere|>"});
  j = tiny();
  j["model"]["vocab"].erase("Ā");  // the token of byte 0
  expect_error(load_error(j.dump()), ErrorCode::kInvalidData, {"no token for byte 0"});
}

TEST_F(TokenizerErrorsTest, LoadNamesTheFile) {
  testing::TempDir dir("tokenizer_errors");
  auto missing = Tokenizer::load(dir.path());
  ASSERT_FALSE(missing.ok());
  expect_error(missing.status(), ErrorCode::kNotFound, {"neither tokenizer.json nor tokenizer.model"});
  EXPECT_EQ(Tokenizer::load(dir / "no_such_dir").status().code(), ErrorCode::kNotFound);

  ASSERT_TRUE(write_file_atomic(dir / "tokenizer.json", "{\"model\": ").ok());
  auto truncated = Tokenizer::load(dir.path());
  ASSERT_FALSE(truncated.ok());
  expect_error(truncated.status(), ErrorCode::kInvalidData, {(dir / "tokenizer.json").string(), "not valid JSON"});

  ASSERT_TRUE(write_file_atomic(dir / "tokenizer.json", tiny().dump()).ok());
  ASSERT_TRUE(write_file_atomic(dir / "tokenizer_config.json", "{\"bos_token\": \"<|no_such|>\"}").ok());
  auto bad_config = Tokenizer::load(dir.path());
  ASSERT_FALSE(bad_config.ok());
  expect_error(bad_config.status(), ErrorCode::kInvalidData, {"tokenizer_config.json", "bos_token", "<|no_such|>"});
}

}  // namespace
}  // namespace petrel
