#include "petrel/serve/openai_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <random>

#include "petrel/serve/json_text.h"
#include "petrel/text/reasoning.h"
#include "petrel/text/utf8.h"

namespace petrel::serve {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

ApiError bad(std::string param, std::string message) {
  ApiError e;
  e.param = param;
  e.message = param.empty() ? std::move(message) : param + ": " + message;
  return e;
}

// Random numbers for ids (chatcmpl-..., call_...: unique enough for a client to tell them apart) and seeds.
uint64_t random_u64() {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return rng();
}

std::string random_hex(int digits) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  uint64_t bits = 0;
  for (int i = 0; i < digits; ++i) {
    if (i % 16 == 0) bits = random_u64();
    s += kHex[bits & 15];
    bits >>= 4;
  }
  return s;
}

// The seed of choice 0 (choice i samples with it + i): the request's; for n > 1 without one, a random base, so
// that the choices differ; none for a single unseeded choice (the sampler seeds itself).
std::optional<uint64_t> choice_base_seed(const SamplingRequest& r) {
  if (r.seed) return r.seed;
  if (r.n <= 1) return std::nullopt;
  return random_u64();
}

const char* type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Optional typed fields: absent and null are "not given"; anything of the wrong type is an error naming the key.
std::optional<ApiError> get_number(const ojson& obj, const char* key, double lo, double hi, std::optional<double>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad(key, std::string("expected a number, got ") + type_name(*it));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return bad(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_integer(const ojson& obj, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return bad(key, std::string("expected an integer, got ") + type_name(*it));
  const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : it->get<int64_t>();
  if (v < lo || v > hi) return bad(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const ojson& obj, const char* key, bool& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad(key, std::string("expected a boolean, got ") + type_name(*it));
  out = it->get<bool>();
  return std::nullopt;
}

// A message's content as one string: a string, null (""), or a list of text parts joined by newlines.
std::variant<ojson, ApiError> content_of(const ojson& m, const std::string& where) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return ojson();
  if (it->is_string()) return *it;
  if (!it->is_array()) return bad(where + ".content", std::string("expected a string or a list of parts, got ") + type_name(*it));
  std::string text;
  for (size_t p = 0; p < it->size(); ++p) {
    const ojson& part = (*it)[p];
    const std::string at = where + ".content[" + std::to_string(p) + "]";
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      return bad(at, "only {\"type\": \"text\", \"text\": \"...\"} parts are supported");
    }
    if (p) text += "\n";
    text += part["text"].get<std::string>();
  }
  return ojson(text);
}

std::variant<ojson, ApiError> check_messages(const ojson& messages, const ServeLimits& limits) {
  if (!messages.is_array() || messages.empty()) return bad("messages", "expected a non-empty array");
  if (messages.size() > limits.max_messages) {
    return bad("messages", std::to_string(messages.size()) + " messages, more than the limit " + std::to_string(limits.max_messages));
  }
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where, std::string("expected an object, got ") + type_name(m));
    if (!m.contains("role") || !m["role"].is_string()) return bad(where + ".role", "expected a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "ipython") {
      return bad(where + ".role", "'" + role + "' is not one of system, developer, user, assistant, tool, ipython");
    }
    auto content = content_of(m, where);
    if (auto* e = std::get_if<ApiError>(&content)) return *e;
    ojson n = {{"role", role}, {"content", std::get<ojson>(content)}};
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const ojson& calls = m["tool_calls"];
      if (!calls.is_array()) return bad(where + ".tool_calls", "expected an array");
      ojson checked = ojson::array();
      for (size_t c = 0; c < calls.size(); ++c) {
        const std::string at = where + ".tool_calls[" + std::to_string(c) + "]";
        const ojson& call = calls[c];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          return bad(at, "expected {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
        }
        const ojson& f = call["function"];
        if (!f.contains("name") || !f["name"].is_string()) return bad(at + ".function.name", "expected a string");
        ojson args = f.contains("arguments") ? f["arguments"] : ojson::object();
        if (!args.is_string() && !args.is_object()) return bad(at + ".function.arguments", "expected a JSON string or object");
        ojson checked_call = {{"type", "function"}, {"function", {{"name", f["name"]}, {"arguments", args}}}};
        if (call.contains("id") && call["id"].is_string()) checked_call["id"] = call["id"];
        checked.push_back(std::move(checked_call));
      }
      if (!checked.empty()) n["tool_calls"] = std::move(checked);
    } else if (n["content"].is_null() && role != "assistant") {
      return bad(where + ".content", "a " + role + " message needs content");
    }
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) n["tool_call_id"] = m["tool_call_id"];
    if (m.contains("name") && m["name"].is_string()) n["name"] = m["name"];
    if (n["content"].is_null()) n["content"] = "";
    out.push_back(std::move(n));
  }
  return out;
}

std::variant<ojson, ApiError> check_tools(const ojson& tools) {
  if (tools.is_null()) return ojson();
  if (!tools.is_array()) return bad("tools", std::string("expected an array, got ") + type_name(tools));
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") || !t["function"].is_object()) {
      return bad(where, "expected {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}");
    }
    const ojson& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return bad(where + ".function.name", "expected a non-empty string");
    }
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null()) {
      return bad(where + ".function.parameters", "expected a JSON schema object");
    }
  }
  return tools.empty() ? ojson() : tools;
}

std::string finish_reason_name(StopReason reason, bool calls, bool timed_out) {
  if (calls) return "tool_calls";
  if (timed_out || reason == StopReason::kMaxTokens || reason == StopReason::kContextFull) return "length";
  return "stop";
}

// A request body: within the size limit, JSON, an object, nested no deeper than the limit.
std::variant<ojson, ApiError> parse_body(std::string_view body, const ServeLimits& limits) {
  if (body.size() > limits.max_request_bytes) {
    ApiError e = bad("", "the request body has " + std::to_string(body.size()) + " bytes, more than the limit " +
                             std::to_string(limits.max_request_bytes));
    e.http_status = 413;
    return e;
  }
  ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!j.is_object()) return bad("", std::string("the request body must be a JSON object, got ") + type_name(j));
  if (!json_depth_within(j, limits.max_json_depth)) {
    return bad("", "the request nests arrays/objects deeper than " + std::to_string(limits.max_json_depth));
  }
  return j;
}

// The fields both endpoints share (SamplingRequest); an error names the key.
std::optional<ApiError> parse_sampling(const ojson& j, const ServeLimits& limits, SamplingRequest& r) {
  if (j.contains("model") && j["model"].is_string()) r.model = j["model"].get<std::string>();
  if (auto e = get_bool(j, "stream", r.stream)) return e;
  if (j.contains("stream_options") && j["stream_options"].is_object()) {
    if (auto e = get_bool(j["stream_options"], "include_usage", r.include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  std::optional<double> number;
  if (auto e = get_number(j, "temperature", 0.0, 2.0, number)) return e;
  if (number) r.temperature = static_cast<float>(*number);
  number.reset();
  if (auto e = get_number(j, "top_p", 0.0, 1.0, number)) return e;
  if (number) {
    if (*number <= 0.0) return bad("top_p", "must be greater than 0");
    r.top_p = static_cast<float>(*number);
  }
  number.reset();
  if (auto e = get_number(j, "presence_penalty", -2.0, 2.0, number)) return e;
  r.presence_penalty = static_cast<float>(number.value_or(0.0));
  number.reset();
  if (auto e = get_number(j, "frequency_penalty", -2.0, 2.0, number)) return e;
  r.frequency_penalty = static_cast<float>(number.value_or(0.0));
  std::optional<int64_t> integer;
  if (auto e = get_integer(j, "top_k", -1, 1 << 20, integer)) return e;
  if (integer) r.top_k = static_cast<int32_t>(std::max<int64_t>(*integer, 0));  // -1 (vLLM): off
  integer.reset();
  if (auto e = get_integer(j, "seed", INT64_MIN, INT64_MAX, integer)) return e;
  if (integer) r.seed = static_cast<uint64_t>(*integer);
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    integer.reset();
    if (auto e = get_integer(j, key, 1, INT64_MAX, integer)) return e;
    if (integer) r.max_tokens = std::min(*integer, limits.max_tokens);
  }
  integer.reset();
  if (auto e = get_integer(j, "n", 1, INT64_MAX, integer)) return e;
  if (integer && *integer > limits.max_choices) {
    return bad("n", std::to_string(*integer) + " choices asked for; this server gives at most " + std::to_string(limits.max_choices));
  }
  if (integer) r.n = *integer;
  if (j.contains("stop") && !j["stop"].is_null()) {
    const ojson& s = j["stop"];
    const ojson list = s.is_string() ? ojson::array({s}) : s;
    if (!list.is_array() || list.size() > 16) return bad("stop", "expected a string or up to 16 strings");
    for (const ojson& item : list) {
      if (!item.is_string() || item.get<std::string>().empty()) return bad("stop", "each stop sequence must be a non-empty string");
      r.stop.push_back(item.get<std::string>());
    }
  }
  return std::nullopt;
}

// Sampling as OpenAI defines it (temperature before top-p; 0 is greedy), the server's defaults for what is missing.
GenerationConfig generation_config(const SamplingRequest& request, const CompletionOptions& options) {
  GenerationConfig g;
  SamplerConfig& s = g.sampler;
  s.temperature = request.temperature.value_or(options.defaults.temperature);
  s.top_p = request.top_p.value_or(options.defaults.top_p);
  s.top_k = request.top_k.value_or(options.defaults.top_k);
  s.greedy = s.temperature <= 0.0f;
  s.seed = request.seed;
  s.presence_penalty = request.presence_penalty;
  s.frequency_penalty = request.frequency_penalty;
  s.penalize_last_n = 0;
  s.top_p_after_temperature = true;
  g.max_new_tokens = std::min(request.max_tokens.value_or(options.defaults.max_tokens), options.limits.max_tokens);
  g.stop_strings = request.stop;
  g.logprobs = request.logprobs;
  return g;
}

// A log-probability for JSON: finite (OpenAI writes -9999.0 for "never"; JSON has no -infinity).
double finite_logprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

// usage, with OpenAI's prompt_tokens_details.cached_tokens: the prompt's prefix found in the KV cache (a resent
// conversation's earlier turns, or a state restored through /slots/ID?action=restore), not processed again.
ojson usage_json(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

// The chat API's logprobs.content entries: token text (malformed UTF-8 replaced), logprob, the token's bytes,
// and the alternatives in the same form.
ojson chat_logprobs(const std::vector<LogprobEntry>& entries) {
  auto bytes_of = [](const std::string& token) {
    ojson b = ojson::array();
    for (unsigned char c : token) b.push_back(static_cast<int>(c));
    return b;
  };
  ojson content = ojson::array();
  for (const LogprobEntry& e : entries) {
    ojson top = ojson::array();
    for (const auto& [token, value] : e.top) {
      top.push_back({{"token", utf8::sanitize(token)}, {"logprob", finite_logprob(value)}, {"bytes", bytes_of(token)}});
    }
    content.push_back({{"token", utf8::sanitize(e.token)}, {"logprob", finite_logprob(e.logprob.value_or(0.0f))},
                       {"bytes", bytes_of(e.token)}, {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// The legacy completions layout: parallel lists; top_logprobs a {token: logprob} map holding the alternatives and
// the chosen token (null where the token has no log-probability: a prompt's first); text_offset in bytes of the
// returned text, from `offset`.
ojson legacy_logprobs(const std::vector<LogprobEntry>& entries, size_t offset) {
  ojson tokens = ojson::array(), values = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const LogprobEntry& e : entries) {
    const std::string token = utf8::sanitize(e.token);
    tokens.push_back(token);
    offsets.push_back(offset);
    offset += e.token.size();
    if (!e.logprob) {
      values.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    values.push_back(finite_logprob(*e.logprob));
    ojson top = ojson::object();
    for (const auto& [alt, value] : e.top) {
      const std::string key = utf8::sanitize(alt);
      if (!top.contains(key)) top[key] = finite_logprob(value);
    }
    if (!top.contains(token)) top[token] = finite_logprob(*e.logprob);
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(values)}, {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace

ojson ApiError::to_json() const {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? ojson() : ojson(param)},
                     {"code", http_status == 400 && type == "invalid_request_error" ? ojson() : ojson(http_status)}}}};
}

ApiError api_error_from_status(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case ErrorCode::kOutOfRange:
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kInvalidData:
    case ErrorCode::kNotFound:
      e.http_status = 400;
      break;
    case ErrorCode::kUnsupported:
      e.http_status = 400;
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
  }
  return e;
}

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body, const ServeLimits& limits) {
  auto body_json = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&body_json)) return *e;
  const ojson& j = std::get<ojson>(body_json);
  ChatRequest r;
  auto messages = check_messages(j.contains("messages") ? j["messages"] : ojson(), limits);
  if (auto* e = std::get_if<ApiError>(&messages)) return *e;
  r.messages = std::move(std::get<ojson>(messages));
  auto tools = check_tools(j.contains("tools") ? j["tools"] : ojson());
  if (auto* e = std::get_if<ApiError>(&tools)) return *e;
  r.tools = std::move(std::get<ojson>(tools));

  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const ojson& c = j["tool_choice"];
    if (c.is_string()) {
      r.tool_choice = c.get<std::string>();
      if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tool_choice != "required") {
        return bad("tool_choice", "'" + r.tool_choice + "' is not none, auto, required or {\"type\": \"function\", ...}");
      }
    } else if (c.is_object() && c.contains("function") && c["function"].is_object() && c["function"].contains("name") &&
               c["function"]["name"].is_string()) {
      r.tool_choice = c["function"]["name"].get<std::string>();
      r.forced_function = true;
      bool known = false;
      for (const ojson& t : r.tools.is_array() ? r.tools : ojson::array()) known |= t["function"]["name"] == r.tool_choice;
      if (!known) return bad("tool_choice", "names '" + r.tool_choice + "', which is not in tools");
    } else {
      return bad("tool_choice", "expected a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if ((r.tool_choice == "required" || r.forced_function) && r.tools.is_null()) return bad("tool_choice", "needs tools");
  }

  if (auto e = parse_sampling(j, limits, r)) return *e;
  bool logprobs = false;
  if (auto e = get_bool(j, "logprobs", logprobs)) return *e;
  std::optional<int64_t> top_logprobs;
  if (auto e = get_integer(j, "top_logprobs", 0, 20, top_logprobs)) return *e;
  if (top_logprobs && !logprobs) return bad("top_logprobs", "needs \"logprobs\": true");
  if (logprobs) r.logprobs = static_cast<int>(top_logprobs.value_or(0));
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const ojson& f = j["response_format"];
    const ojson type = f.is_object() && f.contains("type") ? f["type"] : ojson();
    if (!type.is_string()) return bad("response_format", "expected {\"type\": \"text\"} or {\"type\": \"json_object\"}");
    if (type == "json_object") {
      r.json_object = true;
    } else if (type == "json_schema") {
      if (!f.contains("json_schema") || !f["json_schema"].is_object() || !f["json_schema"].contains("schema")) {
        return bad("response_format", "json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
      }
      auto schema = JsonSchema::compile(nlohmann::json::parse(f["json_schema"]["schema"].dump()));
      if (!schema.ok()) return bad("response_format", "json_schema.schema: " + schema.status().message());
      r.schema = *schema;
    } else if (type != "text") {
      return bad("response_format", "type '" + type.get<std::string>() + "' is not text, json_object or json_schema");
    }
    if ((r.json_object || r.schema) && (r.tool_choice == "required" || r.forced_function)) {
      return bad("response_format", "a JSON answer cannot be combined with tool_choice \"required\" or a named function");
    }
  }
  // The reasoning switch, three spellings.
  if (j.contains("reasoning_effort") && j["reasoning_effort"].is_string()) {
    const std::string effort = j["reasoning_effort"].get<std::string>();
    if (effort == "none" || effort == "minimal") r.reasoning = text::ReasoningMode::kOff;
    else if (effort == "low" || effort == "medium" || effort == "high") r.reasoning = text::ReasoningMode::kOn;
    else return bad("reasoning_effort", "'" + effort + "' is not none, minimal, low, medium or high");
  }
  if (j.contains("chat_template_kwargs") && j["chat_template_kwargs"].is_object()) {
    bool thinking = false;
    const ojson& kwargs = j["chat_template_kwargs"];
    if (kwargs.contains("enable_thinking")) {
      if (auto e = get_bool(kwargs, "enable_thinking", thinking)) {
        e->param = "chat_template_kwargs.enable_thinking";
        return *e;
      }
      r.reasoning = thinking ? text::ReasoningMode::kOn : text::ReasoningMode::kOff;
    }
  }
  if (j.contains("reasoning") && j["reasoning"].is_string()) {
    auto mode = text::parse_reasoning_mode(j["reasoning"].get<std::string>());
    if (!mode.ok()) return bad("reasoning", mode.status().message());
    r.reasoning = *mode;
  }
  return r;
}

std::variant<ojson, ApiError> run_chat_completion(ChatGenerator& generator, const ChatRequest& request,
                                                  const CompletionOptions& options,
                                                  const std::function<bool(const std::string&)>& emit) {
  // Tools: shown to the model unless tool_choice is "none"; a named function narrows them to that one.
  ojson tools = request.tool_choice == "none" ? ojson() : request.tools;
  if (request.forced_function) {
    ojson one = ojson::array();
    for (const ojson& t : tools) {
      if (t["function"]["name"] == request.tool_choice) one.push_back(t);
    }
    tools = one;
  }
  const bool use_tools = tools.is_array() && !tools.empty();
  if (use_tools && options.tool_format == ToolCallFormat::kNone) {
    return bad("tools", "this model has no known tool-call format (start petrel serve with --tool-format nemotron, "
                        "llama3-json or hermes)");
  }
  const ToolCallFormat format = use_tools ? options.tool_format : ToolCallFormat::kNone;
  auto prepared = prepare_conversation(request.messages, tools, format, options.template_writes_tools);
  if (!prepared.ok()) return bad("messages", prepared.status().message());

  ChatTurn turn;
  turn.messages = std::move(prepared->messages);
  turn.tools = prepared->tools.is_array() ? &prepared->tools : nullptr;
  turn.prompt.reasoning = request.reasoning;
  turn.prompt.reasoning_style = options.reasoning_style;
  turn.prompt.prefill_empty_thinking_when_off = options.prefill_empty_thinking_when_off;
  turn.generation = generation_config(request, options);
  if (const std::string stop = tool_call_stop_string(format); !stop.empty()) turn.generation.stop_strings.push_back(stop);
  turn.json_object = request.json_object;
  turn.schema = request.schema;
  if (use_tools && (request.tool_choice == "required" || request.forced_function)) {
    turn.output_prefix = tool_call_opener(format, request.forced_function ? request.tool_choice : "");
    turn.call_shape = tool_call_shape(format, tools, request.forced_function);
  }

  const std::string id = "chatcmpl-" + random_hex(24);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options.limits.max_request_seconds));
  const std::optional<uint64_t> base_seed = choice_base_seed(request);
  bool client_gone = false, emitted = false;
  auto emit_event = [&](const std::string& event) {
    if (!request.stream || client_gone) return;
    emitted = true;
    if (!emit(event)) client_gone = true;
  };
  ojson choices = ojson::array();
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  std::string tool_call_error;

  for (int64_t index = 0; index < request.n && !client_gone; ++index) {
    if (base_seed) turn.generation.sampler.seed = *base_seed + static_cast<uint64_t>(index);
    std::vector<LogprobEntry> pending_logprobs;  // streaming: generated since the last chunk, sent with the next
    auto chunk = [&](ojson delta, ojson finish) {
      ojson logprobs;
      if (!pending_logprobs.empty()) {
        logprobs = chat_logprobs(pending_logprobs);
        pending_logprobs.clear();
      }
      ojson c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", options.model_name},
                 {"choices", ojson::array({{{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}}})}};
      return "data: " + c.dump() + "\n\n";
    };

    // The output's text goes through the reasoning split, then (the answer) through the tool-call stream.
    std::optional<text::ReasoningSplitter> splitter;
    ToolCallStream calls_stream(format);
    std::string reasoning, content;
    bool timed_out = false, role_sent = false;
    auto send = [&](const std::string& event) {
      if (!request.stream || client_gone) return;
      if (!role_sent) {
        role_sent = true;
        emit_event(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
      }
      emit_event(event);
    };
    auto route = [&](const text::ReasoningSplit& split) {
      if (!split.reasoning.empty()) {
        reasoning += split.reasoning;
        send(chunk({{"reasoning_content", split.reasoning}}, nullptr));
      }
      if (!split.answer.empty()) {
        const std::string out = calls_stream.feed(split.answer);
        if (!out.empty()) {
          content += out;
          send(chunk({{"content", out}}, nullptr));
        }
      }
    };
    GenerationEvents events;
    events.started = [&](bool starts_in_reasoning) {
      text::ReasoningSplitter::Options o;
      o.starts_in_reasoning = starts_in_reasoning;
      splitter.emplace(o);
    };
    if (request.stream && request.logprobs >= 0) {
      events.logprobs = [&](const LogprobEntry& e) { pending_logprobs.push_back(e); };
    }
    events.text = [&](std::string_view text) {
      if (!splitter) splitter.emplace();
      route(splitter->feed(text));
      if (Clock::now() > deadline) timed_out = true;
      return !client_gone && !timed_out;
    };
    auto output = generator.generate(turn, events);
    if (!output.ok()) {
      ApiError e = api_error_from_status(output.status());
      if (output.status().code() == ErrorCode::kOutOfRange) e.param = "messages";
      if (!request.stream || !emitted) return e;
      if (!client_gone) {
        emit("data: " + e.to_json().dump() + "\n\n");
        emit("data: [DONE]\n\n");
      }
      return ojson();
    }
    if (splitter) route(splitter->finish());
    ParsedToolCalls parsed = calls_stream.finish();
    if (!parsed.content.empty()) {
      content += parsed.content;
      send(chunk({{"content", parsed.content}}, nullptr));
    }
    ojson tool_calls = ojson::array();
    for (size_t i = 0; i < parsed.calls.size(); ++i) {
      tool_calls.push_back({{"id", "call_" + random_hex(24)}, {"type", "function"},
                            {"function", {{"name", parsed.calls[i].name}, {"arguments", parsed.calls[i].arguments}}}});
    }
    if (tool_call_error.empty()) tool_call_error = parsed.error;
    prompt_tokens = output->prompt_tokens;  // the same prompt for every choice
    if (index == 0) cached_tokens = output->cached_tokens;  // the later choices find all of it cached
    completion_tokens += output->completion_tokens;
    const std::string finish = finish_reason_name(output->reason, !tool_calls.empty(), timed_out);
    if (request.stream) {
      for (size_t i = 0; i < tool_calls.size(); ++i) {
        ojson call = tool_calls[i];
        call["index"] = i;
        send(chunk({{"tool_calls", ojson::array({call})}}, nullptr));
      }
      send(chunk(ojson::object(), finish));
      continue;
    }
    // Non-streaming: the text before a call, trimmed as the parsers do; null when only calls remain.
    if (!tool_calls.empty()) {
      while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) content.pop_back();
    }
    ojson message = {{"role", "assistant"}, {"content", tool_calls.empty() || !content.empty() ? ojson(content) : ojson()}};
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
    choices.push_back({{"index", index}, {"message", std::move(message)},
                       {"logprobs", request.logprobs >= 0 ? chat_logprobs(output->logprobs) : ojson()},
                       {"finish_reason", finish}});
  }

  const ojson usage = usage_json(prompt_tokens, cached_tokens, completion_tokens);
  if (request.stream) {
    if (request.include_usage) {
      ojson u = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", options.model_name},
                 {"choices", ojson::array()}, {"usage", usage}};
      emit_event("data: " + u.dump() + "\n\n");
    }
    emit_event("data: [DONE]\n\n");
    return ojson();
  }
  ojson result = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", options.model_name},
                  {"choices", std::move(choices)}, {"usage", usage}};
  if (!tool_call_error.empty()) result["petrel_tool_call_error"] = tool_call_error;
  return result;
}

std::variant<TextCompletionRequest, ApiError> parse_text_completion_request(std::string_view body, const ServeLimits& limits) {
  auto body_json = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&body_json)) return *e;
  const ojson& j = std::get<ojson>(body_json);
  TextCompletionRequest r;
  const ojson prompt = j.contains("prompt") ? j["prompt"] : ojson();
  if (prompt.is_string()) {
    r.prompt = prompt.get<std::string>();
  } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
    r.prompt = prompt[0].get<std::string>();
  } else if (prompt.is_array() && !prompt.empty() && std::all_of(prompt.begin(), prompt.end(), [](const ojson& t) { return t.is_number_integer(); })) {
    r.tokens_given = true;
    for (const ojson& t : prompt) {
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > INT32_MAX) return bad("prompt", "token id " + std::to_string(id) + " is out of range");
      r.prompt_tokens.push_back(static_cast<int32_t>(id));
    }
  } else if (prompt.is_array() && !prompt.empty()) {
    return bad("prompt", "one prompt a request: a string, or a list of token ids");
  } else {
    return bad("prompt", "expected a non-empty string or a list of token ids");
  }
  if (!r.tokens_given && r.prompt.empty()) return bad("prompt", "expected a non-empty string or a list of token ids");
  if (auto e = parse_sampling(j, limits, r)) return *e;
  if (!r.max_tokens) r.max_tokens = std::min<int64_t>(16, limits.max_tokens);  // OpenAI's default for this endpoint
  if (auto e = get_bool(j, "echo", r.echo)) return *e;
  std::optional<int64_t> logprobs;
  if (auto e = get_integer(j, "logprobs", 0, 20, logprobs)) return *e;
  if (logprobs) r.logprobs = static_cast<int>(*logprobs);
  if (logprobs && r.echo && r.stream) {
    return bad("logprobs", "the prompt's log-probabilities (echo with logprobs) are not streamed; ask without \"stream\"");
  }
  if (j.contains("suffix") && !j["suffix"].is_null()) return bad("suffix", "suffix (insertion) is not supported");
  std::optional<int64_t> best_of;
  if (auto e = get_integer(j, "best_of", 1, INT64_MAX, best_of)) return *e;
  if (best_of && *best_of != 1) return bad("best_of", "only best_of = 1 is supported");
  return r;
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body, const ServeLimits& limits) {
  auto body_json = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&body_json)) return *e;
  const ojson& j = std::get<ojson>(body_json);
  TokenizeRequest r;
  const bool content = j.contains("content") && !j["content"].is_null();
  const char* key = content ? "content" : "prompt";
  if (!j.contains(key) || !j[key].is_string()) return bad(key, "expected the text to tokenize as a string (\"content\" or \"prompt\")");
  r.text = j[key].get<std::string>();
  r.add_special = !content;  // llama.cpp's default for "content", vLLM's for "prompt"
  for (const char* flag : {"add_special", "add_special_tokens"}) {
    if (auto e = get_bool(j, flag, r.add_special)) return *e;
  }
  if (auto e = get_bool(j, "parse_special", r.parse_special)) return *e;
  if (auto e = get_bool(j, "with_pieces", r.with_pieces)) return *e;
  return r;
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body, const ServeLimits& limits) {
  auto body_json = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&body_json)) return *e;
  const ojson& j = std::get<ojson>(body_json);
  if (!j.contains("tokens") || !j["tokens"].is_array()) return bad("tokens", "expected a list of token ids");
  DetokenizeRequest r;
  for (const ojson& t : j["tokens"]) {
    if (!t.is_number_integer()) return bad("tokens", "expected a list of token ids, got " + std::string(type_name(t)));
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id > INT32_MAX) return bad("tokens", "token id " + std::to_string(id) + " is out of range");
    r.tokens.push_back(static_cast<int32_t>(id));
  }
  return r;
}

std::variant<SlotFileRequest, ApiError> parse_slot_file_request(std::string_view body, const ServeLimits& limits) {
  auto body_json = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&body_json)) return *e;
  const ojson& j = std::get<ojson>(body_json);
  if (!j.contains("filename") || !j["filename"].is_string()) return bad("filename", "expected a file name (a string)");
  SlotFileRequest r{j["filename"].get<std::string>()};
  const bool plain = std::all_of(r.filename.begin(), r.filename.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
  if (r.filename.empty() || r.filename.size() > 200 || r.filename[0] == '.' || !plain) {
    return bad("filename", "a plain file name inside the server's --slot-save-path: 1 to 200 of letters, digits, '.', "
                           "'_', '-', not starting with '.'");
  }
  return r;
}

std::variant<ojson, ApiError> run_text_completion(ChatGenerator& generator, const TextCompletionRequest& request,
                                                  const CompletionOptions& options,
                                                  const std::function<bool(const std::string&)>& emit) {
  TextTurn turn;
  turn.prompt = request.prompt;
  turn.tokens = request.prompt_tokens;
  turn.tokens_given = request.tokens_given;
  turn.generation = generation_config(request, options);
  if (request.echo && request.logprobs >= 0) turn.generation.prompt_logprobs = request.logprobs;
  const std::string id = "cmpl-" + random_hex(24);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options.limits.max_request_seconds));
  const std::optional<uint64_t> base_seed = choice_base_seed(request);
  bool client_gone = false, sent = false;
  auto send = [&](const std::string& event) {
    if (!request.stream || client_gone) return;
    sent = true;
    if (!emit(event)) client_gone = true;
  };
  ojson choices = ojson::array();
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  std::vector<LogprobEntry> prompt_logprobs;  // echo with logprobs: the prompt's, from the first choice

  for (int64_t index = 0; index < request.n && !client_gone; ++index) {
    if (base_seed) turn.generation.sampler.seed = *base_seed + static_cast<uint64_t>(index);
    std::vector<LogprobEntry> pending_logprobs;  // streaming: generated since the last chunk, sent with the next
    size_t text_offset = 0;
    auto chunk = [&](const std::string& text, ojson finish) {
      ojson logprobs;
      if (!pending_logprobs.empty()) {
        logprobs = legacy_logprobs(pending_logprobs, text_offset);
        for (const LogprobEntry& e : pending_logprobs) text_offset += e.token.size();
        pending_logprobs.clear();
      }
      ojson c = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", options.model_name},
                 {"choices", ojson::array({{{"text", text}, {"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}}})}};
      return "data: " + c.dump() + "\n\n";
    };
    bool timed_out = false;
    std::string text = request.echo && !request.tokens_given ? request.prompt : "";
    if (!text.empty()) send(chunk(text, nullptr));
    GenerationEvents events;
    if (request.echo && request.tokens_given) {
      events.prompt_text = [&](std::string_view prompt) {
        text = prompt;
        if (!text.empty()) send(chunk(text, nullptr));
      };
    }
    if (request.stream && request.logprobs >= 0) {
      events.logprobs = [&](const LogprobEntry& e) { pending_logprobs.push_back(e); };
    }
    events.text = [&](std::string_view piece) {
      text.append(piece);
      send(chunk(std::string(piece), nullptr));
      if (Clock::now() > deadline) timed_out = true;
      return !client_gone && !timed_out;
    };
    auto output = generator.generate_text(turn, events);
    if (!output.ok()) {
      ApiError e = api_error_from_status(output.status());
      if (output.status().code() == ErrorCode::kOutOfRange || output.status().code() == ErrorCode::kInvalidArgument) e.param = "prompt";
      if (!request.stream || !sent) return e;
      if (!client_gone) {
        emit("data: " + e.to_json().dump() + "\n\n");
        emit("data: [DONE]\n\n");
      }
      return ojson();
    }
    prompt_tokens = output->prompt_tokens;  // the same prompt for every choice
    if (index == 0) cached_tokens = output->cached_tokens;  // the later choices find all of it cached
    completion_tokens += output->completion_tokens;
    if (index == 0) {
      prompt_logprobs = std::move(output->prompt_logprobs);
      turn.generation.prompt_logprobs = -1;  // the later choices reuse the first's (and the prompt's KV cache)
    }
    const std::string finish = finish_reason_name(output->reason, false, timed_out);
    if (request.stream) {
      send(chunk("", finish));
      continue;
    }
    ojson logprobs;
    if (request.logprobs >= 0) {
      std::vector<LogprobEntry> entries = request.echo ? prompt_logprobs : std::vector<LogprobEntry>{};
      entries.insert(entries.end(), output->logprobs.begin(), output->logprobs.end());
      logprobs = legacy_logprobs(entries, 0);
    }
    choices.push_back({{"text", text}, {"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}});
  }

  const ojson usage = usage_json(prompt_tokens, cached_tokens, completion_tokens);
  if (request.stream) {
    if (request.include_usage) {
      send("data: " + ojson({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", options.model_name},
                             {"choices", ojson::array()}, {"usage", usage}}).dump() + "\n\n");
    }
    send("data: [DONE]\n\n");
    return ojson();
  }
  return ojson{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", options.model_name},
               {"choices", std::move(choices)}, {"usage", usage}};
}

}  // namespace petrel::serve
