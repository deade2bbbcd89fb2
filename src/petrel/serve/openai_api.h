// The OpenAI chat completions protocol, apart from HTTP: a request's JSON checked into a typed ChatRequest, a
// completion run through a ChatGenerator (a model, or a script in tests), and the answer written as one
// chat.completion object or as server-sent-event chunks (chat.completion.chunk ... then [DONE]).
//
// What a request may hold (anything else is ignored, as OpenAI does with unknown keys; values of the wrong type
// are a 400 naming the key): model, messages (system/developer, user, assistant with content and tool_calls,
// tool/ipython results; content as a string, null, or a list of text parts), tools and tool_choice ("none",
// "auto", "required", or {"type": "function", "function": {"name"}}), stream and stream_options.include_usage,
// logprobs and top_logprobs (0-20; the log-softmax of the model's raw logits, as vLLM reports by default),
// max_tokens / max_completion_tokens, temperature, top_p, top_k (an extension, as vLLM), seed, stop (a string or
// up to 4), presence_penalty, frequency_penalty, n (choices, up to ServeLimits::max_choices), and the reasoning
// switch: "reasoning": "on"|"off"|
// "default" (petrel), chat_template_kwargs.enable_thinking (vLLM's convention) or reasoning_effort ("none" or
// "minimal" off, "low"/"medium"/"high" on), response_format {"type": "text"}, {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"schema": ...}} (constrained decoding; the schema subset is in
// runtime/json_schema.h).
//
// n > 1: the choices are generated one after another (one model, one KV cache: the prompt is processed once and
// its cache reused), choice i sampled with seed + i when the request has a seed (else from one random base seed),
// so a seeded request is repeatable; streamed, each choice's chunks (its own role delta first, its finish_reason
// last) come before the next choice's, each with its "index". usage counts the prompt once and every choice's
// tokens. The request's time limit covers all its choices.
//
// The answer: message.content (null when the answer is only tool calls), message.reasoning_content (the text
// inside <think>...</think>, vLLM's field), message.tool_calls ({id, type: "function", function: {name,
// arguments}}), finish_reason "stop", "length" or "tool_calls", and exact usage counts (prompt_tokens counts the
// whole rendered prompt, also the part found in the KV cache).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/runtime/generate.h"
#include "petrel/runtime/prompt.h"
#include "petrel/runtime/session.h"
#include "petrel/serve/tool_calls.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/status.h"

namespace petrel::serve {

struct ServeLimits {
  size_t max_request_bytes = 4u << 20;  // the HTTP body
  int max_json_depth = 64;              // nesting of arrays and objects in a request
  size_t max_messages = 4096;
  int64_t max_tokens = 4096;            // the most a request may generate (its own max_tokens is clamped to this)
  double max_request_seconds = 600;     // a request running longer stops with finish_reason "length"
  int64_t max_choices = 16;             // the largest n (choices a request may ask for)
};

// Server-wide defaults for what a request leaves out.
struct ChatDefaults {
  float temperature = 1.0f;  // OpenAI's defaults
  float top_p = 1.0f;
  int32_t top_k = 0;
  int64_t max_tokens = 1024;
};

// What both endpoints read: streaming, sampling and length.
struct SamplingRequest {
  std::string model;
  bool stream = false;
  bool include_usage = false;
  std::optional<float> temperature, top_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_tokens;
  float presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::string> stop;
  int logprobs = -1;  // -1: none; else each generated token's log-probability with this many alternatives
  int64_t n = 1;      // choices: generated one after another, the prompt's KV cache reused
};

struct ChatRequest : SamplingRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null or a non-empty array of {"type": "function", "function": {...}}
  std::string tool_choice = "auto";  // "none", "auto", "required"; or a function's name (the call is required)
  bool forced_function = false;      // tool_choice named a function
  bool json_object = false;          // response_format {"type": "json_object"}: the answer is one JSON object
  std::shared_ptr<const JsonSchema> schema;  // response_format json_schema, compiled
  text::ReasoningMode reasoning = text::ReasoningMode::kDefault;
};

// POST /v1/completions (the legacy text API): the prompt as text (tokenized with BOS, special tokens in it read
// as special, since a raw prompt is the model's own input) or as token ids; `echo` puts the prompt text (token
// ids decoded) in front of the answer. `logprobs` (0-20) gives each token's log-probability and that many
// alternatives in the legacy layout (tokens, token_logprobs, top_logprobs, text_offset); with `echo` the prompt's
// tokens come first (the first with null), which is how scoring harnesses (lm-evaluation-harness) ask for a
// text's likelihood. One prompt a request; suffix, best_of other than 1, and echo with logprobs while streaming
// are refused.
struct TextCompletionRequest : SamplingRequest {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  bool tokens_given = false;
  bool echo = false;
};

// POST /tokenize and /detokenize (llama.cpp's and vLLM's extensions: the model's tokenizer, no model run). The text
// as "content" (llama.cpp) or "prompt" (vLLM); "add_special" / "add_special_tokens" (default: false for "content",
// true for "prompt", as each server does), "parse_special" (default true: "<|eot_id|>" written in the text is that
// token), "with_pieces" (each token as {"id", "piece"}). /detokenize takes "tokens" (ids).
struct TokenizeRequest {
  std::string text;
  bool add_special = false;
  bool parse_special = true;
  bool with_pieces = false;
};
struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};

// POST /slots/0?action=save|restore (llama.cpp's slot persistence): {"filename": NAME}, a plain file name inside
// the server's --slot-save-path (letters, digits, '.', '_', '-'; not starting with '.'; at most 200 bytes).
struct SlotFileRequest {
  std::string filename;
};

// An error for the client: HTTP status, OpenAI error type and the parameter at fault.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // may be empty
  nlohmann::ordered_json to_json() const;
};

// Parses and checks a request body. Every failure names the key (e.g. "messages[2].content: expected a string").
std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body, const ServeLimits& limits);

std::variant<TextCompletionRequest, ApiError> parse_text_completion_request(std::string_view body, const ServeLimits& limits);

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body, const ServeLimits& limits);
std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body, const ServeLimits& limits);
std::variant<SlotFileRequest, ApiError> parse_slot_file_request(std::string_view body, const ServeLimits& limits);

// What a generator is asked to do: the prepared conversation (tool_calls.h) and how to sample.
struct ChatTurn {
  nlohmann::ordered_json messages;
  const nlohmann::ordered_json* tools = nullptr;  // for the template; null when none
  ChatPromptOptions prompt;
  GenerationConfig generation;
  // When set (tool_choice "required" or a named function: tool_call_opener), the answer is made to begin with this
  // text, after the reasoning when the model reasons first; the generator reports it as output text.
  std::string output_prefix;
  // With output_prefix: the rest of the call, constrained (the name one of the tools', the arguments an object).
  std::optional<CallShapeSpec> call_shape;
  // JSON mode: generation constrained to one JSON object (runtime/json_constraint.h), from the first token; with
  // a schema, to one object the schema allows (runtime/json_schema.h).
  bool json_object = false;
  std::shared_ptr<const JsonSchema> schema;
};

// One token's log-probability as the API reports it.
struct LogprobEntry {
  std::string token;             // the token's bytes (for byte-level tokens possibly part of a UTF-8 character)
  std::optional<float> logprob;  // none for the first token of a prompt
  std::vector<std::pair<std::string, float>> top;  // the most likely tokens, most likely first
};

// A slot as GET /slots shows it (ChatGenerator::slot_states), read without waiting for the model.
struct SlotState {
  int id = 0;
  int64_t n_ctx = 0;          // the context length
  int64_t cached_tokens = 0;  // tokens in its KV cache after its last request, restore or erase
  bool is_processing = false;  // a request runs on it now
};

struct ChatOutput {
  std::string text;  // decoded, stop strings removed
  StopReason reason = StopReason::kMaxTokens;
  int64_t prompt_tokens = 0;      // the whole prompt
  int64_t cached_tokens = 0;      // of those, the prefix whose keys and values were already in the KV cache
  int64_t completion_tokens = 0;  // generated, stop token included
  std::vector<int32_t> tokens;    // the generated ids (generators that have them)
  std::vector<LogprobEntry> logprobs;         // each generated token's (generation.logprobs >= 0)
  std::vector<LogprobEntry> prompt_logprobs;  // each prompt token's (generation.prompt_logprobs >= 0)
};

// What a generator reports while it runs: started() once the prompt is built, before any text (whether the
// prompt left the output inside an opened <think> block); text() with the decoded text as it comes (return
// false to stop).
struct GenerationEvents {
  std::function<void(bool starts_in_reasoning)> started;
  std::function<bool(std::string_view)> text;
  std::function<void(const LogprobEntry&)> logprobs;  // each generated token's, before its text (when asked for)
  std::function<void(std::string_view)> prompt_text;  // text completions of token ids: the prompt decoded, first
};

// A raw prompt (POST /v1/completions): its text, or its token ids when tokens_given.
struct TextTurn {
  std::string prompt;
  std::vector<int32_t> tokens;
  bool tokens_given = false;
  GenerationConfig generation;
};

// Runs one turn. Implementations: the engine's (serve/server.h) and scripted ones in tests.
class ChatGenerator {
 public:
  virtual ~ChatGenerator() = default;
  virtual Result<ChatOutput> generate(const ChatTurn& turn, const GenerationEvents& events) = 0;
  // A raw prompt, no chat template; generators that cannot say kUnsupported.
  virtual Result<ChatOutput> generate_text(const TextTurn& turn, const GenerationEvents& events) {
    return unsupported("this generator takes chat messages only");
  }
  // The model's tokenizer (thread-safe; /tokenize and /detokenize use it without waiting for the model) and its
  // context length; null and 0 for generators without one.
  virtual const Tokenizer* tokenizer() const { return nullptr; }
  virtual int64_t context_length() const { return 0; }
  // The KV caches it keeps (slots, llama.cpp's word), numbered 0 to slots() - 1.
  virtual int slots() const { return 1; }
  // A slot's KV cache and its tokens to or from a file (Session::save / restore), or forgotten: the positions
  // saved, restored or erased. Generators without a cache say kUnsupported.
  virtual Result<int64_t> save_state(int slot, const std::filesystem::path& path) { return unsupported("this generator keeps no KV cache"); }
  virtual Result<int64_t> restore_state(int slot, const std::filesystem::path& path) { return unsupported("this generator keeps no KV cache"); }
  virtual Result<int64_t> erase_state(int slot) { return unsupported("this generator keeps no KV cache"); }
  // Every slot's state, without waiting for a running request (thread-safe); empty for generators without.
  virtual std::vector<SlotState> slot_states() const { return {}; }
};

struct CompletionOptions {
  std::string model_name = "petrel";
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  bool template_writes_tools = false;  // tool_calls.h: else petrel writes kNemotron's tags into the messages
  ChatDefaults defaults;
  ServeLimits limits;
  std::optional<text::ReasoningStyle> reasoning_style;  // unset: detected from the template
  bool prefill_empty_thinking_when_off = true;
};

// Runs a checked request. Streaming requests write each server-sent event through `emit` ("data: {...}\n\n",
// the last "data: [DONE]\n\n"; emit returns false when the client has gone, which stops generation) and return
// null; others return the chat.completion object. An ApiError comes back only before anything was emitted
// (later failures are sent as an error event and the stream is closed).
std::variant<nlohmann::ordered_json, ApiError> run_chat_completion(ChatGenerator& generator, const ChatRequest& request,
                                                                  const CompletionOptions& options,
                                                                  const std::function<bool(const std::string&)>& emit);

// The same for a text completion (object "text_completion"; choices[0].text).
std::variant<nlohmann::ordered_json, ApiError> run_text_completion(ChatGenerator& generator, const TextCompletionRequest& request,
                                                                  const CompletionOptions& options,
                                                                  const std::function<bool(const std::string&)>& emit);

// An ApiError for a library Status (context full: 400 with code context_length_exceeded; bad input 400; other 500).
ApiError api_error_from_status(const Status& status);

}  // namespace petrel::serve
