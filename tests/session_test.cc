// The runtime API: Engine + Session against the plain generate() path and each other.
#include "petrel/runtime/session.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "petrel/runtime/generate.h"
#include "petrel/runtime/stop_strings.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::data_dir;
using testing::tiny_engine;

GenerationConfig greedy(int64_t n) {
  GenerationConfig c;
  c.sampler = SamplerConfig::greedy_config();
  c.max_new_tokens = n;
  c.stop_token_ids = std::vector<int32_t>{};  // run to max_new_tokens
  return c;
}

const std::vector<int32_t> kPrompt = {4080, 424, 1413, 276, 289, 311, 3585, 303};

// The tokenizer loads on a thread of its own beside the weights: it is there when load returns, the phases are
// timed, and a model without a tokenizer (token-only use) or a missing model still come back cleanly.
TEST(Engine, LoadsTheTokenizerBesideTheWeightsAndTimesThePhases) {
  auto engine = Engine::load(data_dir() / "models/tiny-llama31");
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_NE((*engine)->tokenizer(), nullptr);
  const EngineLoadTimes& t = (*engine)->load_times();
  EXPECT_GT(t.weights_ms, 0.0);
  EXPECT_GT(t.text_ms, 0.0);
  EXPECT_GE(t.total_ms, t.weights_ms);
  EXPECT_EQ(t.gpu_ms, 0.0);  // the CPU backend
  auto text = (*engine)->tokenizer()->encode("Hello", {});
  EXPECT_TRUE(text.ok());

  testing::TempDir dir("engine_no_tokenizer");
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(data_dir() / "models/tiny-llama31" / name, dir / name);
  }
  auto bare = Engine::load(dir.path());
  ASSERT_TRUE(bare.ok()) << bare.status().to_string();
  EXPECT_EQ((*bare)->tokenizer(), nullptr);
  EXPECT_FALSE(Engine::load(dir / "missing").ok());
}

TEST(Session, TokensQueryEqualsPlainGeneration) {
  auto engine = tiny_engine();
  Session session(engine, 512);
  auto result = session.query_tokens(kPrompt, greedy(20));
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  GenerateOptions options;
  options.max_new_tokens = 20;
  options.sampler = SamplerConfig::greedy_config();
  auto expected = generate(engine->model(), kPrompt, options);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(result->tokens, *expected);
  EXPECT_EQ(result->reason, StopReason::kMaxTokens);
  EXPECT_EQ(result->stats.prompt_tokens, 8);
  EXPECT_EQ(result->stats.generated_tokens, 20);
  EXPECT_EQ(session.position(), 8 + 19);  // the last sampled token is not fed yet
  EXPECT_FALSE(result->text.empty());
}

TEST(Session, SecondTurnReusesTheCachedConversation) {
  auto engine = tiny_engine();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", "Tell me about the city."}});
  Session session(engine, 1024);
  auto first = session.query(messages, greedy(12));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  messages.push_back({{"role", "assistant"}, {"content", first->text}});
  messages.push_back({{"role", "user"}, {"content", "And the king?"}});
  auto second = session.query(messages, greedy(12));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_GT(second->stats.reused_tokens, 40);  // the system header and the first turn
  // The same conversation in a fresh session gives the same answer.
  Session fresh(engine, 1024);
  auto again = fresh.query(messages, greedy(12));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stats.reused_tokens, 0);
  EXPECT_EQ(second->tokens, again->tokens);
}

TEST(Session, AbortFromAnotherThreadStopsGeneration) {
  auto engine = tiny_engine();
  Session session(engine, 2048);
  int seen = 0;
  auto result = session.query_tokens(kPrompt, greedy(1000), [&](int32_t, std::string_view) {
    if (++seen == 5) std::thread([&] { session.abort(); }).join();
    return true;
  });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->reason, StopReason::kAborted);
  EXPECT_EQ(result->tokens.size(), 5u);
}

TEST(Session, StopStringEndsGenerationAndIsNotEmitted) {
  auto engine = tiny_engine();
  Session probe(engine, 512);
  auto full = probe.query_tokens(kPrompt, greedy(24));
  ASSERT_TRUE(full.ok());
  ASSERT_GT(full->text.size(), 12u);
  const std::string stop = full->text.substr(6, 4);
  Session session(engine, 512);
  GenerationConfig config = greedy(24);
  config.stop_strings = {stop};
  auto result = session.query_tokens(kPrompt, config);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->reason, StopReason::kStopString);
  EXPECT_EQ(result->text, full->text.substr(0, full->text.find(stop)));
}

TEST(StopStringFilter, HoldsBackPartialMatchesAcrossPieces) {
  StopStringFilter f({"<END>"});
  bool stopped = false;
  EXPECT_EQ(f.push("abc<E", &stopped), "abc");
  EXPECT_EQ(f.push("N", &stopped), "");
  EXPECT_EQ(f.push("x", &stopped), "<ENx");
  EXPECT_EQ(f.push("yy<END>zz", &stopped), "yy");
  EXPECT_TRUE(stopped);
}

TEST(Session, SaveAndRestoreContinueIdentically) {
  auto engine = tiny_engine();
  testing::TempDir dir("session_kv");
  Session a(engine, 512);
  ASSERT_TRUE(a.query_tokens(kPrompt, greedy(6)).ok());
  ASSERT_TRUE(a.save(dir / "state.kv").ok());
  std::vector<int32_t> more = {424, 1413};
  auto continued = a.query_tokens(more, greedy(10));
  Session b(engine, 512);
  ASSERT_TRUE(b.restore(dir / "state.kv").ok());
  EXPECT_EQ(b.position(), 8 + 5);
  auto restored = b.query_tokens(more, greedy(10));
  ASSERT_TRUE(continued.ok() && restored.ok());
  EXPECT_EQ(continued->tokens, restored->tokens);
  // A truncated state file is refused, and the session is untouched.
  auto bytes = read_text_file(dir / "state.kv");
  ASSERT_TRUE(bytes.ok());
  std::ofstream(dir / "cut.kv", std::ios::binary) << bytes->substr(0, bytes->size() - 100);
  Session c(engine, 512);
  Status s = c.restore(dir / "cut.kv");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  EXPECT_EQ(c.position(), 0);
}

TEST(Session, SaveAndRestoreCarryQ8ScalesAndRefuseAnotherKvType) {
  auto engine = tiny_engine();
  testing::TempDir dir("session_kv_q8");
  Session a(engine, 512, KvType::kQ8);
  ASSERT_TRUE(a.query_tokens(kPrompt, greedy(6)).ok());
  ASSERT_TRUE(a.save(dir / "q8.kv").ok());
  std::vector<int32_t> more = {424, 1413};
  auto continued = a.query_tokens(more, greedy(10));
  Session b(engine, 512, KvType::kQ8);
  ASSERT_TRUE(b.restore(dir / "q8.kv").ok());
  EXPECT_EQ(b.history().size(), 8u + 5u);
  auto restored = b.query_tokens(more, greedy(10));
  ASSERT_TRUE(continued.ok() && restored.ok());
  EXPECT_EQ(continued->tokens, restored->tokens);  // the rows' scales came back too
  // An f16 session refuses the q8 state, naming both types, and stays as it was.
  Session c(engine, 512);
  ASSERT_TRUE(c.query_tokens(kPrompt, greedy(2)).ok());
  const int64_t before = c.position();
  Status s = c.restore(dir / "q8.kv");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("q8"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("f16"), std::string::npos) << s.message();
  EXPECT_EQ(c.position(), before);
  EXPECT_EQ(c.history().size(), static_cast<size_t>(before));
}

TEST(Session, PromptOverTheContextIsRefusedWithoutChangingTheSession) {
  auto engine = tiny_engine();
  Session session(engine, 16);
  ASSERT_TRUE(session.query_tokens(kPrompt, greedy(2)).ok());
  const int64_t before = session.position();
  std::vector<int32_t> long_prompt(20, 424);
  auto result = session.query_tokens(long_prompt, greedy(2));
  EXPECT_EQ(result.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(result.status().message().find("Context Size was exceeded"), std::string::npos);
  EXPECT_EQ(session.position(), before);
}

}  // namespace
}  // namespace petrel
