// Tool calling for the OpenAI-compatible server: how a model family is shown its tools, how its calls look in
// its output, and turning that output back into OpenAI `tool_calls`.
//
// Formats (docs/SERVER.md has examples):
//  - kNemotron (Llama-3.1-Nemotron-Nano v1, Llama-3.3-Nemotron-Super v1.5; NVIDIA's tool-calling prompt and
//    parser): tools listed as `<AVAILABLE_TOOLS>[schema, ...]</AVAILABLE_TOOLS>` in the system turn; calls are
//    `<TOOLCALL>[{"name": "f", "arguments": {...}}, ...]</TOOLCALL>`; results go back as
//    `<TOOL_RESPONSE>[...]</TOOL_RESPONSE>`. Super v1.5's template writes all three itself; Nano v1's template
//    knows no tools, so petrel writes them into the messages (prepare_conversation: the listing at the end of the
//    system message, which the reasoning switch then moves into the first user turn as it does any system text
//    besides "detailed thinking on/off"; results as a user turn). The parser reads every block and accepts a
//    bare object (as vLLM's newer parser does; NVIDIA's first plugin read only the first block and failed on a
//    bare object).
//  - kLlama3Json (Llama 3.1/3.2/3.3 Instruct): the chat template itself lists the tools; a call is the whole
//    answer as one JSON object `{"name": "f", "parameters": {...}}` (or "arguments"), optionally after
//    `<|python_tag|>`, several separated by ';'.
//  - kHermes: `<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, repeated; the template lists the tools.
// The text before the first call is the message's content. Output that does not parse as the format's calls is
// returned as content, with ParsedToolCalls::error saying why (the server never invents or drops a call).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/runtime/json_schema.h"
#include "petrel/util/status.h"

namespace petrel::serve {

enum class ToolCallFormat { kNone, kNemotron, kLlama3Json, kHermes };

// "none", "nemotron", "llama3-json", "hermes".
const char* tool_call_format_name(ToolCallFormat format);
Result<ToolCallFormat> parse_tool_call_format(std::string_view name);

// The format a chat template implies: kHermes when it writes "<tool_call>", kNemotron when it writes
// "<TOOLCALL>" or switches reasoning with "detailed thinking" (Nemotron v1's templates do not list tools
// themselves), kLlama3Json when it lists `tools` (the Llama 3.1 convention), else kNone.
ToolCallFormat detect_tool_call_format(std::string_view template_source);

// The text that starts a call in `format`, for tool_choice "required" (function empty: any of the tools) or a
// named function (its name and the key of its arguments written too): the server has the answer begin with it,
// so that the model can only go on with a call. Empty for kNone.
std::string tool_call_opener(ToolCallFormat format, std::string_view function);

// The rest of a forced call after tool_call_opener, for constrained decoding (runtime/json_schema.h): the name
// one of the tools' (already written when `named`), the arguments following that tool's "parameters" schema (any
// object where it has none or petrel cannot compile it), then the format's close. `tools`: the request's list.
CallShapeSpec tool_call_shape(ToolCallFormat format, const nlohmann::ordered_json& tools, bool named);

// Whether a chat template writes the tools itself (it reads the `tools` variable).
bool template_writes_tools(std::string_view template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's convention)
};

struct ParsedToolCalls {
  std::string content;          // the text before the first call (the whole text when there is none)
  std::vector<ToolCall> calls;  // in output order
  std::string error;            // why text that looked like a call was not one; empty otherwise
};

// Splits a finished output. Bounded work: linear in the text (JSON parsing included).
ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view output);

// The string that ends the model's turn once its calls are written (generation stops there, so a model cannot
// run on after its first tool call); empty when the format has none (kLlama3Json ends with the turn's EOS).
std::string tool_call_stop_string(ToolCallFormat format);

// OpenAI messages and tools into what the model's template and format expect (the request's JSON is never
// modified in place):
//  - assistant tool_calls whose arguments are a JSON string get them as an object (templates call tojson on them);
//  - kNemotron with a template that does not write tools: the tools are written into the system message
//    (`<AVAILABLE_TOOLS>...`), assistant tool calls become `<TOOLCALL>[...]</TOOLCALL>` content, and each run of
//    tool results one user message `<TOOL_RESPONSE>[...]</TOOL_RESPONSE>`.
// `tools` is the request's list of {"type": "function", "function": {...}} (may be null or empty).
// Fails with kInvalidArgument naming the message when a tool call's arguments are not a JSON object.
struct PreparedConversation {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // for the template: null when petrel wrote them into the messages, or none
};
Result<PreparedConversation> prepare_conversation(const nlohmann::ordered_json& messages,
                                                  const nlohmann::ordered_json& tools, ToolCallFormat format,
                                                  bool template_writes_tools);

// Streaming: passes content through until the output may be starting a call, then holds everything back for
// parse_tool_calls at the end. feed() returns the content that is certain now.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  std::string feed(std::string_view text);
  // The calls (and any content still held back) once the output is complete.
  ParsedToolCalls finish();
  bool holding_call() const { return in_call_; }

 private:
  ToolCallFormat format_;
  std::string all_;       // every byte fed
  size_t emitted_ = 0;    // bytes of all_ passed on as content
  bool in_call_ = false;  // a call's start was seen: the rest is held
};

}  // namespace petrel::serve
