// The OpenAI-compatible server: tool-call formats, request checking, the completion logic with a scripted
// generator (tool calls, reasoning, streaming, a client that goes away), and the HTTP server end to end on
// tiny-llama31 (its answers equal the runtime API's). tests/openai_client_test.py checks the protocol with the
// official OpenAI client.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <condition_variable>
#include <thread>

#include "petrel/io/npy.h"
#include "petrel/runtime/sampler.h"
#include "petrel/runtime/session.h"
#include "petrel/serve/json_text.h"
#include "petrel/serve/openai_api.h"
#include "petrel/serve/server.h"
#include "petrel/serve/tool_calls.h"
#include "petrel/text/chat_template.h"
#include "test_util.h"

namespace petrel::serve {
namespace {

using ojson = nlohmann::ordered_json;
using testing::data_dir;
using testing::tiny_engine;

// ---- tool-call formats ----

TEST(ToolCalls, NemotronBlocksArraysBareObjectsAndContentBefore) {
  auto p = parse_tool_calls(ToolCallFormat::kNemotron,
                            "Let me look.\n<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                            "{\"name\": \"now\", \"arguments\": {}}]</TOOLCALL><TOOLCALL>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}</TOOLCALL>");
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.content, "Let me look.");
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.calls[2].name, "b");
  EXPECT_EQ(p.calls[2].arguments, "{\"x\":1}");  // arguments given as a JSON string
  // Ended by the stop string (the closing tag removed): the last block runs to the end.
  auto cut = parse_tool_calls(ToolCallFormat::kNemotron, "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}]");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{\"a\":[1,2]}");
  EXPECT_TRUE(cut.content.empty());
}

TEST(ToolCalls, MalformedCallsComeBackAsContentWithTheReason) {
  for (const char* text : {"<TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"a\": </TOOLCALL>",
                           "<TOOLCALL>[{\"arguments\": {}}]</TOOLCALL>", "<TOOLCALL>[1, 2]</TOOLCALL>",
                           "<TOOLCALL>[{\"name\": \"f\", \"arguments\": [1]}]</TOOLCALL>",
                           "<TOOLCALL>" "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}) {
    auto p = parse_tool_calls(ToolCallFormat::kNemotron, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
    EXPECT_NE(p.error, "") << text;
  }
  auto plain = parse_tool_calls(ToolCallFormat::kNemotron, "No tools needed.");
  EXPECT_EQ(plain.content, "No tools needed.");
  EXPECT_TRUE(plain.calls.empty() && plain.error.empty());
}

TEST(ToolCalls, Llama3JsonAndHermes) {
  auto one = parse_tool_calls(ToolCallFormat::kLlama3Json, " {\"name\": \"f\", \"parameters\": {\"q\": \"a;b\"}}");
  ASSERT_EQ(one.calls.size(), 1u) << one.error;
  EXPECT_EQ(one.calls[0].arguments, "{\"q\":\"a;b\"}");
  EXPECT_EQ(one.content, "");
  auto two = parse_tool_calls(ToolCallFormat::kLlama3Json,
                              "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"arguments\": {\"b\": \"}\"}}");
  ASSERT_EQ(two.calls.size(), 2u) << two.error;
  EXPECT_EQ(two.calls[1].arguments, "{\"b\":\"}\"}");
  auto text = parse_tool_calls(ToolCallFormat::kLlama3Json, "The answer is {probably} 4.");
  EXPECT_TRUE(text.calls.empty() && text.error.empty());
  auto broken = parse_tool_calls(ToolCallFormat::kLlama3Json, "{\"name\": \"f\", \"parameters\": {");
  EXPECT_TRUE(broken.calls.empty());
  EXPECT_NE(broken.error, "");
  auto hermes = parse_tool_calls(ToolCallFormat::kHermes,
                                 "ok <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {\"z\": 0}}</tool_call>");
  ASSERT_EQ(hermes.calls.size(), 2u) << hermes.error;
  EXPECT_EQ(hermes.content, "ok");
}

// Streaming, fed in pieces of every size, passes on exactly the content before the call and holds the call.
TEST(ToolCalls, StreamGivesTheSameSplitForAnyChunking) {
  const std::string text = "Sure <TOOL here. <TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"k\": \"<TOOLCALL>\"}}]</TOOLCALL>";
  for (size_t piece = 1; piece <= text.size(); ++piece) {
    ToolCallStream stream(ToolCallFormat::kNemotron);
    std::string content;
    for (size_t at = 0; at < text.size(); at += piece) content += stream.feed(text.substr(at, piece));
    ParsedToolCalls end = stream.finish();
    content += end.content;
    EXPECT_EQ(content, "Sure <TOOL here. ") << piece;
    ASSERT_EQ(end.calls.size(), 1u) << piece;
    EXPECT_EQ(end.calls[0].arguments, "{\"k\":\"<TOOLCALL>\"}");
  }
  ToolCallStream plain(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(plain.feed("  "), "");
  EXPECT_EQ(plain.feed("Hi {x}"), "  Hi {x}");
  EXPECT_TRUE(plain.finish().calls.empty());
}

TEST(ToolCalls, NemotronConversationGetsToolsCallsAndResultsInItsTags) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const ojson messages = ojson::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 20}"},
    {"role": "tool", "tool_call_id": "c2", "content": "sunny"}])");
  auto prepared = prepare_conversation(messages, tools, ToolCallFormat::kNemotron, false);
  ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
  const ojson& m = prepared->messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["content"], "Be brief.\n\n<AVAILABLE_TOOLS>[{\"name\": \"get_weather\", \"description\": \"Weather\", "
                             "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}]</AVAILABLE_TOOLS>");
  EXPECT_EQ(m[2]["content"], "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                             "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]</TOOLCALL>");
  EXPECT_FALSE(m[2].contains("tool_calls"));
  EXPECT_EQ(m[3]["role"], "user");
  EXPECT_EQ(m[3]["content"], "<TOOL_RESPONSE>[{\"temp\": 20}, \"sunny\"]</TOOL_RESPONSE>");
  EXPECT_TRUE(prepared->tools.is_null());  // written into the messages, not given to the template

  // Llama 3: the template gets the tools, and the call's arguments as an object (templates tojson them).
  auto llama = prepare_conversation(messages, tools, ToolCallFormat::kLlama3Json, true);
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->tools, tools);
  EXPECT_EQ(llama->messages[2]["tool_calls"][0]["function"]["arguments"], ojson({{"city", "Paris"}}));
  ojson bad = messages;
  bad[2]["tool_calls"][0]["function"]["arguments"] = "not json";
  auto refused = prepare_conversation(bad, tools, ToolCallFormat::kLlama3Json, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("messages[2].tool_calls[0].function.arguments"), std::string::npos);
}

// Nemotron Super v1.5's template writes the tool tags itself: petrel passes the tools through and does not add
// its own; the rendered prompt lists them once and replays the earlier call in NVIDIA's syntax.
TEST(ToolCalls, ATemplateThatWritesTheTagsGetsTheToolsAsTheyAre) {
  std::ifstream in(data_dir() / "chat-templates/nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(source.empty());
  EXPECT_EQ(detect_tool_call_format(source), ToolCallFormat::kNemotron);
  ASSERT_TRUE(template_writes_tools(source));
  auto tmpl = text::ChatTemplate::parse(source, "super");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 20}"}])");
  auto prepared = prepare_conversation(messages, tools, ToolCallFormat::kNemotron, true);
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ(prepared->messages.size(), 3u);
  auto rendered = tmpl->render(prepared->messages, &prepared->tools, true, ojson{{"bos_token", "<|begin_of_text|>"}});
  ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
  const std::string& text = rendered->text;
  size_t listings = 0;
  for (size_t at = 0; (at = text.find("<AVAILABLE_TOOLS>", at)) != std::string::npos; ++at) ++listings;
  EXPECT_EQ(listings, 1u) << text;
  EXPECT_NE(text.find("<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</TOOLCALL>"), std::string::npos) << text;
  EXPECT_NE(text.find("<TOOL_RESPONSE>[{\"temp\": 20}]</TOOL_RESPONSE>"), std::string::npos) << text;
}

TEST(JsonText, TojsonTextAndDepth) {
  EXPECT_EQ(tojson_text(ojson::parse(R"({"b": [1, 2.5, null, true], "a": "é\"x"})")),
            "{\"b\": [1, 2.5, null, true], \"a\": \"é\\\"x\"}");
  std::string deep(100, '[');
  deep += std::string(100, ']');
  const ojson j = ojson::parse(deep);
  EXPECT_FALSE(json_depth_within(j, 64));
  EXPECT_TRUE(json_depth_within(j, 100));
}

// ---- requests ----

ApiError request_error(const std::string& body, ServeLimits limits = {}) {
  auto r = parse_chat_request(body, limits);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(ChatRequest, ParsesWhatClientsSend) {
  auto r = parse_chat_request(R"({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}, "temperature": 0.5,
      "top_p": 0.9, "top_k": -1, "seed": -3, "max_completion_tokens": 100000, "stop": "END",
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "f"}},
      "reasoning_effort": "low", "unknown_key": {"ignored": true}})",
                              ServeLimits{});
  ASSERT_TRUE(std::holds_alternative<ChatRequest>(r)) << std::get<ApiError>(r).message;
  const ChatRequest& c = std::get<ChatRequest>(r);
  EXPECT_EQ(c.messages[0]["role"], "system");
  EXPECT_EQ(c.messages[0]["content"], "a\nb");
  EXPECT_TRUE(c.stream && c.include_usage);
  EXPECT_EQ(*c.temperature, 0.5f);
  EXPECT_EQ(*c.top_k, 0);
  EXPECT_EQ(*c.max_tokens, ServeLimits{}.max_tokens);  // clamped
  EXPECT_EQ(c.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(c.forced_function);
  EXPECT_EQ(c.tool_choice, "f");
  EXPECT_EQ(c.reasoning, text::ReasoningMode::kOn);
  auto off = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": false}})", {});
  EXPECT_EQ(std::get<ChatRequest>(off).reasoning, text::ReasoningMode::kOff);
  auto json_mode = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})", {});
  EXPECT_TRUE(std::get<ChatRequest>(json_mode).json_object);
}

TEST(ChatRequest, RefusesBadInputNamingTheKey) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    std::string body, param;
  } cases[] = {
      {"", ""},
      {"[1]", ""},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})", "messages[0].content[0]"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]})", "messages[0].tool_calls[0].function.name"},
      {"{" + user + R"(, "temperature": 3})", "temperature"},
      {"{" + user + R"(, "top_p": 0})", "top_p"},
      {"{" + user + R"(, "max_tokens": 0})", "max_tokens"},
      {"{" + user + R"(, "max_tokens": 1.5})", "max_tokens"},
      {"{" + user + R"(, "stop": [""]})", "stop"},
      {"{" + user + R"(, "n": 0})", "n"},
      {"{" + user + R"(, "n": 17})", "n"},  // ServeLimits::max_choices is 16
      {"{" + user + R"(, "logprobs": "yes"})", "logprobs"},
      {"{" + user + R"(, "top_logprobs": 2})", "top_logprobs"},
      {"{" + user + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
      {"{" + user + R"(, "stream": "yes"})", "stream"},
      {"{" + user + R"(, "tools": [{"type": "function", "function": {"name": ""}}]})", "tools[0].function.name"},
      {"{" + user + R"(, "tool_choice": "required"})", "tool_choice"},
      {"{" + user + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [{"type": "function", "function": {"name": "f"}}]})", "tool_choice"},
      {"{" + user + R"(, "reasoning": "maybe"})", "reasoning"},
      {"{" + user + R"(, "reasoning_effort": "extreme"})", "reasoning_effort"},
      {"{" + user + R"(, "response_format": {"type": "json_schema", "json_schema": {}}})", "response_format"},
      {"{" + user + R"(, "response_format": "json"})", "response_format"},
  };
  for (const Case& c : cases) {
    const ApiError e = request_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  ServeLimits small;
  small.max_request_bytes = 10;
  EXPECT_EQ(request_error("{" + user + "}", small).http_status, 413);
  std::string deep = "{" + user + ", \"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_NE(request_error(deep).message.find("deeper"), std::string::npos);
}

// ---- the completion logic, with a scripted generator ----

class ScriptedGenerator : public ChatGenerator {
 public:
  std::vector<std::string> pieces;
  StopReason reason = StopReason::kEndOfSequence;
  bool starts_in_reasoning = false;
  ChatTurn last_turn;
  size_t pieces_sent = 0;
  std::vector<std::optional<uint64_t>> seeds;  // each call's
  Result<ChatOutput> generate(const ChatTurn& turn, const GenerationEvents& events) override {
    last_turn = turn;
    seeds.push_back(turn.generation.sampler.seed);
    last_tools = turn.tools ? *turn.tools : ojson();
    if (events.started) events.started(starts_in_reasoning);
    ChatOutput out;
    out.prompt_tokens = 10;
    out.reason = reason;
    pieces_sent = 0;
    for (const std::string& p : pieces) {
      ++pieces_sent;
      out.text += p;
      ++out.completion_tokens;
      if (!events.text(p)) {
        out.reason = StopReason::kCallback;
        break;
      }
    }
    return out;
  }
  ojson last_tools;
};

ChatRequest request_of(const std::string& body) {
  auto r = parse_chat_request(body, ServeLimits{});
  EXPECT_TRUE(std::holds_alternative<ChatRequest>(r)) << std::get<ApiError>(r).message;
  return std::get<ChatRequest>(r);
}

// The events of a stream, each data line parsed ([DONE] as a string).
std::vector<ojson> events_of(const std::vector<std::string>& raw) {
  std::vector<ojson> out;
  for (const std::string& e : raw) {
    EXPECT_EQ(e.rfind("data: ", 0), 0u);
    EXPECT_EQ(e.substr(e.size() - 2), "\n\n");
    const std::string data = e.substr(6, e.size() - 8);
    out.push_back(data == "[DONE]" ? ojson("[DONE]") : ojson::parse(data));
  }
  return out;
}

// A streamed completion's events, each data line parsed, after checking that it ran and ended with [DONE].
std::vector<ojson> streamed_events(ChatGenerator& gen, const ChatRequest& request, const CompletionOptions& options) {
  std::vector<std::string> raw;
  auto none = run_chat_completion(gen, request, options, [&](const std::string& e) {
    raw.push_back(e);
    return true;
  });
  EXPECT_TRUE(std::holds_alternative<ojson>(none));
  std::vector<ojson> events = events_of(raw);
  EXPECT_FALSE(events.empty());
  if (!events.empty()) {
    EXPECT_EQ(events.back(), "[DONE]");
  }
  return events;
}

const char* kToolRequest = R"({"messages": [{"role": "user", "content": "Weather?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]%s})";

std::string tool_request(const std::string& extra = "") {
  char buffer[1024];
  std::snprintf(buffer, sizeof buffer, kToolRequest, extra.c_str());
  return buffer;
}

TEST(ChatCompletion, ToolCallsReasoningAndUsage) {
  ScriptedGenerator gen;
  gen.pieces = {"<think>", "Need the ", "weather.", "</think>\n\n", "Checking", ". <TOOL", "CALL>[{\"name\": \"get_weather\", ",
                "\"arguments\": {\"city\": \"Oslo\"}}]"};
  gen.reason = StopReason::kStopString;
  CompletionOptions options;
  options.tool_format = ToolCallFormat::kNemotron;
  auto result = run_chat_completion(gen, request_of(tool_request()), options, nullptr);
  ASSERT_TRUE(std::holds_alternative<ojson>(result));
  const ojson& r = std::get<ojson>(result);
  const ojson& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "Need the weather.");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(r["usage"]["total_tokens"], 10 + 8);
  // The generator was told to stop at the closing tag, and the tools went into the messages (Nemotron).
  EXPECT_NE(std::find(gen.last_turn.generation.stop_strings.begin(), gen.last_turn.generation.stop_strings.end(), "</TOOLCALL>"),
            gen.last_turn.generation.stop_strings.end());
  EXPECT_TRUE(gen.last_tools.is_null());
  EXPECT_NE(gen.last_turn.messages[0]["content"].get<std::string>().find("<AVAILABLE_TOOLS>"), std::string::npos);
  EXPECT_TRUE(gen.last_turn.generation.sampler.top_p_after_temperature);

  // Streamed: the same reasoning, content and call, as deltas.
  const std::vector<ojson> events =
      streamed_events(gen, request_of(tool_request(R"(, "stream": true, "stream_options": {"include_usage": true})")), options);
  ASSERT_GE(events.size(), 4u);
  std::string reasoning, content, finish;
  ojson calls = ojson::array();
  for (const ojson& e : events) {
    if (!e.is_object() || e["choices"].empty()) continue;
    const ojson& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) calls.push_back(d["tool_calls"][0]);
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "Need the weather.");
  EXPECT_EQ(content, "Checking. ");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
  EXPECT_EQ(events[events.size() - 2]["usage"]["completion_tokens"], 8);

  // tool_choice none: no tools shown, no parsing.
  auto plain = run_chat_completion(gen, request_of(tool_request(R"(, "tool_choice": "none")")), options, nullptr);
  EXPECT_EQ(std::get<ojson>(plain)["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(std::get<ojson>(plain)["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(gen.last_turn.messages[0]["role"], "user");

  // A model without a tool-call format refuses tools instead of ignoring them.
  CompletionOptions no_tools;
  auto refused = run_chat_completion(gen, request_of(tool_request()), no_tools, nullptr);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "tools");
}

TEST(ChatCompletion, APromptThatOpensThinkingAndLengthFinish) {
  ScriptedGenerator gen;
  gen.starts_in_reasoning = true;
  gen.pieces = {"hmm", "</think>", "4"};
  gen.reason = StopReason::kMaxTokens;
  auto r = run_chat_completion(gen, request_of(R"({"messages": [{"role": "user", "content": "2+2"}]})"), {}, nullptr);
  const ojson& m = std::get<ojson>(r)["choices"][0];
  EXPECT_EQ(m["message"]["reasoning_content"], "hmm");
  EXPECT_EQ(m["message"]["content"], "4");
  EXPECT_EQ(m["finish_reason"], "length");
}

TEST(ChatCompletion, AClientThatGoesAwayStopsTheGeneration) {
  ScriptedGenerator gen;
  gen.pieces = std::vector<std::string>(100, "word ");
  int events = 0;
  auto r = run_chat_completion(gen, request_of(R"({"messages": [{"role": "user", "content": "go"}], "stream": true})"), {},
                               [&](const std::string&) { return ++events < 5; });
  EXPECT_TRUE(std::holds_alternative<ojson>(r));
  EXPECT_LT(gen.pieces_sent, 10u);
  // A deadline stops it too, with finish_reason length.
  CompletionOptions quick;
  quick.limits.max_request_seconds = 0;
  auto timed = run_chat_completion(gen, request_of(R"({"messages": [{"role": "user", "content": "go"}]})"), quick, nullptr);
  EXPECT_EQ(std::get<ojson>(timed)["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(gen.pieces_sent, 1u);
}

// n > 1: the choices one after another, choice i with seed + i; streamed, each choice's chunks (role first,
// finish last) before the next one's; usage counts the prompt once.
TEST(ChatCompletion, SeveralChoicesComeOneAfterAnother) {
  ScriptedGenerator gen;
  gen.pieces = {"Hello", " there", "."};
  const std::string ask = R"({"messages": [{"role": "user", "content": "hi"}]})";
  auto r = run_chat_completion(gen, request_of(ask.substr(0, ask.size() - 1) + R"(, "n": 3, "seed": 7})"), {}, nullptr);
  ASSERT_TRUE(std::holds_alternative<ojson>(r));
  const ojson& whole = std::get<ojson>(r);
  ASSERT_EQ(whole["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(whole["choices"][i]["index"], i);
    EXPECT_EQ(whole["choices"][i]["message"]["content"], "Hello there.");
    EXPECT_EQ(whole["choices"][i]["finish_reason"], "stop");
  }
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 9);
  EXPECT_EQ(whole["usage"]["total_tokens"], 19);
  EXPECT_EQ(gen.seeds, (std::vector<std::optional<uint64_t>>{7, 8, 9}));

  // Unseeded: one seed for a single choice is left to the sampler; several get a random base and its successors.
  gen.seeds.clear();
  run_chat_completion(gen, request_of(ask), {}, nullptr);
  run_chat_completion(gen, request_of(ask.substr(0, ask.size() - 1) + R"(, "n": 2})"), {}, nullptr);
  ASSERT_EQ(gen.seeds.size(), 3u);
  EXPECT_FALSE(gen.seeds[0].has_value());
  ASSERT_TRUE(gen.seeds[1].has_value() && gen.seeds[2].has_value());
  EXPECT_EQ(*gen.seeds[2], *gen.seeds[1] + 1);

  // Streamed.
  const std::vector<ojson> events = streamed_events(
      gen, request_of(ask.substr(0, ask.size() - 1) + R"(, "n": 2, "stream": true, "stream_options": {"include_usage": true}})"), {});
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 2]["usage"]["completion_tokens"], 6);
  EXPECT_EQ(events[events.size() - 2]["usage"]["prompt_tokens"], 10);
  std::string content[2];
  int roles[2] = {0, 0}, finishes[2] = {0, 0};
  int64_t last_index = 0;
  for (size_t k = 0; k + 2 < events.size(); ++k) {
    const ojson& c = events[k]["choices"][0];
    const int64_t i = c["index"].get<int64_t>();
    ASSERT_TRUE(i == 0 || i == 1);
    EXPECT_GE(i, last_index) << "choice 1's chunks come after choice 0's";
    last_index = i;
    EXPECT_EQ(finishes[i], 0) << "nothing after a choice's finish chunk";
    if (c["delta"].contains("role")) {
      EXPECT_EQ(content[i], "") << "the role comes first";
      ++roles[i];
    }
    if (c["delta"].contains("content")) content[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[i];
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(content[i], "Hello there.");
    EXPECT_EQ(roles[i], 1);
    EXPECT_EQ(finishes[i], 1);
  }

  // A client that goes away during the first choice: no second one is generated.
  gen.seeds.clear();
  gen.pieces = std::vector<std::string>(100, "word ");
  int sent = 0;
  run_chat_completion(gen, request_of(ask.substr(0, ask.size() - 1) + R"(, "n": 4, "stream": true})"), {},
                      [&](const std::string&) { return ++sent < 5; });
  EXPECT_EQ(gen.seeds.size(), 1u);
}

// The server's top-p is OpenAI's: applied after the temperature (Genie's sampler applies it before).
TEST(ChatCompletion, TopPAfterTheTemperature) {
  // logits 2, 1, 0: at temperature 1 the top token has p = 0.665; at temperature 0.25, p = 0.98.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  SamplerConfig c;
  c.temperature = 0.25f;
  c.top_p = 0.9f;
  c.seed = 1;
  int second_genie = 0, second_openai = 0;
  for (int i = 0; i < 2000; ++i) {
    c.seed = static_cast<uint64_t>(i);
    c.top_p_after_temperature = false;
    second_genie += Sampler(c).sample(logits, {}) != 0;
    c.top_p_after_temperature = true;
    second_openai += Sampler(c).sample(logits, {}) != 0;
  }
  EXPECT_GT(second_genie, 0);   // tokens 0 and 1 survive top-p at temperature 1, then sharpened
  EXPECT_EQ(second_openai, 0);  // only token 0 survives top-p after the temperature
}

// Hostile bodies: a valid request with bytes flipped, cut or repeated, thousands of times. Each is accepted or
// refused with a message; none may crash or hang.
TEST(ChatRequest, MutatedBodiesNeverCrash) {
  const std::string valid = R"({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "ok"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "tool_choice": "auto", "stream": true, "temperature": 0.7, "top_p": 0.9, "max_tokens": 12, "stop": ["x", "y"], "seed": 5})";
  ASSERT_TRUE(std::holds_alternative<ChatRequest>(parse_chat_request(valid, {})));
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":,0123456789.-eE truefalsnul\\\x00\xff\xc3";
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string body = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0: body[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: body.erase(at, 1 + rng() % 8); break;
        default: body.insert(at, body.substr(at, std::min<size_t>(16, body.size() - at))); break;
      }
      if (body.empty()) body = "{";
    }
    auto r = parse_chat_request(body, {});
    if (std::holds_alternative<ChatRequest>(r)) {
      ++accepted;  // and then run, with a model that answers in Nemotron's call syntax
      ScriptedGenerator gen;
      gen.pieces = {"<TOOLCALL>[{\"name\": \"f\", \"arguments\": {}}]"};
      CompletionOptions options;
      options.tool_format = ToolCallFormat::kNemotron;
      auto out = run_chat_completion(gen, std::get<ChatRequest>(r), options, [](const std::string&) { return true; });
      if (auto* e = std::get_if<ApiError>(&out)) {
        EXPECT_FALSE(e->message.empty());
      }
    } else {
      EXPECT_FALSE(std::get<ApiError>(r).message.empty());
    }
  }
  EXPECT_GT(accepted, 0);
}

// ---- the HTTP server, end to end ----

struct RunningServer {
  std::unique_ptr<Server> server;
  std::thread thread;
  RunningServer(std::shared_ptr<ChatGenerator> generator, ServerOptions options) {
    options.port = 0;
    server = std::make_unique<Server>(std::move(generator), options);
    EXPECT_TRUE(server->bind().ok());
    thread = std::thread([this] { EXPECT_TRUE(server->run().ok()); });
  }
  ~RunningServer() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(120, 0);
    return c;
  }
};

// A server over tiny-llama31's engine (a fresh EngineGenerator, the shared engine).
std::unique_ptr<RunningServer> tiny_server(const std::shared_ptr<Engine>& engine) {
  auto generator = EngineGenerator::create(engine, 512);
  EXPECT_TRUE(generator.ok()) << generator.status().to_string();
  if (!generator.ok()) return nullptr;
  return std::make_unique<RunningServer>(std::shared_ptr<ChatGenerator>(std::move(*generator)), ServerOptions{});
}

// The end-to-end tests over tiny-llama31: its engine (shared), a server over it on a free port, a client.
class TinyServer : public ::testing::Test {
 protected:
  void SetUp() override {
    engine = tiny_engine();
    ASSERT_NE(engine, nullptr);
    running = tiny_server(engine);
    ASSERT_NE(running, nullptr);
    client = std::make_unique<httplib::Client>(running->client());
  }
  std::shared_ptr<Engine> engine;
  std::unique_ptr<RunningServer> running;
  std::unique_ptr<httplib::Client> client;
};

// POST `body` to `path`: the status and the answer's JSON (0 and null when there was no answer, a discarded value
// when the answer is not JSON).
std::pair<int, ojson> post_json(httplib::Client& client, const char* path, const ojson& body) {
  auto res = client.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << path;
  if (!res) return {0, ojson()};
  return {res->status, ojson::parse(res->body, nullptr, /*allow_exceptions=*/false)};
}

// The data of each server-sent event of an answer's body, up to [DONE].
std::vector<ojson> sse_data(const std::string& body) {
  std::vector<ojson> out;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    out.push_back(ojson::parse(data));
  }
  return out;
}

TEST_F(TinyServer, GreedyAnswersEqualTheRuntimeApiAndStreamingEqualsWhole) {
  const ojson messages = {{{"role", "user"}, {"content", "Once upon a time"}}};
  // The reference: the runtime API's own greedy answer to the same conversation.
  auto session = Session::create(engine, 512);
  ASSERT_TRUE(session.ok());
  GenerationConfig greedy;
  greedy.sampler = SamplerConfig::greedy_config();
  greedy.max_new_tokens = 20;
  auto expected = (*session)->query(messages, greedy);
  ASSERT_TRUE(expected.ok());

  const ojson body = {{"messages", messages}, {"max_tokens", 20}, {"temperature", 0}};
  auto res = client->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const ojson r = ojson::parse(res->body);
  EXPECT_EQ(r["choices"][0]["message"]["content"], expected->text);
  EXPECT_EQ(r["usage"]["completion_tokens"], expected->stats.generated_tokens);
  EXPECT_EQ(r["usage"]["prompt_tokens"], expected->stats.prompt_tokens + expected->stats.reused_tokens);

  ojson stream_body = body;
  stream_body["stream"] = true;
  auto streamed = client->Post("/v1/chat/completions", stream_body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  std::string joined;
  for (const ojson& e : sse_data(streamed->body)) {
    if (e["choices"].size() && e["choices"][0]["delta"].contains("content")) joined += e["choices"][0]["delta"]["content"];
  }
  EXPECT_EQ(joined, expected->text);

  // n = 2 at temperature 0: two copies of the greedy answer, the prompt counted once.
  ojson two = body;
  two["n"] = 2;
  const auto [both, b] = post_json(*client, "/v1/chat/completions", two);
  ASSERT_EQ(both, 200) << b.dump();
  ASSERT_EQ(b["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b["choices"][i]["index"], i);
    EXPECT_EQ(b["choices"][i]["message"]["content"], expected->text);
  }
  EXPECT_EQ(b["usage"]["prompt_tokens"], r["usage"]["prompt_tokens"]);
  EXPECT_EQ(b["usage"]["completion_tokens"], 2 * expected->stats.generated_tokens);
  // Sampled with a seed: choice i is the single choice of seed + i, and the request repeats.
  ojson sampled = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 41}, {"n", 3}};
  const ojson f = post_json(*client, "/v1/chat/completions", sampled).second;
  ASSERT_EQ(f["choices"].size(), 3u);
  EXPECT_EQ(f["choices"], post_json(*client, "/v1/chat/completions", sampled).second["choices"]);
  for (int i = 0; i < 3; ++i) {
    ojson one = sampled;
    one["n"] = 1;
    one["seed"] = 41 + i;
    EXPECT_EQ(post_json(*client, "/v1/chat/completions", one).second["choices"][0]["message"], f["choices"][i]["message"])
        << "choice " << i;
  }

  // Bad requests get JSON errors and the server goes on.
  auto bad = client->Post("/v1/chat/completions", "{\"messages\": 1}", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(ojson::parse(bad->body)["error"]["param"], "messages");
  auto missing = client->Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(ojson::parse(missing->body).contains("error"));
  // A conversation longer than the context: a 400 naming the context, not a crash.
  ojson long_body = {{"messages", {{{"role", "user"}, {"content", std::string(4000, 'x') + " y"}}}}, {"max_tokens", 4}};
  for (int i = 0; i < 3; ++i) long_body["messages"][0]["content"] = long_body["messages"][0]["content"].get<std::string>() + " a b c d e f g";
  auto too_long = client->Post("/v1/chat/completions", long_body.dump(), "application/json");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  EXPECT_NE(too_long->body.find("Context Size was exceeded"), std::string::npos);
  auto again = client->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(ojson::parse(again->body)["choices"][0]["message"]["content"], expected->text);
}

// POST /v1/completions: a raw prompt, no template; the answer equals the runtime API's for the prompt's tokens.
TEST_F(TinyServer, TextCompletionsEqualTheRuntimeApiForTheSameTokens) {
  auto tokens = engine->tokenizer()->encode("The history of", EncodeOptions{.add_special = true, .parse_special = true, .untrusted_ranges = {}});
  ASSERT_TRUE(tokens.ok());
  auto session = Session::create(engine, 512);
  ASSERT_TRUE(session.ok());
  GenerationConfig greedy;
  greedy.sampler = SamplerConfig::greedy_config();
  greedy.max_new_tokens = 12;
  auto expected = (*session)->query_tokens(*tokens, greedy);
  ASSERT_TRUE(expected.ok());

  for (const ojson& prompt : {ojson("The history of"), ojson(*tokens)}) {
    const ojson body = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}};
    auto res = client->Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const ojson r = ojson::parse(res->body);
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["choices"][0]["text"], expected->text) << prompt.dump();
    EXPECT_EQ(r["usage"]["prompt_tokens"], static_cast<int64_t>(tokens->size()));
    EXPECT_EQ(r["usage"]["completion_tokens"], expected->stats.generated_tokens);
  }
  // A prompt that already starts with BOS does not get a second one.
  const ojson with_bos = {{"prompt", "<|begin_of_text|>The history of"}, {"max_tokens", 12}, {"temperature", 0}, {"echo", true}};
  if (engine->tokenizer()->bos_id()) {
    auto res = client->Post("/v1/completions", with_bos.dump(), "application/json");
    ASSERT_TRUE(res);
    const ojson r = ojson::parse(res->body);
    EXPECT_EQ(r["usage"]["prompt_tokens"], static_cast<int64_t>(tokens->size()));
    EXPECT_EQ(r["choices"][0]["text"], "<|begin_of_text|>The history of" + expected->text);  // echo
  }
  // n = 2 with echo and logprobs: each choice holds the prompt and its log-probabilities (computed once).
  const ojson two = {{"prompt", "The history of"}, {"max_tokens", 12}, {"temperature", 0}, {"echo", true}, {"logprobs", 1}, {"n", 2}};
  const auto [both, b] = post_json(*client, "/v1/completions", two);
  ASSERT_EQ(both, 200) << b.dump();
  ASSERT_EQ(b["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b["choices"][i]["index"], i);
    EXPECT_EQ(b["choices"][i]["text"], "The history of" + expected->text);
    EXPECT_EQ(b["choices"][i]["logprobs"]["tokens"].size(), tokens->size() + static_cast<size_t>(expected->stats.generated_tokens));
  }
  EXPECT_EQ(b["choices"][0]["logprobs"], b["choices"][1]["logprobs"]);
  EXPECT_EQ(b["usage"]["completion_tokens"], 2 * expected->stats.generated_tokens);
  ojson stream_body = {{"prompt", "The history of"}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}};
  auto streamed = client->Post("/v1/completions", stream_body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string joined;
  for (const ojson& e : sse_data(streamed->body)) joined += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(joined, expected->text);
  const std::pair<const char*, const char*> bad_requests[] = {
      {R"({"prompt": ["a", "b"]})", "prompt"}, {R"({"prompt": ""})", "prompt"}, {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": [99999999]})", "prompt"}, {R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "x", "logprobs": 1, "echo": true, "stream": true})", "logprobs"},
      {R"({"prompt": "x", "suffix": "y"})", "suffix"}, {R"({"prompt": "x", "best_of": 2})", "best_of"}};
  for (const auto& [bad, param] : bad_requests) {
    auto res = client->Post("/v1/completions", bad, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << bad << " " << res->body;
    EXPECT_EQ(ojson::parse(res->body)["error"]["param"], param) << res->body;
  }
}

// POST /tokenize and /detokenize (llama.cpp's and vLLM's shapes): the model's tokenizer, ids as the runtime's.
TEST_F(TinyServer, TokenizeAndDetokenizeUseTheModelsTokenizer) {
  const std::string text = "The history of <|eot_id|> tea";
  auto plain = engine->tokenizer()->encode(text, EncodeOptions{.add_special = false, .parse_special = true, .untrusted_ranges = {}});
  auto with_bos = engine->tokenizer()->encode(text, EncodeOptions{.add_special = true, .parse_special = true, .untrusted_ranges = {}});
  auto literal = engine->tokenizer()->encode(text, EncodeOptions{.add_special = false, .parse_special = false, .untrusted_ranges = {}});
  ASSERT_TRUE(plain.ok() && with_bos.ok() && literal.ok());
  auto post = [&](const char* path, const ojson& body) { return post_json(*client, path, body); };
  // llama.cpp: "content", no special tokens added unless asked; vLLM: "prompt", added unless told not to.
  auto [s1, r1] = post("/tokenize", {{"content", text}});
  EXPECT_EQ(s1, 200);
  EXPECT_EQ(r1["tokens"], ojson(*plain));
  EXPECT_EQ(r1["count"], plain->size());
  EXPECT_EQ(r1["max_model_len"], 512);
  EXPECT_EQ(post("/tokenize", {{"prompt", text}}).second["tokens"], ojson(*with_bos));
  EXPECT_EQ(post("/tokenize", {{"prompt", text}, {"add_special_tokens", false}}).second["tokens"], ojson(*plain));
  EXPECT_EQ(post("/tokenize", {{"content", text}, {"add_special", true}}).second["tokens"], ojson(*with_bos));
  EXPECT_EQ(post("/tokenize", {{"content", text}, {"parse_special", false}}).second["tokens"], ojson(*literal));
  auto [s2, pieces] = post("/tokenize", {{"content", "Hello"}, {"with_pieces", true}});
  EXPECT_EQ(s2, 200);
  std::string joined;
  for (const ojson& t : pieces["tokens"]) joined += t["piece"].get<std::string>();
  EXPECT_EQ(joined, "Hello");
  // Back: the same text.
  auto [s3, back] = post("/detokenize", {{"tokens", *plain}});
  EXPECT_EQ(s3, 200);
  EXPECT_EQ(back["content"], text);
  EXPECT_EQ(back["prompt"], text);
  // Bad requests name what is wrong; the server goes on.
  const std::pair<const char*, ojson> bad[] = {
      {"/tokenize", {{"text", "x"}}}, {"/tokenize", {{"content", 3}}}, {"/tokenize", {{"content", "x"}, {"add_special", "yes"}}},
      {"/detokenize", {{"tokens", "1 2"}}}, {"/detokenize", {{"tokens", {1, "a"}}}}, {"/detokenize", {{"tokens", {-1}}}},
      {"/detokenize", {{"tokens", {99999999}}}}};
  for (const auto& [path, body] : bad) {
    auto [status, r] = post(path, body);
    EXPECT_EQ(status, 400) << path << " " << body.dump();
    EXPECT_TRUE(r.contains("error")) << r.dump();
  }
  EXPECT_EQ(post("/tokenize", {{"content", "again"}}).first, 200);
}

// Log-probabilities against Hugging Face transformers: the echoed prompt's token_logprobs are the log-softmax of
// transformers' logits for the parity tokens (tests/data/parity, made by make_parity_fixtures.py), the way a
// scoring harness (lm-evaluation-harness) asks for a text's likelihood; chat logprobs stream as they come and
// equal the whole answer's.
TEST_F(TinyServer, LogprobsAreTheLogSoftmaxOfTransformersLogits) {
  std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
  tokens.resize(40);
  auto reference = read_npy(data_dir() / "parity/tiny-llama31.logits.npy");
  ASSERT_TRUE(reference.ok());
  const int64_t vocab = reference->shape[1];
  auto reference_logprob = [&](size_t position, int32_t token) {  // log-softmax of transformers' row, in double
    const float* row = reference->f32() + position * vocab;
    double max = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab; ++i) max = std::max(max, double(row[i]));
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - max);
    return double(row[token]) - max - std::log(sum);
  };
  const ojson body = {{"prompt", tokens}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 3}, {"temperature", 0}};
  auto res = client->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const ojson choice = ojson::parse(res->body)["choices"][0];
  const ojson& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), tokens.size() + 1);
  ASSERT_EQ(lp["token_logprobs"].size(), tokens.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  double worst = 0;
  std::string text;
  for (size_t i = 0; i <= tokens.size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), text.size());
    text += lp["tokens"][i].get<std::string>();
    if (i == 0) continue;
    const int32_t token = i < tokens.size() ? tokens[i] : -1;
    const double got = lp["token_logprobs"][i].get<double>();
    if (token >= 0) worst = std::max(worst, std::abs(got - reference_logprob(i - 1, token)));
    // The alternatives: at most 3 plus the chosen token, the largest being the reference's top-1.
    const ojson& top = lp["top_logprobs"][i];
    ASSERT_GE(top.size(), 3u);
    ASSERT_LE(top.size(), 4u);
    double best = -INFINITY;
    for (const auto& [key, value] : top.items()) best = std::max(best, value.get<double>());
    const float* row = reference->f32() + (i - 1) * vocab;
    const int32_t top1 = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    EXPECT_NEAR(best, reference_logprob(i - 1, top1), 2e-3) << "position " << i;
    if (token < 0) {
      EXPECT_EQ(got, best) << "greedy: the generated token is the most likely";
    }
  }
  EXPECT_LT(worst, 2e-3) << "float32 CPU forward with an fp16 KV cache against transformers' float32";
  EXPECT_EQ(choice["text"], text);  // echo of a token prompt: its decoded text, then the answer

  // Chat: one entry a generated token, bytes that spell the token, streamed entries the same as the whole.
  const ojson chat = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 8},
                      {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  auto whole = client->Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const ojson r = ojson::parse(whole->body);
  const ojson& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), r["usage"]["completion_tokens"].get<size_t>());
  for (const ojson& e : content) {
    std::string bytes;
    for (const ojson& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, e["token"].get<std::string>());
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["logprob"], e["top_logprobs"][0]["logprob"]);  // greedy
  }
  ojson stream_body = chat;
  stream_body["stream"] = true;
  auto streamed = client->Post("/v1/chat/completions", stream_body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  ojson joined = ojson::array();
  for (const ojson& e : sse_data(streamed->body)) {
    if (e["choices"].empty() || e["choices"][0]["logprobs"].is_null()) continue;
    for (const ojson& entry : e["choices"][0]["logprobs"]["content"]) joined.push_back(entry);
  }
  EXPECT_EQ(joined, content);
}

// tool_choice "required" and a named function: the answer begins with the format's call opener and the rest is
// constrained (a tool's name, an object of arguments, the format's close), so even tiny-llama31, a story model
// that never calls tools, answers with a call that parses, unless max_tokens cuts it. tiny-llama31 with Nemotron Super v1.5's
// template (nemotron format, a reasoning switch): with reasoning on, an answer that opens no <think> block gets
// the opener right after the prompt, its first tokens dropped unseen.
TEST(Server, ToolChoiceRequiredMakesTheAnswerBeginWithACall) {
  testing::TempDir dir("serve_tool_choice");
  const std::filesystem::path model = dir / "model", tiny = data_dir() / "models/tiny-llama31";
  std::filesystem::create_directories(model);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}) {
    std::filesystem::create_symlink(tiny / f, model / f);
  }
  std::ifstream in(data_dir() / "chat-templates/nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja");
  const std::string super_template((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ojson tokenizer_config = ojson::parse(*read_text_file(tiny / "tokenizer_config.json"));
  tokenizer_config["chat_template"] = super_template;
  ASSERT_TRUE(write_file_atomic(model / "tokenizer_config.json", tokenizer_config.dump()).ok());
  auto engine = Engine::load(model);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto generator = EngineGenerator::create(*engine, 1024);
  ASSERT_TRUE(generator.ok());
  CompletionOptions options;
  ASSERT_TRUE((*generator)->configure_tools("auto", options).ok());
  ASSERT_EQ(options.tool_format, ToolCallFormat::kNemotron);

  // The city an enum: a free string from this story model runs on past any max_tokens.
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}])";
  const std::string user = R"("messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 200, "temperature": 0)";
  struct Case {
    std::string extra, opener;
  } cases[] = {
      {R"("tool_choice": "required", "reasoning": "off")", "<TOOLCALL>[{\"name\": \""},
      {R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "reasoning": "off")",
       "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": "},
      {R"("tool_choice": "required", "reasoning": "on")", "<TOOLCALL>[{\"name\": \""},
  };
  int calls = 0;
  for (const Case& c : cases) {
    for (bool stream : {false, true}) {
      const std::string body = "{" + user + ", " + tools + ", " + c.extra + (stream ? R"(, "stream": true})" : "}");
      SCOPED_TRACE(body);
      auto request = parse_chat_request(body, {});
      ASSERT_TRUE(std::holds_alternative<ChatRequest>(request)) << body;
      std::string streamed;
      ojson usage;
      auto result = run_chat_completion(**generator, std::get<ChatRequest>(request), options, [&](const std::string& event) {
        if (event.rfind("data: {", 0) == 0) {
          const ojson e = ojson::parse(event.substr(6));
          if (e.contains("usage")) usage = e["usage"];
          if (!e["choices"].empty()) {
            const ojson& delta = e["choices"][0]["delta"];
            EXPECT_FALSE(delta.contains("reasoning_content")) << event;
            if (delta.contains("content")) streamed += delta["content"].get<std::string>();
            if (delta.contains("tool_calls")) streamed += "<call " + delta["tool_calls"][0]["function"]["name"].get<std::string>() + ">";
          }
        }
        return true;
      });
      ASSERT_TRUE(std::holds_alternative<ojson>(result)) << std::get<ApiError>(result).message;
      std::string answer = streamed;
      if (!stream) {
        const ojson& r = std::get<ojson>(result);
        const ojson& message = r["choices"][0]["message"];
        answer = message["content"].is_string() ? message["content"].get<std::string>() : "";
        if (message.contains("tool_calls")) answer = "<call " + message["tool_calls"][0]["function"]["name"].get<std::string>() + ">";
        auto opener = (*engine)->tokenizer()->encode(c.opener);
        ASSERT_TRUE(opener.ok());
        EXPECT_GE(r["usage"]["completion_tokens"].get<size_t>(), opener->size()) << "the opener's tokens count as generated";
        EXPECT_LE(r["usage"]["completion_tokens"].get<int64_t>(), 200);
      }
      const bool called = answer.rfind("<call get_weather>", 0) == 0;
      EXPECT_TRUE(called || answer.rfind(c.opener, 0) == 0) << answer;
      if (!stream) {
        const ojson& r = std::get<ojson>(result);
        const std::string finish = r["choices"][0]["finish_reason"];
        EXPECT_TRUE(finish == "length" || (called && finish == "tool_calls")) << finish << " " << answer;
        if (called) {
          calls++;
          const ojson arguments = ojson::parse(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>());
          EXPECT_TRUE(arguments["city"] == "Paris" || arguments["city"] == "Rome") << arguments.dump() << ": the tool's schema";
        }
      }
    }
  }
  EXPECT_GT(calls, 0) << "within 200 tokens some constrained answers should have closed their call";
}

// A generator that blocks until released: to hold the model busy.
class GateGenerator : public ChatGenerator {
 public:
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> entered{0};
  Result<ChatOutput> generate(const ChatTurn&, const GenerationEvents& events) override {
    ++entered;
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return open; });
    events.text("done");
    ChatOutput out;
    out.text = "done";
    out.reason = StopReason::kEndOfSequence;
    return out;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    cv.notify_all();
  }
};

TEST(Server, BusyAnswers503AndAnApiKeyIsChecked) {
  auto gate = std::make_shared<GateGenerator>();
  ServerOptions options;
  options.max_waiting = 0;
  options.api_key = "sekret";
  RunningServer running(gate, options);
  const std::string body = R"({"messages": [{"role": "user", "content": "x"}]})";
  httplib::Headers auth = {{"Authorization", "Bearer sekret"}};

  auto unauthorized = running.client().Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(unauthorized);
  EXPECT_EQ(unauthorized->status, 401);

  std::thread first([&] {
    auto res = running.client().Post("/v1/chat/completions", auth, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  });
  while (gate->entered.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto busy = running.client().Post("/v1/chat/completions", auth, body, "application/json");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503);
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  gate->release();
  first.join();
  auto health = running.client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// llama.cpp's slot persistence: off without a directory; save, erase and restore the one slot's KV cache; the
// restored cache serves a repeated request (usage.prompt_tokens_details.cached_tokens) with the same answer; bad
// names, slots, actions and files are refused without touching the cache or naming the server's directory.
TEST(Server, SlotSaveEraseAndRestoreServeTheCachedPrefix) {
  auto engine = tiny_engine();
  ASSERT_NE(engine, nullptr);
  {
    auto off = tiny_server(engine);
    ASSERT_NE(off, nullptr);
    auto client = off->client();
    const auto [status, body] = post_json(client, "/slots/0?action=save", {{"filename", "a.bin"}});
    EXPECT_EQ(status, 501) << body.dump();
    EXPECT_NE(body.dump().find("--slot-save-path"), std::string::npos) << body.dump();
  }
  testing::TempDir dir("slots");
  auto generator = EngineGenerator::create(engine, 512);
  ASSERT_TRUE(generator.ok());
  ServerOptions options;
  options.slot_save_path = dir.path().string();
  RunningServer running(std::shared_ptr<ChatGenerator>(std::move(*generator)), options);
  auto client = running.client();
  const ojson request = {{"messages", {{{"role", "user"}, {"content", "Tell me about the city."}}}}, {"max_tokens", 8}, {"temperature", 0}};
  auto chat = [&] {
    const auto [status, body] = post_json(client, "/v1/chat/completions", request);
    EXPECT_EQ(status, 200) << body.dump();
    return body;
  };
  const ojson first = chat();
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"];
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  const auto [saved_status, saved] = post_json(client, "/slots/0?action=save", {{"filename", "a.bin"}});
  ASSERT_EQ(saved_status, 200) << saved.dump();
  const int64_t n = saved["n_saved"];
  EXPECT_EQ(n, prompt_tokens + first["usage"]["completion_tokens"].get<int64_t>() - 1);  // the last token is not in it
  EXPECT_GT(saved["n_written"].get<int64_t>(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "a.bin"));
  const auto [erased_status, erased] = post_json(client, "/slots/0?action=erase", ojson::object());
  ASSERT_EQ(erased_status, 200) << erased.dump();
  EXPECT_EQ(erased["n_erased"], n);
  const auto [restored_status, restored] = post_json(client, "/slots/0?action=restore", {{"filename", "a.bin"}});
  ASSERT_EQ(restored_status, 200) << restored.dump();
  EXPECT_EQ(restored["n_restored"], n);
  EXPECT_EQ(restored["n_read"], saved["n_written"]);
  const ojson again = chat();  // all of the prompt but its last token comes from the restored cache
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);
  EXPECT_EQ(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);

  // Refused, the cache untouched: bad names, another slot, an unknown action, a missing or truncated file.
  for (const ojson& name : {ojson("../a.bin"), ojson(".hidden"), ojson("a/b"), ojson(""), ojson(std::string(201, 'a')), ojson(3)}) {
    const auto [status, body] = post_json(client, "/slots/0?action=restore", {{"filename", name}});
    EXPECT_EQ(status, 400) << name.dump();
    EXPECT_EQ(body["error"]["param"], "filename") << body.dump();
  }
  EXPECT_EQ(post_json(client, "/slots/1?action=save", {{"filename", "b.bin"}}).first, 400);
  EXPECT_EQ(post_json(client, "/slots/0?action=load", {{"filename", "b.bin"}}).first, 400);
  const auto [missing_status, missing] = post_json(client, "/slots/0?action=restore", {{"filename", "missing.bin"}});
  EXPECT_EQ(missing_status, 404) << missing.dump();
  EXPECT_NE(missing["error"]["message"].get<std::string>().find("missing.bin"), std::string::npos) << missing.dump();
  EXPECT_EQ(missing.dump().find(dir.path().string()), std::string::npos) << missing.dump();
  auto bytes = read_text_file(dir.path() / "a.bin");
  ASSERT_TRUE(bytes.ok());
  std::ofstream(dir.path() / "cut.bin", std::ios::binary) << bytes->substr(0, bytes->size() / 2);
  const auto [cut_status, cut] = post_json(client, "/slots/0?action=restore", {{"filename", "cut.bin"}});
  EXPECT_EQ(cut_status, 400) << cut.dump();
  EXPECT_NE(cut["error"]["message"].get<std::string>().find("truncated"), std::string::npos) << cut.dump();
  EXPECT_EQ(chat()["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);  // the cache as it was
}

// Several slots (EngineGenerator's `slots`): two conversations taking turns each keep their cache, where one slot
// keeps only the last; the answers are the one-slot server's (the cache changes what is computed again, not what
// comes out).
TEST(Server, SlotsKeepTheCachesOfConversationsThatTakeTurns) {
  auto engine = tiny_engine();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(EngineGenerator::create(engine, 512, KvType::kF16, 0).status().code(), ErrorCode::kInvalidArgument);
  testing::TempDir dir("slots2");
  struct Turns {
    std::vector<int64_t> cached, prompt;
    std::vector<std::string> answers;
  };
  auto converse = [&](int slots) {
    auto generator = EngineGenerator::create(engine, 512, KvType::kF16, slots);
    EXPECT_TRUE(generator.ok()) << generator.status().to_string();
    ServerOptions options;
    options.slot_save_path = dir.path().string();
    RunningServer running(std::shared_ptr<ChatGenerator>(std::move(*generator)), options);
    auto client = running.client();
    ojson a = {{{"role", "user"}, {"content", "Tell me about the city and its old harbour."}}};
    ojson b = {{{"role", "user"}, {"content", "What is a river?"}}};
    Turns turns;
    auto ask = [&](ojson& messages, const std::string& next) {
      const auto [status, body] = post_json(client, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
      EXPECT_EQ(status, 200) << body.dump();
      turns.cached.push_back(body["usage"]["prompt_tokens_details"]["cached_tokens"]);
      turns.prompt.push_back(body["usage"]["prompt_tokens"]);
      const std::string answer = body["choices"][0]["message"]["content"];
      turns.answers.push_back(answer);
      messages.push_back({{"role", "assistant"}, {"content", answer}});
      messages.push_back({{"role", "user"}, {"content", next}});
    };
    ask(a, "And its people?");
    ask(b, "And a lake?");
    ask(a, "And its food?");
    ask(b, "And the sea?");
    if (slots > 1) {  // each slot's own file; a slot past the last refused
      const auto [saved_status, saved] = post_json(client, "/slots/1?action=save", {{"filename", "b.bin"}});
      EXPECT_EQ(saved_status, 200) << saved.dump();
      EXPECT_EQ(saved["id_slot"], 1);
      EXPECT_GT(saved["n_saved"].get<int64_t>(), turns.cached.back());
      auto listed = client.Get("/slots");  // each slot's cached tokens, none running
      EXPECT_TRUE(listed && listed->status == 200);
      const ojson states = listed ? ojson::parse(listed->body) : ojson::array();
      EXPECT_EQ(states.size(), static_cast<size_t>(slots)) << states.dump();
      EXPECT_EQ(states[1]["cached_tokens"], saved["n_saved"]) << states.dump();
      EXPECT_EQ(states[0]["n_ctx"], 512);
      EXPECT_EQ(states[0]["is_processing"], false);
      EXPECT_GT(states[0]["cached_tokens"].get<int64_t>(), turns.prompt[2]);
      const auto [refused_status, refused] = post_json(client, ("/slots/" + std::to_string(slots) + "?action=save").c_str(), {{"filename", "c.bin"}});
      EXPECT_EQ(refused_status, 400) << refused.dump();
      EXPECT_NE(refused.dump().find(std::to_string(slots) + " slots, 0 to " + std::to_string(slots - 1)), std::string::npos) << refused.dump();
    }
    return turns;
  };
  const Turns one = converse(1), two = converse(2);
  EXPECT_EQ(two.answers, one.answers);
  ASSERT_EQ(two.cached.size(), 4u);
  EXPECT_EQ(two.cached[0], 0);
  EXPECT_EQ(two.cached[1], 0);  // b went to the unused slot
  for (int turn : {2, 3}) {     // each conversation's second turn found its first prompt in its slot; one slot
                                // held the other conversation, which shares only the template's system prompt
    EXPECT_GE(two.cached[turn], two.prompt[turn - 2]) << "turn " << turn;
    EXPECT_LT(one.cached[turn], one.prompt[turn - 2]) << "turn " << turn;
  }
}

TEST(Server, ASecondServerOnAServedPortFailsToBind) {
  RunningServer running(std::make_shared<GateGenerator>(), ServerOptions{});
  ServerOptions options;
  options.port = running.server->port();
  Server second(std::make_shared<GateGenerator>(), options);
  const Status bound = second.bind();
  EXPECT_FALSE(bound.ok());
  EXPECT_NE(bound.message().find("in use"), std::string::npos) << bound.to_string();
  auto health = running.client().Get("/health");  // the first one still answers
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

}  // namespace
}  // namespace petrel::serve
