// JSON mode: the byte automaton against nlohmann::json's parser (an independent strict RFC 8259 parser) on
// hand-picked and random texts, and constrained generation on tiny-llama31 giving answers that parse.
#include "petrel/runtime/json_constraint.h"
#include "petrel/runtime/json_schema.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/runtime/session.h"
#include "test_util.h"

namespace petrel {
namespace {

bool accepts_whole(const std::string& text) {
  JsonPrefix p;
  for (unsigned char c : text) {
    if (!p.feed(c)) return false;
  }
  return p.complete();
}

// What the automaton is meant to accept: a strict parser's verdict, for texts within its model limits,
// whose top-level value is an object and which end with it.
bool reference_accepts(const std::string& text) {
  if (!nlohmann::json::accept(text)) return false;
  // The automaton's whitespace limit: in valid JSON every raw line break is structural whitespace, and a run of
  // whitespace may hold one (\r\n counting as one).
  for (size_t i = 0, breaks = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (c == '\r' || (c == '\n' && (i == 0 || text[i - 1] != '\r'))) ++breaks;
      if (breaks > 1) return false;
    } else {
      breaks = 0;
    }
  }
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') return false;
  const char last = text.back();
  return last != ' ' && last != '\t' && last != '\r' && last != '\n';
}

TEST(JsonPrefix, AcceptsObjectsAndEveryPrefixOfThem) {
  const std::vector<std::string> valid = {
      "{}", "{\"a\":1}", " {\"a\": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null]}",
      "{\"nested\": {\"x\": [[], {}, [{}], \"s\"]}, \"k\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}",
      "{\"emoji\": \"\\ud83d\\ude00\", \"utf8\": \"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"}",
      "{\"a\":\n\t{\"b\" : -0.0e-0}}", "{\"\": \"\", \"\x7F\": 1}"};
  for (const std::string& text : valid) {
    ASSERT_TRUE(reference_accepts(text)) << text;
    JsonPrefix p;
    for (size_t i = 0; i < text.size(); ++i) {
      EXPECT_FALSE(p.complete()) << text << " complete after " << i << " bytes";
      ASSERT_TRUE(p.feed(static_cast<unsigned char>(text[i]))) << text << " rejected at byte " << i;
    }
    EXPECT_TRUE(p.complete()) << text;
    EXPECT_FALSE(p.feed(' ')) << "nothing may follow the object";
  }
}

TEST(JsonPrefix, RejectsWhatAStrictParserRejects) {
  const std::vector<std::string> invalid = {
      "[1]", "\"s\"", "1", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}", "{\"a\":.5}", "{\"a\":1e}", "{\"a\":tru}",
      "{\"a\" 1}", "{,}", "{\"a\":1,}", "{\"a\":[1,]}", "{'a':1}", "{\"a\":\"\x01\"}", "{\"a\":\"\\ud800\"}",
      "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud800\\u0041\"}", "{\"a\":\"\xC0\x80\"}", "{\"a\":\"\xED\xA0\x80\"}",
      "{\"a\":\"\xF4\x90\x80\x80\"}", "{\"a\":\"\xE2\x82\"}", "{\"a\":\"\\x\"}", "{\"a\":+1}", "{\"a\":NaN}",
      "{\"a\":1}}", "{\"a\":[}", "{\"a\":1]"};
  for (const std::string& text : invalid) {
    EXPECT_FALSE(reference_accepts(text)) << text;
    EXPECT_FALSE(accepts_whole(text)) << text;
  }
  // The two limits a model needs: whitespace runs and depth.
  EXPECT_FALSE(accepts_whole("{" + std::string(JsonPrefix::kMaxWhitespaceRun + 1, ' ') + "}"));
  EXPECT_TRUE(accepts_whole("{" + std::string(JsonPrefix::kMaxWhitespaceRun, ' ') + "}"));
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_FALSE(JsonPrefix().feed(deep + "[")) << "deeper than kMaxDepth";
}

// Random texts from JSON-ish fragments: the automaton's verdict equals the strict parser's.
TEST(JsonPrefix, AgreesWithAStrictParserOnRandomTexts) {
  const std::vector<std::string> pieces = {
      "{", "}", "[", "]", "\"", "\"a\"", ":", ",", " ", "\n", "0", "1", "9", "-", ".", "e", "E", "+", "true", "fals",
      "e", "null", "\\", "\\n", "\\u", "00e9", "d83d", "\\ude00", "\xC3\xA9", "\xE2\x82\xAC", "\x80", "\xC3", "\x01",
      "{\"k\":", "[1,2]", "\"x\":\"y\"", "tru", "nul", "\\\"", "/", "A"};
  std::mt19937 rng(20261205);
  int agree_valid = 0, agree_invalid = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 14);
    if (rng() % 2) text = "{";
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    if (std::count(text.begin(), text.end(), '{') + std::count(text.begin(), text.end(), '[') > JsonPrefix::kMaxDepth) continue;
    const bool expected = reference_accepts(text);
    ASSERT_EQ(accepts_whole(text), expected) << text;
    (expected ? agree_valid : agree_invalid)++;
  }
  EXPECT_GT(agree_valid, 100) << "the random texts should hold some valid objects";
  std::printf("[ json ] %d valid and %d invalid random texts judged as nlohmann::json judges them\n", agree_valid, agree_invalid);
}

// Random valid objects (random trees, random whitespace), each then changed at one place: the near-misses where
// an automaton goes wrong. The verdicts again equal the strict parser's.
TEST(JsonPrefix, AgreesWithAStrictParserOnMutatedObjects) {
  std::mt19937 rng(5);
  const std::vector<std::string> scalars = {"0", "-1", "2.5", "-0.5e-3", "1E+2", "true", "false", "null", "\"\"", "\"a b\"",
                                            "\"\\u00e9\\n\"", "\"\xC3\xA9\"", "\"\\ud83d\\ude00\""};
  const std::vector<std::string> edits = {"", "{", "}", "[", "]", ",", ":", "\"", "\\", "0", "-", ".", "e", " ", "\x80",
                                          "\xC3", "\x01", "t", "\\u", "d800"};
  auto ws = [&]() -> std::string { return rng() % 3 ? "" : rng() % 2 ? " " : "\n  "; };
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    const unsigned kind = depth > 4 ? 2 : rng() % 3;
    if (kind == 2) return scalars[rng() % scalars.size()];
    const bool object = kind == 0;
    std::string out(1, object ? '{' : '[');
    const int n = static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      if (i) out += ws() + "," + ws();
      if (object) out += "\"k" + std::to_string(i) + "\"" + ws() + ":" + ws();
      out += value(depth + 1);
    }
    return out + ws() + (object ? '}' : ']');
  };
  int valid = 0, invalid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text = "{\"v\":" + value(1) + "}";
    ASSERT_TRUE(reference_accepts(text)) << text;
    ASSERT_TRUE(accepts_whole(text)) << text;
    const size_t at = rng() % text.size();
    const size_t cut = rng() % 2;  // replace one byte, or insert before it
    text = text.substr(0, at) + edits[rng() % edits.size()] + text.substr(at + cut);
    if (text.empty()) continue;
    const bool expected = reference_accepts(text);
    ASSERT_EQ(accepts_whole(text), expected) << text;
    (expected ? valid : invalid)++;
  }
  std::printf("[ json ] %d valid and %d invalid mutated objects judged as nlohmann::json judges them\n", valid, invalid);
}

// A forced tool call's shape: a name from the list, the arguments key, an object, the format's close.
TEST(CallShape, AcceptsTheToolsCallsAndNothingElse) {
  CallShapeSpec spec{{"get_weather", "get_time", "search", "get"}, {}, "\", \"arguments\": ", "}]</TOOLCALL>", false};
  std::sort(spec.names.begin(), spec.names.end());
  spec.arguments.assign(spec.names.size(), JsonSchema::any_object());
  auto accepts = [&](const std::string& text) {
    CallShape shape(&spec);
    return shape.feed(text) && shape.complete();
  };
  EXPECT_TRUE(accepts("get_time\", \"arguments\": {}}]</TOOLCALL>"));
  EXPECT_TRUE(accepts("get\", \"arguments\": {\"q\": [1, \"x\"]}}]</TOOLCALL>"));
  EXPECT_TRUE(accepts("search\", \"arguments\": {\"q\": \"a\\\"b\"}}]</TOOLCALL>"));
  EXPECT_FALSE(accepts("get_tim\", \"arguments\": {}}]</TOOLCALL>")) << "not a tool's name";
  EXPECT_FALSE(accepts("fetch\", \"arguments\": {}}]</TOOLCALL>"));
  EXPECT_FALSE(accepts("search\", \"parameters\": {}}]</TOOLCALL>"));
  EXPECT_FALSE(accepts("search\", \"arguments\": [1]}]</TOOLCALL>")) << "arguments are an object";
  EXPECT_FALSE(accepts("search\", \"arguments\": {}}]</TOOLCALL> more"));
  CallShape partial(&spec);
  EXPECT_TRUE(partial.feed(std::string("get")));
  EXPECT_FALSE(partial.complete());
  EXPECT_FALSE(partial.feed('x'));
  EXPECT_TRUE(partial.feed('_'));
  CallShapeSpec named{{"get_weather"}, {JsonSchema::any_object()}, "\", \"parameters\": ", "}", true};
  CallShape args(&named);
  EXPECT_TRUE(args.feed(std::string("{\"city\": \"Paris\"}}")));
  EXPECT_TRUE(args.complete());
}

// Random walks through the mask over tiny-llama31's vocabulary, logits random with a pull toward tokens that close
// things: every walk is a prefix of a JSON object at every step, and one that ends (an end token, allowed only
// once the object is complete) is an object by nlohmann::json.
TEST(JsonObjectConstraint, RandomWalksThroughTheMaskAreJsonObjects) {
  auto engine = testing::tiny_engine();
  ASSERT_NE(engine, nullptr);
  auto table = JsonTokenTable::build(*engine->tokenizer(), static_cast<int32_t>(engine->model().config().vocab_size));
  const std::vector<int32_t> ends = engine->model().config().eos_token_ids;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> noise(0.0f, 4.0f);
  int completed = 0;
  for (int walk = 0; walk < 200; ++walk) {
    JsonObjectConstraint constraint(table, ends);
    std::string text;
    bool ended = false;
    for (int step = 0; step < 300 && !ended; ++step) {
      std::vector<float> logits(static_cast<size_t>(table->size()));
      for (int32_t id = 0; id < table->size(); ++id) {
        const std::string_view b = table->bytes(id);
        const bool closes = b.find_first_of("}]\",") != std::string_view::npos;
        logits[static_cast<size_t>(id)] = noise(rng) + (closes ? 3.0f : 0.0f);
      }
      for (int32_t id : ends) logits[static_cast<size_t>(id)] = 10.0f;  // always wanted: allowed only at the end
      constraint.mask(logits);
      const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_GT(logits[static_cast<size_t>(token)], -1e30f) << "the mask left nothing after " << text;
      if (std::find(ends.begin(), ends.end(), token) != ends.end()) {
        ASSERT_TRUE(constraint.complete()) << "an end token before the object closed: " << text;
        ended = true;
        break;
      }
      constraint.accept(token);
      text += table->bytes(token);
      JsonPrefix check;
      ASSERT_TRUE(check.feed(text)) << "not a prefix of an object: " << text;
    }
    if (ended) {
      ++completed;
      const auto parsed = nlohmann::json::parse(text, nullptr, false);
      ASSERT_TRUE(parsed.is_object()) << text;
    }
  }
  std::printf("[ json ] %d of 200 random walks closed their object\n", completed);
  EXPECT_GT(completed, 100);
}

// Logits that depend only on the position and the last token, from no model: a backend that reports
// computes_on_device() as asked, so that the decoding loop's side thread (which prepares the constraint's mask
// during the step) runs without a GPU and without sharing the thread pool with a CPU forward pass.
class FakeForward final : public ForwardPass {
 public:
  FakeForward(int64_t vocab, bool on_device, bool masks = false) : on_device_(on_device), masks_(masks) {
    config_.vocab_size = vocab;
  }
  const LlamaConfig& config() const override { return config_; }
  int64_t position() const override { return position_; }
  int64_t context_length() const override { return 4096; }
  Status prompt(std::span<const int32_t> tokens, int64_t, LogitsMode, std::vector<float>* logits) override {
    position_ += static_cast<int64_t>(tokens.size());
    fill(tokens.back(), logits);
    return ok_status();
  }
  Status step(int32_t token, std::vector<float>* logits) override {
    ++position_;
    fill(token, logits);
    return ok_status();
  }
  void truncate(int64_t n) override { position_ = std::min(position_, n); }
  void reset() override { position_ = 0; }
  bool computes_on_device() const override { return on_device_; }
  // What CudaModel::decode_top_masked does, on the host: the constraint's bits, the masked logits' k largest
  // (value descending, id ascending among equals).
  int max_top_k() const override { return masks_ ? 64 : 0; }
  bool masks_on_device() const override { return masks_; }
  Status step_top_masked(int32_t token, int k, LogitConstraint& constraint, TopLogits* top) override {
    std::vector<float> logits;
    PETREL_RETURN_IF_ERROR(step(token, &logits));
    std::vector<uint32_t> bits(static_cast<size_t>((config_.vocab_size + 31) / 32), 0xFFFFFFFFu);
    constraint.write_bits(bits);
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!((bits[i / 32] >> (i % 32)) & 1u)) logits[i] = -std::numeric_limits<float>::infinity();
      ids[i] = static_cast<int32_t>(i);
    }
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    top->all.clear();
    top->ids.assign(ids.begin(), ids.begin() + k);
    top->values.clear();
    for (int32_t id : top->ids) top->values.push_back(logits[static_cast<size_t>(id)]);
    ++masked_steps;
    return ok_status();
  }
  int masked_steps = 0;

 private:
  void fill(int32_t token, std::vector<float>* logits) const {
    std::mt19937 rng(static_cast<uint32_t>(position_ * 131071 + token));
    std::uniform_real_distribution<float> u(0.0f, 8.0f);
    logits->resize(static_cast<size_t>(config_.vocab_size));
    for (float& v : *logits) v = u(rng);
  }
  LlamaConfig config_;
  bool on_device_, masks_;
  int64_t position_ = 0;
};

// A mask prepared ahead (LogitConstraint::prepare, on the decoding loop's side thread when the backend computes
// on a device) is the mask computed when the logits arrive: the same logits at every step of a random walk, and
// the same tokens from the decoding loop with and without the side thread.
TEST(JsonObjectConstraint, APreparedMaskIsTheMaskComputedAtOnce) {
  auto engine = testing::tiny_engine();
  ASSERT_NE(engine, nullptr);
  const int64_t vocab = engine->model().config().vocab_size;
  auto table = JsonTokenTable::build(*engine->tokenizer(), static_cast<int32_t>(vocab));
  const std::vector<int32_t> ends = engine->model().config().eos_token_ids;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> noise(0.0f, 4.0f);
  JsonObjectConstraint ahead(table, ends), at_once(table, ends);
  for (int step = 0; step < 120; ++step) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& v : logits) v = noise(rng);
    std::vector<float> other = logits;
    ahead.prepare();
    ahead.prepare();  // idempotent until the state moves
    ahead.mask(logits);
    at_once.mask(other);
    ASSERT_EQ(logits, other) << "step " << step;
    const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (std::find(ends.begin(), ends.end(), token) != ends.end()) break;
    ahead.accept(token);
    at_once.accept(token);
  }
  std::vector<std::vector<int32_t>> answers;
  for (bool on_device : {false, true}) {
    FakeForward forward(vocab, on_device);
    JsonObjectConstraint constraint(table, ends);
    GenerateOptions options;
    options.sampler.temperature = 1.0f;
    options.sampler.seed = 7;
    options.max_new_tokens = 60;  // no stop ids: once the object closes, end tokens until the limit
    options.constraint = &constraint;
    std::vector<int32_t> history;
    const std::vector<int32_t> prompt = {128000, 9906};
    auto result = continue_generation(forward, history, prompt, options, nullptr);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    answers.push_back(result->tokens);
  }
  EXPECT_EQ(answers[0], answers[1]);
  EXPECT_EQ(answers[0].size(), 60u);
}

// A mask applied where the logits are (ForwardPass::step_top_masked, the constraint's write_bits) picks what the
// host's mask picks: the same greedy and top-k answers from the decoding loop, for JSON mode and a schema.
TEST(JsonObjectConstraint, AMaskAppliedByTheBackendPicksWhatTheHostsMaskPicks) {
  auto engine = testing::tiny_engine();
  ASSERT_NE(engine, nullptr);
  const int64_t vocab = engine->model().config().vocab_size;
  auto table = JsonTokenTable::build(*engine->tokenizer(), static_cast<int32_t>(vocab));
  const std::vector<int32_t> ends = engine->model().config().eos_token_ids;
  auto schema = JsonSchema::compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}})"));
  ASSERT_TRUE(schema.ok());
  for (int top_k : {0, 5}) {  // 0: greedy
    for (bool with_schema : {false, true}) {
      SCOPED_TRACE(std::string(with_schema ? "schema" : "json_object") + " top_k " + std::to_string(top_k));
      std::vector<std::vector<int32_t>> answers;
      for (bool masks : {false, true}) {
        FakeForward forward(vocab, true, masks);
        std::unique_ptr<LogitConstraint> constraint;
        if (with_schema) constraint = std::make_unique<JsonSchemaConstraint>(table, *schema, ends);
        else constraint = std::make_unique<JsonObjectConstraint>(table, ends);
        GenerateOptions options;
        if (top_k == 0) {
          options.sampler.greedy = true;
        } else {
          options.sampler.temperature = 1.0f;
          options.sampler.top_k = top_k;
          options.sampler.top_p = 1.0f;
          options.sampler.seed = 3;
        }
        options.max_new_tokens = 60;
        options.constraint = constraint.get();
        std::vector<int32_t> history;
        const std::vector<int32_t> prompt = {128000, 9906};
        auto result = continue_generation(forward, history, prompt, options, nullptr);
        ASSERT_TRUE(result.ok()) << result.status().to_string();
        EXPECT_EQ(forward.masked_steps, masks ? 59 : 0);
        answers.push_back(result->tokens);
      }
      EXPECT_EQ(answers[0], answers[1]);
    }
  }
}

// Constrained sampling on tiny-llama31 (a story model that never writes JSON by itself): every answer that ends
// is a JSON object; one cut off by max_tokens is a prefix of one.
TEST(JsonObjectConstraint, SampledAnswersAreJsonObjects) {
  auto engine = testing::tiny_engine();
  ASSERT_NE(engine, nullptr);
  auto table = JsonTokenTable::build(*engine->tokenizer(), static_cast<int32_t>(engine->model().config().vocab_size));
  int finished = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto session = Session::create(engine, 512);
    ASSERT_TRUE(session.ok());
    JsonObjectConstraint constraint(table, engine->model().config().eos_token_ids);
    GenerationConfig config;
    config.sampler.temperature = 1.0f;
    config.sampler.seed = seed;
    config.max_new_tokens = 80;
    config.constraint = &constraint;
    const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Give me a JSON object."}}};
    auto result = (*session)->query(messages, config);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    if (result->reason == StopReason::kEndOfSequence) {
      ++finished;
      EXPECT_TRUE(constraint.complete());
      auto parsed = nlohmann::json::parse(result->text, nullptr, false);
      ASSERT_FALSE(parsed.is_discarded()) << result->text;
      EXPECT_TRUE(parsed.is_object()) << result->text;
    } else {
      JsonPrefix p;
      EXPECT_TRUE(p.feed(result->text)) << result->text;
    }
  }
  std::printf("[ json ] %d of 6 sampled answers closed their object within 80 tokens\n", finished);
}

}  // namespace
}  // namespace petrel
