// The reasoning switch and the streaming reasoning/answer splitter (fed every possible chunking).
#include "petrel/text/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "petrel/text/chat_template.h"
#include "petrel/util/file.h"

namespace petrel::text {
namespace {

using nlohmann::ordered_json;

// ---------------------------------------------------------------- the switch

TEST(ReasoningSwitch, DetectsTheStyleFromTheTemplate) {
  auto nemotron = read_text_file(std::string(PETREL_TEST_DATA_DIR) +
                                 "/chat-templates/nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja");
  auto llama = read_text_file(std::string(PETREL_TEST_DATA_DIR) + "/chat-templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
  ASSERT_TRUE(nemotron.ok() && llama.ok());
  EXPECT_EQ(detect_reasoning_style(*nemotron), ReasoningStyle::kThinkFlag);
  EXPECT_EQ(detect_reasoning_style(*llama), ReasoningStyle::kNone);
  EXPECT_EQ(detect_reasoning_style("{% if 'detailed thinking' in x %}{% endif %}"), ReasoningStyle::kSystemPromptSwitch);
}

TEST(ReasoningSwitch, SystemPromptSwitchMovesTheCallersSystemText) {
  ordered_json messages = ordered_json::array({{{"role", "system"}, {"content", " Be brief. "}},
                                               {{"role", "user"}, {"content", "Why?"}}});
  ReasoningSwitch config{ReasoningMode::kOff, ReasoningStyle::kSystemPromptSwitch, true};
  auto applied = apply_reasoning_mode(messages, config);
  ASSERT_TRUE(applied.ok()) << applied.status().to_string();
  EXPECT_EQ(applied->messages[0]["content"], "detailed thinking off");
  EXPECT_EQ(applied->messages[1]["content"], "Be brief.\n\nWhy?");
  EXPECT_EQ(applied->assistant_prefill, "<think>\n</think>");

  config.mode = ReasoningMode::kOn;
  applied = apply_reasoning_mode(ordered_json::array({{{"role", "user"}, {"content", "Hi"}}}), config);
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(applied->messages.size(), 2u);
  EXPECT_EQ(applied->messages[0], (ordered_json{{"role", "system"}, {"content", "detailed thinking on"}}));
  EXPECT_EQ(applied->assistant_prefill, "");

  // No user message: the system text becomes one.
  applied = apply_reasoning_mode(ordered_json::array({{{"role", "system"}, {"content", "Rules."}}}), config);
  ASSERT_TRUE(applied.ok());
  ASSERT_EQ(applied->messages.size(), 2u);
  EXPECT_EQ(applied->messages[1], (ordered_json{{"role", "user"}, {"content", "Rules."}}));

  // An existing switch is replaced, not moved.
  applied = apply_reasoning_mode(ordered_json::array({{{"role", "system"}, {"content", "detailed thinking off"}},
                                                      {{"role", "user"}, {"content", "x"}}}),
                                 config);
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(applied->messages[0]["content"], "detailed thinking on");
  EXPECT_EQ(applied->messages[1]["content"], "x");
}

TEST(ReasoningSwitch, ThinkFlagRendersThroughNemotronSuper) {
  auto source = read_text_file(std::string(PETREL_TEST_DATA_DIR) +
                               "/chat-templates/nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja");
  ASSERT_TRUE(source.ok());
  auto tpl = ChatTemplate::parse(*source, "nemotron");
  ASSERT_TRUE(tpl.ok());
  ordered_json messages = ordered_json::array({{{"role", "system"}, {"content", "Be nice. /think"}},
                                               {{"role", "user"}, {"content", "Hi"}}});
  auto off = apply_reasoning_mode(messages, {ReasoningMode::kOff, ReasoningStyle::kThinkFlag, false});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->messages[0]["content"], "Be nice. /no_think");
  auto rendered = tpl->render(off->messages, nullptr, true, ordered_json::object());
  ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
  EXPECT_NE(rendered->text.find("system<|end_header_id|>\n\nBe nice.\n\n"), std::string::npos) << rendered->text;
  EXPECT_TRUE(rendered->text.ends_with("assistant<|end_header_id|>\n\n<think>\n\n</think>\n\n")) << rendered->text;

  auto on = apply_reasoning_mode(ordered_json::array({{{"role", "user"}, {"content", "Hi"}}}),
                                 {ReasoningMode::kOn, ReasoningStyle::kThinkFlag, false});
  ASSERT_TRUE(on.ok());
  EXPECT_EQ(on->messages[0], (ordered_json{{"role", "system"}, {"content", "/think"}}));
  rendered = tpl->render(on->messages, nullptr, true, ordered_json::object());
  ASSERT_TRUE(rendered.ok());
  EXPECT_TRUE(rendered->text.ends_with("assistant<|end_header_id|>\n\n")) << rendered->text;
}

TEST(ReasoningSwitch, RefusesWhatItCannotDo) {
  ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(apply_reasoning_mode(messages, {ReasoningMode::kOn, ReasoningStyle::kNone, false}).status().code(),
            ErrorCode::kUnsupported);
  auto unchanged = apply_reasoning_mode(messages, {ReasoningMode::kDefault, ReasoningStyle::kNone, false});
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(unchanged->messages, messages);
  ordered_json parts = ordered_json::array(
      {{{"role", "system"}, {"content", ordered_json::array({{{"type", "text"}, {"text", "x"}}})}}});
  EXPECT_EQ(apply_reasoning_mode(parts, {ReasoningMode::kOn, ReasoningStyle::kThinkFlag, false}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(parse_reasoning_mode("maybe").ok());
  EXPECT_EQ(*parse_reasoning_style("nemotron-v1"), ReasoningStyle::kSystemPromptSwitch);
}

// ---------------------------------------------------------------- the splitter

// Feeds `text` cut at the positions whose bits are set in `cuts` and returns the concatenated output.
ReasoningSplit feed_chunked(const std::string& text, uint64_t cuts, const ReasoningSplitter::Options& options) {
  ReasoningSplitter splitter(options);
  ReasoningSplit all;
  size_t start = 0;
  for (size_t i = 1; i <= text.size(); ++i) {
    bool cut_here = i == text.size() || ((cuts >> (i - 1)) & 1);
    if (!cut_here) continue;
    ReasoningSplit part = splitter.feed(std::string_view(text).substr(start, i - start));
    all.reasoning += part.reasoning;
    all.answer += part.answer;
    start = i;
  }
  ReasoningSplit rest = splitter.finish();
  all.reasoning += rest.reasoning;
  all.answer += rest.answer;
  return all;
}

struct SplitCase {
  std::string output;
  bool starts_in_reasoning;
  std::string reasoning;
  std::string answer;
};

TEST(ReasoningSplitter, EveryChunkingGivesTheSameSplit) {
  const std::vector<SplitCase> cases = {
      {"<think>ab</think>\n\nok", false, "ab", "ok"},
      {"\n<think>r\n</think> a", false, "r\n", "a"},
      {"plain answer", false, "", "plain answer"},
      {"  <thin", false, "", "  <thin"},          // never became a tag
      {"<think>x</thi", false, "x</thi", ""},      // unterminated reasoning
      {"r1 r2</think>\nans", true, "r1 r2", "ans"},  // the prompt pre-filled <think>
      {"</think>A<think>B", true, "", "A<think>B"},
      {"<think></think>", false, "", ""},
      {"é<think>ü</think>€", false, "", "é<think>ü</think>€"},
      {"<think>ü</think>\n€x", false, "ü", "€x"},
  };
  for (const SplitCase& c : cases) {
    SCOPED_TRACE(c.output);
    ReasoningSplitter::Options options;
    options.starts_in_reasoning = c.starts_in_reasoning;
    ReasoningSplit whole = split_reasoning(c.output, options);
    EXPECT_EQ(whole.reasoning, c.reasoning);
    EXPECT_EQ(whole.answer, c.answer);
    ASSERT_LE(c.output.size(), 22u);  // 2^21 chunkings at most
    const uint64_t chunkings = uint64_t{1} << (c.output.size() - 1);
    for (uint64_t cuts = 0; cuts < chunkings; ++cuts) {
      ReasoningSplit chunked = feed_chunked(c.output, cuts, options);
      if (chunked.reasoning != c.reasoning || chunked.answer != c.answer) {
        FAIL() << "chunking " << cuts << " gave reasoning '" << chunked.reasoning << "' answer '" << chunked.answer << "'";
      }
    }
  }
}

TEST(ReasoningSplitter, DeltasNeverSplitUtf8AndStreamEarly) {
  ReasoningSplitter splitter;
  std::string euro = "€";  // three bytes
  EXPECT_EQ(splitter.feed("<think>").reasoning, "");
  EXPECT_TRUE(splitter.in_reasoning());
  EXPECT_EQ(splitter.feed("a" + euro.substr(0, 1)).reasoning, "a");  // the partial sequence waits
  EXPECT_EQ(splitter.feed(euro.substr(1) + "</").reasoning, euro);    // "</" might start </think>
  ReasoningSplit s = splitter.feed("think>\n\nAnswer");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.answer, "Answer");
  EXPECT_FALSE(splitter.in_reasoning());
}

}  // namespace
}  // namespace petrel::text
