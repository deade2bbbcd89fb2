// petrel chat: interactive multi-turn chat in the terminal with the model's chat template, the reasoning
// switch, and the KV cache reused across turns (only the new part of the conversation is processed).
// Lines starting with '/' are commands: /reset, /think on|off|default, /exit. End of input ends the chat.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "petrel/runtime/session.h"
#include "petrel/text/reasoning.h"

namespace petrel::cli {

namespace {

struct ChatFlags {
  std::string kv_type = "f16";
  std::string backend = "auto";
  bool deterministic = false;
  std::string model, system, reasoning = "default";
  int64_t context_length = 4096;
  int64_t max_new_tokens = 512;
  bool greedy = false;
  SamplerConfig sampler;
  int64_t seed = -1;
  int threads = 0;
};

int run_chat(const ChatFlags& f) {
  const char* cmd = "chat";
  auto engine = load_engine(f.model, f.backend, f.context_length, f.deterministic, f.threads);
  if (!engine.ok()) return report_error(cmd, engine.status());
  if (!(*engine)->tokenizer() || !(*engine)->templates()) {
    return report_error(cmd, invalid_argument(f.model + ": chat needs tokenizer.json and a chat template"));
  }
  auto mode = text::parse_reasoning_mode(f.reasoning);
  if (!mode.ok()) return report_error(cmd, mode.status());
  ChatPromptOptions prompt_options;
  prompt_options.reasoning = *mode;
  GenerationConfig config;
  config.sampler = f.sampler;
  config.sampler.greedy = f.greedy;
  if (f.seed >= 0) config.sampler.seed = static_cast<uint64_t>(f.seed);
  config.max_new_tokens = f.max_new_tokens;

  auto created = Session::create(*engine, f.context_length, kv_type_of(f.kv_type));
  if (!created.ok()) return report_error(cmd, created.status());
  Session& session = **created;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
  const bool tty = ::isatty(0) && ::isatty(1);
  if (tty) std::printf("petrel chat: /reset, /think on|off|default, /exit\n");
  std::string line;
  while (true) {
    if (tty) std::printf("> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      session.reset();
      messages = nlohmann::ordered_json::array();
      if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
      std::printf("(conversation cleared)\n");
      continue;
    }
    if (line.rfind("/think", 0) == 0) {
      auto m = text::parse_reasoning_mode(line.size() > 7 ? line.substr(7) : "on");
      if (!m.ok()) {
        std::fprintf(stderr, "petrel chat: %s\n", m.status().message().c_str());
        continue;
      }
      prompt_options.reasoning = *m;
      std::printf("(reasoning %s)\n", line.size() > 7 ? line.substr(7).c_str() : "on");
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    auto result = session.query(messages, config, prompt_options, [&](int32_t, std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    if (!result.ok()) {
      report_error(cmd, result.status());
      messages.erase(messages.end() - 1);
      if (result.status().code() == ErrorCode::kOutOfRange) std::fprintf(stderr, "(use /reset to start over)\n");
      continue;
    }
    const text::ReasoningSplit split = text::split_reasoning(result->text);
    messages.push_back({{"role", "assistant"}, {"content", split.answer}});
    std::fprintf(stderr, "[%lld new prompt tokens, %lld reused, TTFT %.0f ms, %lld generated at %.1f tok/s, %s]\n",
                 static_cast<long long>(result->stats.prompt_tokens), static_cast<long long>(result->stats.reused_tokens),
                 result->stats.time_to_first_token_s * 1e3, static_cast<long long>(result->stats.generated_tokens),
                 result->stats.generation_rate(), stop_reason_name(result->reason));
  }
  return 0;
}

}  // namespace

void add_chat_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive multi-turn chat (the KV cache is reused across turns)");
  cmd->add_option("model", f->model, "Bundle, BUNDLE/config.json, or checkpoint directory")->required();
  cmd->add_option("--system", f->system, "System message");
  add_kv_type_option(cmd, f->kv_type);
  add_backend_option(cmd, f->backend);
  add_deterministic_option(cmd, f->deterministic);
  cmd->add_option("--reasoning", f->reasoning, "on, off or default (Nemotron: detailed thinking on/off)")->capture_default_str();
  cmd->add_option("--context-length", f->context_length, "KV cache positions")->capture_default_str();
  cmd->add_option("-n,--max-new-tokens", f->max_new_tokens, "Longest answer")->capture_default_str();
  cmd->add_flag("--greedy", f->greedy, "Always pick the most likely token");
  cmd->add_option("--temp", f->sampler.temperature, "Temperature")->capture_default_str();
  cmd->add_option("--top-k", f->sampler.top_k, "top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", f->sampler.top_p, "top-p (1: off)")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed; -1: from the clock")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = run_chat(*f); });
}

}  // namespace petrel::cli
