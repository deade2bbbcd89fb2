#include "petrel/serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <type_traits>

#include "petrel/text/utf8.h"

namespace petrel::serve {

namespace {

using ojson = nlohmann::ordered_json;

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.http_status, e.to_json()); }

ApiError simple_error(int status, std::string type, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  return e;
}

// Holds a place in the line for the model: counted while waiting and running.
class WaitingSlot {
 public:
  explicit WaitingSlot(std::atomic<int>& waiting) : waiting_(waiting) { waiting_.fetch_add(1); }
  ~WaitingSlot() { waiting_.fetch_sub(1); }
  WaitingSlot(const WaitingSlot&) = delete;
  WaitingSlot& operator=(const WaitingSlot&) = delete;

 private:
  std::atomic<int>& waiting_;
};

}  // namespace

Result<std::unique_ptr<EngineGenerator>> EngineGenerator::create(std::shared_ptr<const Engine> engine, int64_t context_length,
                                                                 KvType kv_type, int slots) {
  if (!engine->tokenizer() || !engine->templates()) {
    return invalid_argument("serve: the model needs tokenizer.json and a chat template (tokenizer_config.json)");
  }
  if (slots < 1 || slots > kMaxSlots) {
    return invalid_argument("serve: slots must be 1 to " + std::to_string(kMaxSlots) + ", got " + std::to_string(slots));
  }
  auto generator = std::unique_ptr<EngineGenerator>(new EngineGenerator());
  for (int i = 0; i < slots; ++i) {
    auto session = Session::create(engine, context_length, kv_type);
    if (!session.ok()) return session.status().with_context("serve: slot " + std::to_string(i));
    generator->sessions_.push_back(std::move(session).value());
  }
  generator->last_used_.assign(slots, 0);
  generator->anchor_.assign(slots, 0);
  generator->cached_tokens_ = std::make_unique<std::atomic<int64_t>[]>(slots);
  generator->engine_ = std::move(engine);
  generator->context_length_ = context_length;
  return generator;
}

ToolCallFormat EngineGenerator::detected_tool_format() const {
  return detect_tool_call_format(engine_->templates()->select(/*has_tools=*/true).source());
}

bool EngineGenerator::template_writes_tools() const {
  return serve::template_writes_tools(engine_->templates()->select(/*has_tools=*/true).source());
}

Status EngineGenerator::configure_tools(std::string_view tool_format, CompletionOptions& options) const {
  options.template_writes_tools = template_writes_tools();
  if (tool_format == "auto") {
    options.tool_format = detected_tool_format();
    return ok_status();
  }
  PETREL_ASSIGN_OR_RETURN(options.tool_format, parse_tool_call_format(tool_format));
  return ok_status();
}

const std::shared_ptr<const JsonTokenTable>& EngineGenerator::json_tokens() {
  if (!json_tokens_) {
    json_tokens_ = JsonTokenTable::build(*engine_->tokenizer(), static_cast<int32_t>(engine_->model().config().vocab_size));
  }
  return json_tokens_;
}

Result<ChatOutput> EngineGenerator::generate(const ChatTurn& turn, const GenerationEvents& events) {
  PETREL_ASSIGN_OR_RETURN(ChatPrompt prompt, build_chat_prompt(*engine_->tokenizer(), *engine_->templates(), turn.messages,
                                                               turn.tools, turn.prompt));
  if (!turn.output_prefix.empty()) return run_forced(prompt, turn, events);
  if (!turn.json_object && !turn.schema) return run_prompt(prompt, turn.generation, events);
  const std::vector<int32_t> ends = turn.generation.stop_token_ids.value_or(engine_->model().config().eos_token_ids);
  std::optional<JsonObjectConstraint> object;
  std::optional<JsonSchemaConstraint> schema;
  GenerationConfig config = turn.generation;
  if (turn.schema) config.constraint = &schema.emplace(json_tokens(), turn.schema, ends);
  else config.constraint = &object.emplace(json_tokens(), ends);
  return run_prompt(prompt, config, events);
}

// The prefix follows the prompt at once, unless the model reasons first (the prompt opened <think>, or reasoning
// is on): then the answer runs until its </think> and the prefix follows that. A model asked to reason that
// opens no <think> block (the first 7 characters tell) gets the prefix right after the prompt, its few tokens
// dropped unseen. The prefix's tokens count as generated; the output text holds it where it was inserted.
Result<ChatOutput> EngineGenerator::run_forced(const ChatPrompt& prompt, const ChatTurn& turn, const GenerationEvents& events) {
  if (events.started) events.started(prompt.starts_in_reasoning);
  ChatOutput thought;  // the reasoning, when kept
  int64_t cached = -1;  // the prompt's cached prefix, as the first of two runs found it
  if (prompt.starts_in_reasoning || turn.prompt.reasoning == text::ReasoningMode::kOn) {
    bool decided = prompt.starts_in_reasoning, thinking = prompt.starts_in_reasoning, closed = false, client_gone = false;
    std::string seen, held_text;
    std::vector<LogprobEntry> held_logprobs;
    auto pass = [&](std::string_view text) {
      if (!text.empty() && events.text && !events.text(text)) client_gone = true;
      return !client_gone;
    };
    GenerationEvents phase;
    phase.logprobs = [&](const LogprobEntry& e) {
      if (!decided) held_logprobs.push_back(e);
      else if (events.logprobs) events.logprobs(e);
    };
    phase.text = [&](std::string_view piece) {
      seen += piece;
      if (!decided) {
        const size_t first = seen.find_first_not_of(" \t\r\n");
        if (first == std::string::npos || seen.size() - first < 7) {
          held_text += piece;
          return true;
        }
        decided = true;
        thinking = seen.compare(first, 7, "<think>") == 0;
        if (!thinking) return false;
        if (events.logprobs) for (const LogprobEntry& e : held_logprobs) events.logprobs(e);
        if (!pass(held_text)) return false;
      }
      if (!pass(piece)) return false;
      closed = seen.find("</think>") != std::string::npos;
      return !closed;
    };
    PETREL_ASSIGN_OR_RETURN(thought, run_prompt(prompt, turn.generation, phase, /*report_start=*/false));
    cached = thought.cached_tokens;
    if (client_gone || (thinking && !closed)) return thought;  // gone, or the reasoning did not end: as it came
    if (!thinking) thought = ChatOutput{};                    // no <think> block: dropped unseen
  }
  const std::string& prefix = turn.output_prefix;
  PETREL_ASSIGN_OR_RETURN(std::vector<int32_t> prefix_tokens,
                          engine_->tokenizer()->encode(prefix, EncodeOptions{.add_special = false, .parse_special = true,
                                                                             .untrusted_ranges = {}}));
  ChatOutput out;
  out.prompt_tokens = static_cast<int64_t>(prompt.tokens.size());
  const int64_t used = thought.completion_tokens + static_cast<int64_t>(prefix_tokens.size());
  if (events.text && !events.text(prefix)) return thought;
  if (used >= turn.generation.max_new_tokens) {
    out.cached_tokens = std::max<int64_t>(cached, 0);
    out.text = thought.text + prefix;
    out.completion_tokens = used;
    out.tokens = thought.tokens;
    out.tokens.insert(out.tokens.end(), prefix_tokens.begin(), prefix_tokens.end());
    out.logprobs = std::move(thought.logprobs);
    return out;
  }
  ChatPrompt forced;
  forced.tokens = prompt.tokens;
  forced.tokens.insert(forced.tokens.end(), thought.tokens.begin(), thought.tokens.end());
  forced.tokens.insert(forced.tokens.end(), prefix_tokens.begin(), prefix_tokens.end());
  GenerationConfig rest = turn.generation;
  rest.max_new_tokens -= used;
  std::optional<CallShapeConstraint> shape;
  if (turn.call_shape) {  // the name one of the tools', the arguments an object, then the format's close
    shape.emplace(json_tokens(), *turn.call_shape, rest.stop_token_ids.value_or(engine_->model().config().eos_token_ids));
    rest.constraint = &*shape;
  }
  PETREL_ASSIGN_OR_RETURN(out, run_prompt(forced, rest, events, /*report_start=*/false));
  out.text = thought.text + prefix + out.text;
  out.prompt_tokens = static_cast<int64_t>(prompt.tokens.size());
  out.cached_tokens = cached >= 0 ? cached : std::min(out.cached_tokens, out.prompt_tokens);
  out.completion_tokens += used;
  out.tokens.insert(out.tokens.begin(), prefix_tokens.begin(), prefix_tokens.end());
  out.tokens.insert(out.tokens.begin(), thought.tokens.begin(), thought.tokens.end());
  thought.logprobs.insert(thought.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  out.logprobs = std::move(thought.logprobs);
  return out;
}

Result<ChatOutput> EngineGenerator::run_prompt(const ChatPrompt& prompt, const GenerationConfig& generation,
                                               const GenerationEvents& events, bool report_start) {
  if (report_start && events.started) events.started(prompt.starts_in_reasoning);
  auto on_token = [&](int32_t, std::string_view text) { return text.empty() || !events.text || events.text(text); };
  const Tokenizer& tokenizer = *engine_->tokenizer();
  auto entry = [&](const TokenLogprobs& lp) {
    LogprobEntry e;
    e.token = tokenizer.token_bytes(lp.token).value_or("");
    e.logprob = lp.logprob;
    for (const auto& [id, value] : lp.top) e.top.emplace_back(tokenizer.token_bytes(id).value_or(""), value);
    return e;
  };
  ChatOutput out;
  GenerationConfig config = generation;
  if (config.logprobs >= 0) {
    config.on_logprobs = [&](const TokenLogprobs& lp) {
      out.logprobs.push_back(entry(lp));
      if (events.logprobs) events.logprobs(out.logprobs.back());
    };
  }
  const int slot = slot_for(prompt.tokens);
  last_used_[slot] = ++requests_run_;
  anchor_[slot] = prompt.tokens.size();
  running_.store(slot);
  Result<QueryResult> queried = sessions_[slot]->query_prompt(prompt, config, on_token);
  note_cached(slot);
  running_.store(-1);
  PETREL_ASSIGN_OR_RETURN(QueryResult result, std::move(queried));
  out.text = std::move(result.text);
  out.tokens = std::move(result.tokens);
  out.reason = result.reason;
  out.prompt_tokens = static_cast<int64_t>(prompt.tokens.size());
  out.cached_tokens = std::min(result.stats.reused_tokens, out.prompt_tokens);
  out.completion_tokens = result.stats.generated_tokens;
  if (config.prompt_logprobs >= 0) {  // the whole prompt ran again: its first token, then one entry a later token
    out.prompt_logprobs.push_back(LogprobEntry{tokenizer.token_bytes(prompt.tokens.front()).value_or(""), std::nullopt, {}});
    for (const TokenLogprobs& lp : result.prompt_logprobs) out.prompt_logprobs.push_back(entry(lp));
  }
  return out;
}

int EngineGenerator::slot_for(std::span<const int32_t> prompt) const {
  if (sessions_.size() == 1) return 0;
  int best = -1;
  size_t best_common = 0;
  for (size_t i = 0; i < sessions_.size(); ++i) {
    if (anchor_[i] == 0) continue;
    const std::vector<int32_t>& cached = sessions_[i]->history();
    size_t common = 0;
    while (common < cached.size() && common < prompt.size() && cached[common] == prompt[common]) ++common;
    if (common >= anchor_[i] && common > best_common) {
      best = static_cast<int>(i);
      best_common = common;
    }
  }
  if (best >= 0) return best;
  return static_cast<int>(std::min_element(last_used_.begin(), last_used_.end()) - last_used_.begin());
}

std::vector<SlotState> EngineGenerator::slot_states() const {
  std::vector<SlotState> states(sessions_.size());
  const int running = running_.load();
  for (size_t i = 0; i < states.size(); ++i) {
    states[i] = {static_cast<int>(i), context_length_, cached_tokens_[i].load(), running == static_cast<int>(i)};
  }
  return states;
}

Result<int64_t> EngineGenerator::save_state(int slot, const std::filesystem::path& path) {
  PETREL_RETURN_IF_ERROR(sessions_.at(slot)->save(path));
  return sessions_[slot]->position();
}

Result<int64_t> EngineGenerator::restore_state(int slot, const std::filesystem::path& path) {
  const Status restored = sessions_.at(slot)->restore(path);
  note_cached(slot);  // a failed restore may have emptied the slot
  PETREL_RETURN_IF_ERROR(restored);
  last_used_[slot] = ++requests_run_;
  anchor_[slot] = sessions_[slot]->history().size();
  return sessions_[slot]->position();
}

Result<int64_t> EngineGenerator::erase_state(int slot) {
  const int64_t n = sessions_.at(slot)->position();
  sessions_[slot]->reset();
  anchor_[slot] = 0;
  note_cached(slot);
  return n;
}

Result<ChatOutput> EngineGenerator::generate_text(const TextTurn& turn, const GenerationEvents& events) {
  ChatPrompt prompt;
  if (turn.tokens_given) {
    prompt.tokens = turn.tokens;  // the model checks every id against its vocabulary before it runs anything
  } else {
    PETREL_ASSIGN_OR_RETURN(prompt.tokens, engine_->tokenizer()->encode(turn.prompt, EncodeOptions{.add_special = true, .parse_special = true,
                                                                                                 .untrusted_ranges = {}}));
    const std::optional<int32_t> bos = engine_->tokenizer()->bos_id();
    if (bos && prompt.tokens.size() >= 2 && prompt.tokens[0] == *bos && prompt.tokens[1] == *bos) prompt.tokens.erase(prompt.tokens.begin());
  }
  if (prompt.tokens.empty()) return invalid_argument("prompt: no tokens");
  if (turn.tokens_given && events.prompt_text) {
    PETREL_ASSIGN_OR_RETURN(std::string text, engine_->tokenizer()->decode(prompt.tokens));
    events.prompt_text(utf8::sanitize(text));
  }
  return run_prompt(prompt, turn.generation, events);
}

Server::Server(std::shared_ptr<ChatGenerator> generator, ServerOptions options)
    : generator_(std::move(generator)), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  install_routes();
}

Server::~Server() { stop(); }

void Server::install_routes() {
  httplib::Server& http = *http_;
  const int threads = std::max(1, options_.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(options_.completion.limits.max_request_bytes);
  http.set_read_timeout(std::chrono::duration<double>(options_.read_timeout_s));
  http.set_write_timeout(std::chrono::duration<double>(options_.write_timeout_s));
  http.set_keep_alive_max_count(100);
  // The listening socket: SO_REUSEADDR only (cpp-httplib's default sets SO_REUSEPORT, which lets a second
  // server bind a port that one is already serving), and remembered so that bind() can widen its backlog.
  http.set_socket_options([this](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_socket_ = sock;
  });

  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, simple_error(500, "server_error", "internal error: " + what));
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error body
    std::string message = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                          : res.status == 413 ? "the request body is larger than the server accepts"
                                              : "HTTP " + std::to_string(res.status);
    if (res.status == 400 && req.method == "POST" && !req.has_header("Content-Length") &&
        !req.has_header("Transfer-Encoding")) {
      message += ": a POST needs a body with its Content-Length (send {} where nothing else is needed)";
    }
    send_error(res, simple_error(res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", message));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    ++requests_;
    if (options_.log) options_.log(req.method + " " + req.path + " -> " + std::to_string(res.status));
  });

  // Authorization, when an API key is set; true when the request may go on.
  auto authorized = [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty()) return true;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key) return true;
    send_error(res, simple_error(401, "authentication_error", "missing or wrong API key (Authorization: Bearer ...)"));
    return false;
  };

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  http.Get("/v1/models", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    send_json(res, 200,
              {{"object", "list"},
               {"data", ojson::array({{{"id", options_.completion.model_name}, {"object", "model"},
                                       {"created", static_cast<int64_t>(std::time(nullptr))}, {"owned_by", "petrel"}}})}});
  });
  // llama.cpp's slot monitor, counts only (no prompt text): answered at once, also while a request runs.
  http.Get("/slots", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    ojson slots = ojson::array();
    for (const SlotState& s : generator_->slot_states()) {
      slots.push_back({{"id", s.id}, {"n_ctx", s.n_ctx}, {"is_processing", s.is_processing}, {"cached_tokens", s.cached_tokens}});
    }
    send_json(res, 200, slots);
  });
  // Both completion endpoints: checked, then run under the model's lock; streamed from a content provider.
  auto completion_route = [this, authorized](auto parse, auto run) {
    return [this, authorized, parse, run](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      auto parsed = parse(req.body, options_.completion.limits);
      if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
      if (waiting_.load() > options_.max_waiting) {
        res.set_header("Retry-After", "1");
        return send_error(res, simple_error(503, "server_error", "the server is busy (" + std::to_string(waiting_.load()) +
                                                                     " requests waiting); retry later"));
      }
      using Request = std::decay_t<decltype(std::get<0>(parsed))>;
      auto request = std::make_shared<Request>(std::move(std::get<0>(parsed)));
      if (!request->stream) {
        WaitingSlot slot(waiting_);
        std::lock_guard<std::mutex> lock(model_mutex_);
        auto result = run(*generator_, *request, options_.completion, nullptr);
        if (auto* e = std::get_if<ApiError>(&result)) return send_error(res, *e);
        return send_json(res, 200, std::get<ojson>(result));
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [this, request, run](size_t, httplib::DataSink& sink) {
        WaitingSlot slot(waiting_);
        std::lock_guard<std::mutex> lock(model_mutex_);
        auto emit = [&sink](const std::string& event) { return sink.is_writable() && sink.write(event.data(), event.size()); };
        // The provider runs outside httplib's exception handler: nothing may escape it.
        try {
          auto result = run(*generator_, *request, options_.completion, emit);
          if (auto* e = std::get_if<ApiError>(&result)) {
            emit("data: " + e->to_json().dump() + "\n\n");
            emit("data: [DONE]\n\n");
          }
        } catch (const std::exception& e) {
          emit("data: " + simple_error(500, "server_error", std::string("internal error: ") + e.what()).to_json().dump() + "\n\n");
          emit("data: [DONE]\n\n");
        }
        sink.done();
        return true;
      });
    };
  };
  // llama.cpp's and vLLM's tokenizer endpoints: the tokenizer only, not behind the model's lock.
  auto tokenizer_route = [this, authorized](auto parse, auto answer) {
    return [this, authorized, parse, answer](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Tokenizer* tokenizer = generator_->tokenizer();
      if (!tokenizer) return send_error(res, simple_error(501, "server_error", "this model has no tokenizer"));
      auto parsed = parse(req.body, options_.completion.limits);
      if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
      answer(*tokenizer, std::get<0>(parsed), res);
    };
  };
  auto tokenize = [this](const Tokenizer& tokenizer, const TokenizeRequest& r, httplib::Response& res) {
    auto ids = tokenizer.encode(r.text, EncodeOptions{.add_special = r.add_special, .parse_special = r.parse_special,
                                                      .untrusted_ranges = {}});
    if (!ids.ok()) return send_error(res, api_error_from_status(ids.status()));
    ojson tokens = ojson::array();
    for (int32_t id : *ids) {
      if (!r.with_pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string piece = tokenizer.token_bytes(id).value_or("");
      tokens.push_back({{"id", id}, {"piece", utf8::sanitize(piece)}});
    }
    send_json(res, 200, {{"tokens", std::move(tokens)}, {"count", ids->size()}, {"max_model_len", generator_->context_length()}});
  };
  auto detokenize = [](const Tokenizer& tokenizer, const DetokenizeRequest& r, httplib::Response& res) {
    for (int32_t id : r.tokens) {
      if (id >= tokenizer.vocab_size()) {
        ApiError e = simple_error(400, "invalid_request_error",
                                  "tokens: token id " + std::to_string(id) + " is not in the vocabulary (" +
                                      std::to_string(tokenizer.vocab_size()) + " tokens)");
        e.param = "tokens";
        return send_error(res, e);
      }
    }
    auto text = tokenizer.decode(r.tokens);
    if (!text.ok()) return send_error(res, api_error_from_status(text.status()));
    const std::string content = utf8::sanitize(*text);
    send_json(res, 200, {{"content", content}, {"prompt", content}});
  };
  // llama.cpp's slot persistence, for each of the generator's slots: off unless a directory is given, names
  // checked (parse_slot_file_request), run under the model's lock, the file written under a temporary name.
  http.Post(R"(/slots/(\d+))", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    if (options_.slot_save_path.empty()) {
      return send_error(res, simple_error(501, "not_supported_error",
                                          "slot save/restore is off: start the server with --slot-save-path DIR"));
    }
    const std::string id_text = std::string(req.matches[1]).substr(0, 32);
    const int slots = generator_->slots();
    const int id = id_text.size() <= 3 ? std::stoi(id_text) : slots;  // the route's pattern: digits only
    if (id >= slots) {
      return send_error(res, simple_error(400, "invalid_request_error",
                                          "slot " + id_text + ": this server has " +
                                              (slots == 1 ? std::string("one slot, 0") : std::to_string(slots) + " slots, 0 to " + std::to_string(slots - 1))));
    }
    const std::string action = req.get_param_value("action");
    if (action != "save" && action != "restore" && action != "erase") {
      return send_error(res, simple_error(400, "invalid_request_error", "action must be save, restore or erase, got '" +
                                                                            action.substr(0, 64) + "'"));
    }
    std::string filename;
    if (action != "erase") {
      auto parsed = parse_slot_file_request(req.body, options_.completion.limits);
      if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
      filename = std::get<SlotFileRequest>(parsed).filename;
    }
    if (waiting_.load() > options_.max_waiting) {
      res.set_header("Retry-After", "1");
      return send_error(res, simple_error(503, "server_error", "the server is busy; retry later"));
    }
    WaitingSlot slot(waiting_);
    std::lock_guard<std::mutex> lock(model_mutex_);
    const auto start = std::chrono::steady_clock::now();
    const std::filesystem::path file = std::filesystem::path(options_.slot_save_path) / filename;
    Result<int64_t> n = action == "save"      ? generator_->save_state(id, file)
                        : action == "restore" ? generator_->restore_state(id, file)
                                              : generator_->erase_state(id);
    if (!n.ok()) {
      ApiError e = api_error_from_status(n.status());
      if (n.status().code() == ErrorCode::kNotFound) e.http_status = 404;
      // The client named the file; the server's directory stays out of the answer.
      for (size_t at; !filename.empty() && (at = e.message.find(file.string())) != std::string::npos;) {
        e.message.replace(at, file.string().size(), filename);
      }
      return send_error(res, e);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (action == "erase") return send_json(res, 200, {{"id_slot", id}, {"n_erased", *n}});
    std::error_code size_error;
    const auto bytes = std::filesystem::file_size(file, size_error);
    const int64_t file_bytes = size_error ? 0 : static_cast<int64_t>(bytes);
    if (action == "save") {
      return send_json(res, 200, {{"id_slot", id}, {"filename", filename}, {"n_saved", *n}, {"n_written", file_bytes},
                                  {"timings", {{"save_ms", ms}}}});
    }
    send_json(res, 200, {{"id_slot", id}, {"filename", filename}, {"n_restored", *n}, {"n_read", file_bytes},
                         {"timings", {{"restore_ms", ms}}}});
  });
  http.Post("/tokenize", tokenizer_route(parse_tokenize_request, tokenize));
  http.Post("/detokenize", tokenizer_route(parse_detokenize_request, detokenize));
  http.Post("/v1/chat/completions", completion_route(parse_chat_request, run_chat_completion));
  http.Post("/v1/completions", completion_route(parse_text_completion_request, run_text_completion));
}

Status Server::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ <= 0) return io_error("serve: cannot bind " + options_.host + " (any port)");
  } else {
    if (!http_->bind_to_port(options_.host, options_.port)) {
      return io_error("serve: cannot bind " + options_.host + ":" + std::to_string(options_.port) +
                      " (in use, or not an address of this machine)");
    }
    port_ = options_.port;
  }
  // cpp-httplib listens with a backlog of 5 connections: a burst of clients beyond it (40 at once on a loaded
  // 2-core machine, tests/serve_stress_test.py) overflowed it and some connections were reset. Listening again
  // on the bound socket sets the system's maximum instead.
  if (listen_socket_ < 0 || ::listen(listen_socket_, SOMAXCONN) != 0) {
    return io_error("serve: cannot listen on " + options_.host + ":" + std::to_string(port_));
  }
  return ok_status();
}

Status Server::run() {
  if (port_ == 0) return invalid_argument("serve: run() before bind()");
  if (!http_->listen_after_bind()) return io_error("serve: the listening socket failed");
  return ok_status();
}

void Server::stop() {
  if (http_) http_->stop();
}

}  // namespace petrel::serve
