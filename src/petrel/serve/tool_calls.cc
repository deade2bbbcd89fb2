#include "petrel/serve/tool_calls.h"

#include <algorithm>

#include "petrel/serve/json_text.h"

namespace petrel::serve {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kNemotronOpen = "<TOOLCALL>";
constexpr std::string_view kNemotronClose = "</TOOLCALL>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// A call's arguments as JSON text: an object as it is, a string holding an object parsed first.
Result<std::string> arguments_text(const ojson& arguments) {
  if (arguments.is_object()) return arguments.dump();
  if (arguments.is_string()) {
    ojson parsed = ojson::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) return parsed.dump();
  }
  if (arguments.is_null()) return std::string("{}");
  return invalid_argument("the arguments are not a JSON object");
}

// One call object: {"name": "...", key: {...}} where key is "arguments" or, for Llama 3, "parameters".
Result<ToolCall> call_from_json(const ojson& j) {
  if (!j.is_object()) return invalid_argument("a call is not a JSON object");
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    return invalid_argument("a call has no \"name\" string");
  }
  ToolCall call;
  call.name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  PETREL_ASSIGN_OR_RETURN(call.arguments, arguments_text(args == j.end() ? ojson() : *args));
  return call;
}

// The calls in one block's JSON: an array of call objects, or one bare object.
Status append_calls(std::string_view block, std::vector<ToolCall>& calls) {
  ojson j = ojson::parse(block, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("not JSON: " + std::string(block.substr(0, 80)));
  if (j.is_array()) {
    for (const ojson& item : j) {
      PETREL_ASSIGN_OR_RETURN(ToolCall call, call_from_json(item));
      calls.push_back(std::move(call));
    }
    return ok_status();
  }
  PETREL_ASSIGN_OR_RETURN(ToolCall call, call_from_json(j));
  calls.push_back(std::move(call));
  return ok_status();
}

// Tagged blocks (kNemotron, kHermes): every block from the first opening tag; a last block without its closing
// tag (the stop string ended generation there, or max tokens) runs to the end of the text.
ParsedToolCalls parse_tagged(std::string_view output, std::string_view open, std::string_view close) {
  ParsedToolCalls parsed;
  const size_t first = output.find(open);
  if (first == std::string_view::npos) {
    parsed.content = std::string(output);
    return parsed;
  }
  size_t at = first;
  Status status;
  while (at != std::string_view::npos && status.ok()) {
    const size_t body = at + open.size();
    size_t end = output.find(close, body);
    const std::string_view block = output.substr(body, end == std::string_view::npos ? std::string_view::npos : end - body);
    status = append_calls(trim(block), parsed.calls);
    if (end == std::string_view::npos) break;
    const std::string_view rest = trim(output.substr(end + close.size()));
    if (rest.empty()) break;
    at = output.find(open, end + close.size());
    // Text between or after blocks is not a call: kept only when nothing parsed failed (it is dropped by
    // vLLM's parsers too); a stray non-call tail is most often the model running on.
  }
  if (!status.ok()) {
    parsed.calls.clear();
    parsed.content = std::string(output);
    parsed.error = std::string(open) + " block: " + status.message();
    return parsed;
  }
  parsed.content = std::string(trim(output.substr(0, first)));
  return parsed;
}

// The end of the top-level JSON value starting at text[0] ('{'), or npos: strings and nesting are followed.
size_t json_object_end(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

// Llama 3: the whole answer is one or more call objects separated by ';' (optionally after <|python_tag|>).
ParsedToolCalls parse_llama3(std::string_view output) {
  ParsedToolCalls parsed;
  std::string_view rest = trim(output);
  if (rest.substr(0, kPythonTag.size()) == kPythonTag) rest = trim(rest.substr(kPythonTag.size()));
  if (rest.empty() || rest.front() != '{') {
    parsed.content = std::string(output);
    return parsed;
  }
  Status status;
  while (!rest.empty() && status.ok()) {
    const size_t end = json_object_end(rest);
    if (end == std::string_view::npos) {
      status = invalid_argument("an unterminated JSON object");
      break;
    }
    status = append_calls(rest.substr(0, end), parsed.calls);
    rest = trim(rest.substr(end));
    if (!rest.empty() && rest.front() == ';') rest = trim(rest.substr(1));
    if (!rest.empty() && rest.front() != '{') status = invalid_argument("text after the calls");
  }
  if (!status.ok()) {
    parsed.calls.clear();
    parsed.content = std::string(output);
    parsed.error = "JSON tool call: " + status.message();
  }
  return parsed;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kNemotron: return "nemotron";
    case ToolCallFormat::kLlama3Json: return "llama3-json";
    case ToolCallFormat::kHermes: return "hermes";
  }
  return "?";
}

Result<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kNemotron, ToolCallFormat::kLlama3Json, ToolCallFormat::kHermes}) {
    if (name == tool_call_format_name(f)) return f;
  }
  return invalid_argument("tool-call format '" + std::string(name) + "': expected none, nemotron, llama3-json or hermes");
}

ToolCallFormat detect_tool_call_format(std::string_view source) {
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kNemotronOpen) != std::string_view::npos) return ToolCallFormat::kNemotron;
  if (source.find("detailed thinking") != std::string_view::npos) return ToolCallFormat::kNemotron;
  if (template_writes_tools(source)) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

bool template_writes_tools(std::string_view source) { return source.find("tools") != std::string_view::npos; }

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view output) {
  switch (format) {
    case ToolCallFormat::kNemotron: return parse_tagged(output, kNemotronOpen, kNemotronClose);
    case ToolCallFormat::kHermes: return parse_tagged(output, kHermesOpen, kHermesClose);
    case ToolCallFormat::kLlama3Json: return parse_llama3(output);
    case ToolCallFormat::kNone: break;
  }
  ParsedToolCalls parsed;
  parsed.content = std::string(output);
  return parsed;
}

std::string tool_call_opener(ToolCallFormat format, std::string_view function) {
  std::string open;
  switch (format) {
    case ToolCallFormat::kNone: return "";
    case ToolCallFormat::kNemotron: open = std::string(kNemotronOpen) + "["; break;
    case ToolCallFormat::kLlama3Json: break;
    case ToolCallFormat::kHermes: open = std::string(kHermesOpen) + "\n"; break;
  }
  if (function.empty()) return open + "{\"name\": \"";
  const char* arguments = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  return open + "{\"name\": " + ojson(std::string(function)).dump() + ", \"" + arguments + "\": ";
}

CallShapeSpec tool_call_shape(ToolCallFormat format, const ojson& tools, bool named) {
  CallShapeSpec spec;
  for (const ojson& t : tools) {
    spec.names.push_back(t["function"]["name"].get<std::string>());
    std::shared_ptr<const JsonSchema> schema = JsonSchema::any_object();
    if (t["function"].contains("parameters")) {
      auto compiled = JsonSchema::compile(nlohmann::json::parse(t["function"]["parameters"].dump()));
      if (compiled.ok()) schema = *compiled;
    }
    spec.arguments.push_back(std::move(schema));
  }
  spec.starts_at_arguments = named;
  spec.after_name = std::string("\", \"") + (format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments") + "\": ";
  switch (format) {
    case ToolCallFormat::kNemotron: spec.close = "}]" + std::string(kNemotronClose); break;
    case ToolCallFormat::kHermes: spec.close = "}\n" + std::string(kHermesClose); break;
    default: spec.close = "}"; break;
  }
  return spec;
}

std::string tool_call_stop_string(ToolCallFormat format) {
  // Hermes models may write several blocks, so only Nemotron's single array block ends the turn.
  return format == ToolCallFormat::kNemotron ? std::string(kNemotronClose) : std::string();
}

Result<PreparedConversation> prepare_conversation(const ojson& messages, const ojson& tools, ToolCallFormat format,
                                                  bool template_writes_tools) {
  const bool nemotron = format == ToolCallFormat::kNemotron && !template_writes_tools;  // petrel writes the tags
  PreparedConversation out;
  out.messages = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    const std::string role = m.value("role", "");
    if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      ojson calls = ojson::array();
      for (size_t c = 0; c < m["tool_calls"].size(); ++c) {
        ojson& call = m["tool_calls"][c];
        ojson* target = call.contains("function") ? &call["function"] : &call;
        if (target->contains("arguments") && (*target)["arguments"].is_string()) {
          ojson parsed = ojson::parse((*target)["arguments"].get<std::string>(), nullptr, false);
          if (!parsed.is_object()) {
            return invalid_argument(where + ".tool_calls[" + std::to_string(c) + "].function.arguments: not a JSON object");
          }
          (*target)["arguments"] = std::move(parsed);
        }
        calls.push_back({{"name", target->value("name", "")}, {"arguments", target->value("arguments", ojson::object())}});
      }
      if (nemotron) {
        std::string content = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
        if (!content.empty()) content += "\n";
        m["content"] = content + std::string(kNemotronOpen) + tojson_text(calls) + std::string(kNemotronClose);
        m.erase("tool_calls");
      }
    }
    if (nemotron && role == "tool") {  // this and the tool results right after it: one user turn
      ojson results = ojson::array();
      size_t j = i;
      for (; j < messages.size() && messages[j].value("role", "") == "tool"; ++j) {
        const ojson& content = messages[j].contains("content") ? messages[j]["content"] : ojson();
        ojson value = content.is_string() ? ojson::parse(content.get<std::string>(), nullptr, false) : content;
        results.push_back(value.is_discarded() ? content : value);
      }
      i = j - 1;
      out.messages.push_back(
          {{"role", "user"}, {"content", std::string("<TOOL_RESPONSE>") + tojson_text(results) + "</TOOL_RESPONSE>"}});
      continue;
    }
    out.messages.push_back(std::move(m));
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  out.tools = has_tools && !nemotron ? tools : ojson();
  if (nemotron && has_tools) {
    ojson functions = ojson::array();
    for (const ojson& t : tools) functions.push_back(t.contains("function") ? t["function"] : t);
    const std::string listing = "<AVAILABLE_TOOLS>" + tojson_text(functions) + "</AVAILABLE_TOOLS>";
    if (!out.messages.empty() && out.messages[0].value("role", "") == "system" && out.messages[0]["content"].is_string()) {
      std::string text = out.messages[0]["content"].get<std::string>();
      out.messages[0]["content"] = text.empty() ? listing : text + "\n\n" + listing;
    } else {
      out.messages.insert(out.messages.begin(), ojson{{"role", "system"}, {"content", listing}});
    }
  }
  return out;
}

std::string ToolCallStream::feed(std::string_view text) {
  all_.append(text);
  if (in_call_ || format_ == ToolCallFormat::kNone) {
    if (format_ == ToolCallFormat::kNone) {
      std::string out = all_.substr(emitted_);
      emitted_ = all_.size();
      return out;
    }
    return {};
  }
  if (format_ == ToolCallFormat::kLlama3Json) {
    // Decided by the first visible character: '{' starts a call (the python tag is a special token, which the
    // decoder drops), anything else is content.
    const std::string_view rest = trim(std::string_view(all_).substr(emitted_));
    if (rest.empty()) return {};
    if (emitted_ == 0 && rest.front() == '{') {
      in_call_ = true;
      return {};
    }
    format_ = ToolCallFormat::kNone;  // plain content from here on
    std::string out = all_.substr(emitted_);
    emitted_ = all_.size();
    return out;
  }
  const std::string_view open = format_ == ToolCallFormat::kNemotron ? kNemotronOpen : kHermesOpen;
  const size_t at = all_.find(open, emitted_);
  size_t upto = all_.size();
  if (at != std::string::npos) {
    in_call_ = true;
    upto = at;
  } else {
    // Hold back a tail that may be the start of the tag.
    for (size_t keep = std::min(open.size() - 1, all_.size() - emitted_); keep > 0; --keep) {
      if (std::string_view(all_).substr(all_.size() - keep) == open.substr(0, keep)) {
        upto = all_.size() - keep;
        break;
      }
    }
  }
  std::string out = all_.substr(emitted_, upto - emitted_);
  emitted_ = upto;
  return out;
}

ParsedToolCalls ToolCallStream::finish() {
  ParsedToolCalls parsed;
  if (in_call_) {
    parsed = parse_tool_calls(format_, all_);
    if (!parsed.calls.empty()) {
      parsed.content.clear();  // the text before the first call went out already
      emitted_ = all_.size();
      return parsed;
    }
  }
  parsed.content = all_.substr(emitted_);
  emitted_ = all_.size();
  return parsed;
}

}  // namespace petrel::serve
