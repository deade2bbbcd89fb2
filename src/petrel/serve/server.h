// `petrel serve`: an OpenAI-compatible HTTP server over one loaded model (cpp-httplib).
//
//   GET  /health               {"status": "ok"}
//   GET  /v1/models            the one model, under ServerOptions::completion.model_name
//   POST /v1/chat/completions  openai_api.h (streaming as server-sent events)
//   POST /v1/completions       the legacy text API: a raw prompt, no chat template
//   POST /tokenize, /detokenize  the model's tokenizer (llama.cpp's and vLLM's shapes; openai_api.h), no model run
//   GET  /slots                each slot's id, context, cached tokens and whether a request runs on it
//   POST /slots/ID?action=save|restore|erase  llama.cpp's slot persistence: a slot's KV cache and its tokens to or
//        from {"filename": NAME} inside ServerOptions::slot_save_path (off, 501, unless set), or forgotten; a restored
//        cache serves the next request whose prompt begins with its tokens (usage.prompt_tokens_details.cached_tokens)
//
// One generation runs at a time (the model is one resource; requests that resend a growing conversation reuse its
// cached prefix, as `petrel chat` does, and with several slots, EngineGenerator, several conversations keep
// theirs); up to max_waiting more requests wait for it,
// and beyond that the server answers 503 at once. It listens on 127.0.0.1 unless told otherwise, bounds the
// body size (413), nesting, messages, generated tokens and the time a generation may run, and answers every
// failure, an exception included, with an OpenAI-style JSON error: a request never takes the server down. A
// streaming client that disconnects stops its generation at the next token.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/runtime/json_schema.h"
#include "petrel/runtime/session.h"
#include "petrel/serve/openai_api.h"
#include "petrel/util/status.h"

namespace httplib {
class Server;
}

namespace petrel::serve {

// The engine's generator: `slots` Sessions over the engine (one by default), reused from request to request. A
// request goes to the slot whose last request's prompt (or restored tokens) it begins with, the longest such: the
// conversation it continues; otherwise to an unused slot, else the least recently used one. So with several slots,
// conversations that take turns each keep their cache (a shared system prompt alone does not make a request
// continue another's conversation). Each slot is a Session with its own KV cache (on the CPU backend a whole
// context's worth each; on the cuda backend the slots take turns on the GPU, Session says how).
class EngineGenerator : public ChatGenerator {
 public:
  static constexpr int kMaxSlots = 64;
  static Result<std::unique_ptr<EngineGenerator>> create(std::shared_ptr<const Engine> engine, int64_t context_length,
                                                         KvType kv_type = KvType::kF16, int slots = 1);
  Result<ChatOutput> generate(const ChatTurn& turn, const GenerationEvents& events) override;
  // Text: tokenized with BOS (not doubled when the text starts with it), special tokens read as special.
  Result<ChatOutput> generate_text(const TextTurn& turn, const GenerationEvents& events) override;
  const Tokenizer* tokenizer() const override { return engine_->tokenizer(); }
  int64_t context_length() const override { return context_length_; }
  int slots() const override { return static_cast<int>(sessions_.size()); }
  Result<int64_t> save_state(int slot, const std::filesystem::path& path) override;
  Result<int64_t> restore_state(int slot, const std::filesystem::path& path) override;
  Result<int64_t> erase_state(int slot) override;
  std::vector<SlotState> slot_states() const override;
  // The slot the next request with these prompt tokens goes to (the rule above).
  int slot_for(std::span<const int32_t> prompt) const;
  // The tool-call format the model's chat template implies, and whether it writes the tools (tool_calls.h).
  ToolCallFormat detected_tool_format() const;
  bool template_writes_tools() const;
  // Sets options.tool_format from a --tool-format name ("auto": detected_tool_format()) and
  // options.template_writes_tools; kInvalidArgument for an unknown name.
  Status configure_tools(std::string_view tool_format, CompletionOptions& options) const;

 private:
  // The prompt through the session (its cached prefix reused), the events reported (started() only when
  // report_start).
  Result<ChatOutput> run_prompt(const ChatPrompt& prompt, const GenerationConfig& generation, const GenerationEvents& events,
                                bool report_start = true);
  // A turn whose answer must begin with turn.output_prefix (tool_choice), after any reasoning.
  Result<ChatOutput> run_forced(const ChatPrompt& prompt, const ChatTurn& turn, const GenerationEvents& events);

  std::shared_ptr<const Engine> engine_;
  std::vector<std::unique_ptr<Session>> sessions_;
  std::vector<uint64_t> last_used_;  // per slot: the request count when it last ran (0: never)
  std::vector<size_t> anchor_;       // per slot: the tokens a prompt must begin with to continue it (0: unused)
  // What slot_states() reads without the model's lock: per slot the cached tokens, and the slot running (-1: none).
  std::unique_ptr<std::atomic<int64_t>[]> cached_tokens_;
  std::atomic<int> running_{-1};
  void note_cached(int slot) { cached_tokens_[slot].store(static_cast<int64_t>(sessions_[slot]->history().size())); }
  uint64_t requests_run_ = 0;
  int64_t context_length_ = 0;
  const std::shared_ptr<const JsonTokenTable>& json_tokens();  // built at first use
  std::shared_ptr<const JsonTokenTable> json_tokens_;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() says which)
  int http_threads = 8;
  int max_waiting = 8;
  double read_timeout_s = 30;   // a client sending its request
  double write_timeout_s = 60;  // a client not reading the answer
  std::string api_key;          // when set, requests need "Authorization: Bearer <api_key>"
  std::string slot_save_path;   // a directory: /slots/ID?action=save|restore on (empty: off)
  std::function<void(const std::string&)> log;  // a line a request, when set
  CompletionOptions completion;
};

class Server {
 public:
  Server(std::shared_ptr<ChatGenerator> generator, ServerOptions options);
  ~Server();
  // Binds the address (kIo naming it when that fails).
  Status bind();
  int port() const { return port_; }
  // Serves until stop() (from any thread). bind() first.
  Status run();
  void stop();

  // Requests answered so far (for logs and tests).
  int64_t requests() const { return requests_.load(); }

 private:
  void install_routes();

  std::shared_ptr<ChatGenerator> generator_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  int listen_socket_ = -1;  // the listening socket, once bound (set by the socket-options hook)
  std::mutex model_mutex_;
  std::atomic<int> waiting_{0};
  std::atomic<int64_t> requests_{0};
};

}  // namespace petrel::serve
