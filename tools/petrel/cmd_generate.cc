// petrel generate: text generation from a checkpoint with the reference forward.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "petrel/model/llama.h"
#include "petrel/runtime/generate.h"
#include "petrel/runtime/prompt.h"
#include "petrel/runtime/session.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/parallel.h"

namespace petrel::cli {

namespace {

struct GenerateFlags {
  std::string model_dir;
  std::string backend = "auto";
  bool deterministic = false;
  std::string tokens;
  std::string prompt;
  bool chat = false;
  std::string system;
  std::string reasoning = "default";
  bool allow_special_in_content = false;
  int64_t max_new_tokens = 32;
  bool greedy = false;
  bool print_ids = false;
  bool ignore_eos = false;
  int64_t context_length = 4096;
  int64_t chunk_size = 128;
  int threads = 0;
  SamplerConfig sampler;
  int64_t seed = -1;
};

int run_generate(const GenerateFlags& f) {
  auto backend = parse_backend(f.backend);
  if (!backend.ok()) return report_error("generate", backend.status());
  ThreadPool::set_global_threads(f.threads);
  EngineOptions engine_options;
  engine_options.backend = *backend;
  engine_options.context_length = f.context_length;
  engine_options.cuda_deterministic = f.deterministic;
  auto engine = Engine::load(f.model_dir, engine_options);
  if (!engine.ok()) return report_error("generate", engine.status());
  const LlamaModel* model = &(*engine)->model();
  if (f.tokens.empty() == f.prompt.empty()) {
    return report_error("generate", invalid_argument("give exactly one of --tokens and --prompt"));
  }
  if (f.chat && f.prompt.empty()) return report_error("generate", invalid_argument("--chat needs --prompt"));
  // The tokenizer lives beside the weights (checkpoint directory or bundle).
  std::optional<Tokenizer> tokenizer;
  const std::filesystem::path model_path(f.model_dir);
  const std::filesystem::path text_dir =
      std::filesystem::is_directory(model_path) ? model_path : model_path.parent_path();
  if (!f.prompt.empty() || !f.print_ids) {
    auto loaded = Tokenizer::load(text_dir);
    if (loaded.ok()) tokenizer = std::move(loaded).value();
    else if (!f.prompt.empty()) return report_error("generate", loaded.status());
  }
  Result<std::vector<int32_t>> prompt = std::vector<int32_t>{};
  if (!f.tokens.empty()) {
    prompt = parse_token_ids(f.tokens, "--tokens");
  } else if (!f.chat) {
    prompt = tokenizer->encode(f.prompt, EncodeOptions{.add_special = true, .parse_special = true, .untrusted_ranges = {}});
  } else {
    auto templates = text::load_chat_template(text_dir);
    if (!templates.ok()) return report_error("generate", templates.status());
    auto mode = text::parse_reasoning_mode(f.reasoning);
    if (!mode.ok()) return report_error("generate", mode.status());
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
    messages.push_back({{"role", "user"}, {"content", f.prompt}});
    ChatPromptOptions options;
    options.reasoning = *mode;
    options.allow_special_tokens_in_content = f.allow_special_in_content;
    auto chat = build_chat_prompt(*tokenizer, *templates, messages, nullptr, options);
    if (!chat.ok()) return report_error("generate", chat.status());
    prompt = chat->tokens;
  }
  if (!prompt.ok()) return report_error("generate", prompt.status());
  if (prompt->empty()) return report_error("generate", invalid_argument("the prompt has no tokens"));

  GenerateOptions options;
  options.max_new_tokens = f.max_new_tokens;
  options.prompt_chunk_size = f.chunk_size;
  options.context_length = f.context_length;
  options.sampler = f.sampler;
  options.sampler.greedy = f.greedy;
  if (f.seed >= 0) options.sampler.seed = static_cast<uint64_t>(f.seed);
  if (!f.ignore_eos) options.stop_token_ids = model->config().eos_token_ids;

  GenerateStats stats;
  bool first = true;
  std::optional<StreamingDecoder> decoder;
  const bool print_text = !f.print_ids && tokenizer.has_value();
  if (print_text) decoder.emplace(*tokenizer, /*skip_special=*/true);
  Status decode_status;
  auto on_token = [&](int32_t token) {
    if (print_text) {
      auto piece = decoder->push(token);
      if (!piece.ok()) {
        decode_status = piece.status();
        return false;
      }
      std::fwrite(piece->data(), 1, piece->size(), stdout);
    } else {
      std::printf(first ? "%d" : " %d", token);
    }
    std::fflush(stdout);
    first = false;
    return true;
  };
  auto output = (*engine)->cuda_model() ? generate(*(*engine)->cuda_model(), *prompt, options, on_token, &stats)
                                        : generate(*model, *prompt, options, on_token, &stats);
  if (print_text) {
    const std::string rest = decoder->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  if (!decode_status.ok()) return report_error("generate", decode_status);
  std::fflush(stdout);
  if (!output.ok()) return report_error("generate", output.status());
  std::fprintf(stderr,
               "petrel generate: %lld prompt tokens in %.1f ms (%.1f tok/s to first token), %lld generated, "
               "%.2f tok/s after the first\n",
               static_cast<long long>(stats.prompt_tokens), stats.prompt_seconds * 1e3,
               stats.prompt_tokens / std::max(stats.prompt_seconds, 1e-9),
               static_cast<long long>(stats.generated_tokens),
               (stats.generated_tokens - 1) / std::max(stats.decode_seconds, 1e-9));
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens from a checkpoint or bundle (CPU forward, or the GPU with --backend cuda)");
  cmd->add_option("--model", flags->model_dir, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--tokens", flags->tokens, "Prompt token ids, e.g. 1,2,3 or \"1 2 3\"");
  cmd->add_option("-p,--prompt", flags->prompt, "Prompt text (tokenized with BOS), or the user message with --chat");
  cmd->add_flag("--chat", flags->chat, "Render --prompt as a user message through the model's chat template");
  cmd->add_option("--system", flags->system, "System message for --chat");
  cmd->add_flag("--allow-special-in-content", flags->allow_special_in_content,
                "With --chat: let special tokens typed in messages act as control tokens (transformers/vLLM behaviour)");
  cmd->add_option("--reasoning", flags->reasoning,
                  "With --chat: on, off or default (Nemotron: 'detailed thinking on/off' system prompt)")->capture_default_str();
  cmd->add_option("-n,--max-new-tokens", flags->max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_flag("--greedy", flags->greedy, "Always pick the most likely token (same as --temp 0)");
  cmd->add_flag("--print-ids", flags->print_ids,
                "Print the generated ids on one line separated by spaces (default when the model has no tokenizer)");
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "Do not stop at the model's end-of-sequence ids");
  cmd->add_option("--temp", flags->sampler.temperature, "Sampling temperature; <= 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", flags->sampler.top_k, "Keep the k most likely tokens; 0 = off, 1 = greedy")->capture_default_str();
  cmd->add_option("--top-p", flags->sampler.top_p, "Keep the most likely tokens up to this probability mass; 1 = off")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Sampling seed; -1 = from the clock")->capture_default_str();
  cmd->add_option("--repetition-penalty", flags->sampler.repetition_penalty, "1 = off")->capture_default_str();
  cmd->add_option("--presence-penalty", flags->sampler.presence_penalty, "0 = off")->capture_default_str();
  cmd->add_option("--frequency-penalty", flags->sampler.frequency_penalty, "0 = off")->capture_default_str();
  cmd->add_option("--penalize-last-n", flags->sampler.penalize_last_n, "History seen by the penalties; 0 = all")->capture_default_str();
  cmd->add_option("--context-length", flags->context_length, "KV cache positions (capped at max_position_embeddings)")->capture_default_str();
  add_backend_option(cmd, flags->backend);
  add_deterministic_option(cmd, flags->deterministic);
  cmd->add_option("--chunk-size", flags->chunk_size, "Prompt processor sequence length")->capture_default_str();
  cmd->add_option("-t,--threads", flags->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->callback([flags, &ctx] { ctx.exit_code = run_generate(*flags); });
}

}  // namespace petrel::cli
