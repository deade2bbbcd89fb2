// petrel serve: an OpenAI-compatible HTTP server (chat completions with streaming, tool calls and the reasoning
// switch) over one model: src/petrel/serve/server.h has the endpoints and limits, docs/SERVER.md the usage.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "petrel/runtime/session.h"
#include "petrel/serve/server.h"
#include "petrel/text/reasoning.h"

namespace petrel::cli {

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }

struct ServeFlags {
  std::string model, host = "127.0.0.1", backend = "auto", kv_type = "f16", model_name;
  std::string tool_format = "auto", reasoning_style = "auto", api_key, slot_save_path;
  int port = 8080;
  int http_threads = 8, max_waiting = 8, threads = 0, slots = 1;
  int64_t context_length = 4096, max_tokens = 0, default_max_tokens = 1024, max_choices = 16;
  double timeout_s = 600;
  size_t max_body_bytes = 4u << 20;
  bool deterministic = false, quiet = false, host_masks = false;
  serve::ChatDefaults defaults;
};

int run_serve(const ServeFlags& f) {
  const char* cmd = "serve";
  std::fprintf(stderr, "petrel serve: loading %s\n", f.model.c_str());
  auto engine = load_engine(f.model, f.backend, f.context_length, f.deterministic, f.threads, f.host_masks);
  if (!engine.ok()) return report_error(cmd, engine.status());
  auto generator = serve::EngineGenerator::create(*engine, f.context_length, kv_type_of(f.kv_type), f.slots);
  if (!generator.ok()) return report_error(cmd, generator.status());

  serve::ServerOptions options;
  options.host = f.host;
  options.port = f.port;
  options.http_threads = f.http_threads;
  options.max_waiting = f.max_waiting;
  options.api_key = f.api_key;
  if (!f.slot_save_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.slot_save_path, ec);
    if (ec || !std::filesystem::is_directory(f.slot_save_path)) {
      return report_error(cmd, io_error("--slot-save-path " + f.slot_save_path + ": not a directory that can be made" +
                                        (ec ? " (" + ec.message() + ")" : std::string())));
    }
    options.slot_save_path = f.slot_save_path;
  }
  serve::CompletionOptions& c = options.completion;
  if (!f.model_name.empty()) {
    c.model_name = f.model_name;
  } else {
    std::filesystem::path p = std::filesystem::path(f.model);
    if (p.filename() == "config.json") p = p.parent_path();
    c.model_name = p.lexically_normal().filename().string();
    if (c.model_name.empty()) c.model_name = std::filesystem::absolute(p).lexically_normal().parent_path().filename().string();
  }
  c.defaults = f.defaults;
  c.defaults.max_tokens = f.default_max_tokens;
  c.limits.max_tokens = f.max_tokens > 0 ? f.max_tokens : f.context_length;
  c.limits.max_request_seconds = f.timeout_s;
  c.limits.max_choices = f.max_choices;
  c.limits.max_request_bytes = f.max_body_bytes;
  if (Status s = (*generator)->configure_tools(f.tool_format, c); !s.ok()) return report_error(cmd, s);
  if (f.reasoning_style != "auto") {
    auto style = text::parse_reasoning_style(f.reasoning_style);
    if (!style.ok()) return report_error(cmd, style.status());
    c.reasoning_style = *style;
  }
  if (!f.quiet) options.log = [](const std::string& line) { std::fprintf(stderr, "petrel serve: %s\n", line.c_str()); };

  serve::Server server(std::shared_ptr<serve::ChatGenerator>(std::move(*generator)), options);
  if (Status s = server.bind(); !s.ok()) return report_error(cmd, s);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::thread watcher([&server] {
    while (!g_stop_requested.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
  });
  std::fprintf(stderr, "petrel serve: listening on http://%s:%d/v1 (model \"%s\" on %s, tool calls: %s, context %lld, slots %d)\n",
               f.host.c_str(), server.port(), c.model_name.c_str(), backend_name((*engine)->backend()),
               serve::tool_call_format_name(c.tool_format), static_cast<long long>(f.context_length), f.slots);
  std::fflush(stderr);
  Status status = server.run();
  g_stop_requested.store(true);
  watcher.join();
  if (!status.ok()) return report_error(cmd, status);
  std::fprintf(stderr, "petrel serve: stopped after %lld requests\n", static_cast<long long>(server.requests()));
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server: POST /v1/chat/completions (streaming, tools, reasoning), POST /v1/completions, GET /v1/models");
  cmd->add_option("model", f->model, "Bundle, BUNDLE/config.json, or checkpoint directory")->required();
  cmd->add_option("--host", f->host, "Address to listen on (0.0.0.0 exposes the server to the network)")->capture_default_str();
  cmd->add_option("--port", f->port, "Port (0: any free port, printed at start)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--model-name", f->model_name, "The model's id in /v1/models and responses (default: the directory's name)");
  cmd->add_option("--api-key", f->api_key, "Require 'Authorization: Bearer KEY' on every /v1 request");
  cmd->add_option("--slot-save-path", f->slot_save_path,
                  "Directory for llama.cpp's slot persistence: POST /slots/ID?action=save|restore {\"filename\": NAME} writes "
                  "or reads slot ID's KV cache and its tokens there, action=erase forgets them (off when not given)");
  cmd->add_option("--parallel", f->slots,
                  "Slots (also -np, as llama.cpp's): conversations whose KV caches are kept, though requests still run one at a "
                  "time (no batched decoding); each request goes to the "
                  "slot whose conversation it continues (that slot's last prompt begins its own), else to an unused or the "
                  "least recently used one. Each slot is a KV "
                  "cache of its own (cpu: --context-length positions each; cuda: the positions in use, set aside on the GPU)")
      ->capture_default_str()
      ->check(CLI::Range(1, serve::EngineGenerator::kMaxSlots));
  add_backend_option(cmd, f->backend);
  add_kv_type_option(cmd, f->kv_type);
  add_deterministic_option(cmd, f->deterministic);
  cmd->add_flag("--host-masks", f->host_masks,
                "cuda: apply constrained decoding's token masks (JSON mode, schemas, forced tool calls) on the host over "
                "the whole vocabulary instead of on the GPU (slower; for comparison)");
  cmd->add_option("--context-length", f->context_length, "KV cache positions (the longest conversation)")->capture_default_str();
  cmd->add_option("--max-tokens", f->max_tokens, "The most tokens one request may generate (0: the context length)")->capture_default_str();
  cmd->add_option("--default-max-tokens", f->default_max_tokens, "Tokens generated when a request gives no max_tokens")->capture_default_str();
  cmd->add_option("--temp", f->defaults.temperature, "Temperature when a request gives none (OpenAI's default 1)")->capture_default_str();
  cmd->add_option("--top-p", f->defaults.top_p, "top-p when a request gives none (applied after the temperature, as OpenAI)")->capture_default_str();
  cmd->add_option("--top-k", f->defaults.top_k, "top-k when a request gives none (0: off)")->capture_default_str();
  cmd->add_option("--tool-format", f->tool_format, "Tool-call format: auto (from the chat template), nemotron, llama3-json, hermes, none")->capture_default_str();
  cmd->add_option("--reasoning-style", f->reasoning_style, "Reasoning switch: auto (from the template), nemotron-v1, think-flag, none")->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "Seconds a request may run (all its choices) before it stops with finish_reason length")->capture_default_str();
  cmd->add_option("--max-choices", f->max_choices, "The largest n a request may ask for (its choices run one after another)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--max-body-bytes", f->max_body_bytes, "Largest request body accepted (413 above)")->capture_default_str();
  cmd->add_option("--http-threads", f->http_threads, "Connections served at once (one generation runs at a time)")->capture_default_str();
  cmd->add_option("--max-waiting", f->max_waiting, "Requests that may wait for the model; more get 503")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "Worker threads for the CPU backend; 0 = all cores")->capture_default_str();
  cmd->add_flag("-q,--quiet", f->quiet, "No line per request on stderr");
  cmd->callback([f, &ctx] { ctx.exit_code = run_serve(*f); });
}

}  // namespace petrel::cli
