// petrel chat: interactive multi-turn chat in the terminal with the model's chat template, the reasoning
// switch, and the KV cache reused across turns (only the new part of the conversation is processed).
// Lines starting with '/' are commands: /reset, /think on|off|default, /save FILE, /load FILE, /exit. End of input
// ends the chat. /save writes the KV cache (Session::save: FILE, either backend's) and the conversation (FILE.json);
// /load reads both back, so a chat resumes in another process without processing its history again. The pair need
// not match for the answers to be right: each turn renders the whole conversation and reuses only the cached
// tokens that agree with it.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "petrel/runtime/session.h"
#include "petrel/text/reasoning.h"
#include "petrel/util/file.h"

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

// /save FILE: the KV cache to FILE, then the conversation to FILE.json (each written under a temporary name).
Status save_chat(const Session& session, const nlohmann::ordered_json& messages, const std::string& file) {
  PETREL_RETURN_IF_ERROR(session.save(file));
  nlohmann::ordered_json saved = {{"format", "petrel-chat"}, {"version", 1}, {"messages", messages}};
  return write_file_atomic(file + ".json", saved.dump(2) + "\n");
}

// /load FILE: the conversation from FILE.json (checked first), then the KV cache from FILE; nothing changes unless
// both are read.
Status load_chat(Session& session, nlohmann::ordered_json& messages, const std::string& file) {
  const std::string json_path = file + ".json";
  PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(json_path));
  nlohmann::ordered_json saved = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool chat_file = !saved.is_discarded() && saved.is_object() && saved.contains("format") &&
                         saved["format"].is_string() && saved["format"] == "petrel-chat";
  if (!chat_file || !saved.contains("messages") || !saved["messages"].is_array()) {
    return invalid_data(json_path + ": not a petrel chat file (an object with \"format\": \"petrel-chat\" and \"messages\")");
  }
  for (size_t i = 0; i < saved["messages"].size(); ++i) {
    const auto& m = saved["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string()) {
      return invalid_data(json_path + ": messages[" + std::to_string(i) + "] needs a string \"role\" and \"content\"");
    }
  }
  PETREL_RETURN_IF_ERROR(session.restore(file));
  messages = std::move(saved["messages"]);
  return ok_status();
}

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
  if (tty) std::printf("petrel chat: /reset, /think on|off|default, /save FILE, /load FILE, /exit\n");
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
    if (line == "/save" || line == "/load" || line.rfind("/save ", 0) == 0 || line.rfind("/load ", 0) == 0) {
      const bool save = line[1] == 's';
      const size_t first = line.find_first_not_of(' ', 5), last = line.find_last_not_of(' ');
      if (first == std::string::npos) {
        std::fprintf(stderr, "petrel chat: %s needs a file name, e.g. %s chat.kv\n", line.substr(0, 5).c_str(), line.substr(0, 5).c_str());
        continue;
      }
      const std::string file = line.substr(first, last + 1 - first);
      Status done = save ? save_chat(session, messages, file) : load_chat(session, messages, file);
      if (!done.ok()) {
        std::fprintf(stderr, "petrel chat: %s\n", done.to_string().c_str());
      } else {
        std::printf("(%s %s: %lld cached tokens, %zu messages)\n", save ? "saved to" : "loaded from", file.c_str(),
                    static_cast<long long>(session.position()), messages.size());
      }
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
  CLI::App* cmd = app.add_subcommand("chat", "Interactive multi-turn chat (the KV cache is reused across turns; /save FILE and /load FILE "
                                                   "keep a chat and resume it in another process)");
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
