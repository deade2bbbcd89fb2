// petrel run: genie-t2t-run's contract. `-c BUNDLE/config.json` (or --model DIR), a prompt from -p,
// --prompt_file or --tokens_file; prints "[BEGIN]: ", the streamed text, then "[END]"; --profile FILE writes
// Genie's profile JSON (the file must not exist yet, as with Genie).
//
// The prompt is used as given, like Genie: special tokens written in it (<|begin_of_text|>, headers) are
// recognized and no BOS is added, so prompt files written for genie-t2t-run work unchanged.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "petrel/io/bundle.h"
#include "petrel/runtime/profile.h"
#include "petrel/runtime/session.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/file.h"
#include "petrel/util/parallel.h"

namespace petrel::cli {

namespace fs = std::filesystem;

namespace {

struct RunFlags {
  std::string kv_type = "f16";
  std::string backend = "auto";
  std::string config, model, prompt, prompt_file, tokens_file, profile, log = "warn";
  int64_t max_new_tokens = -1;
  int threads = 0;
  std::string prefill_f16_weights = "auto";
  bool deterministic = false;
};

enum class LogLevel { kError, kWarn, kInfo, kVerbose };

int run_run(const RunFlags& f) {
  const char* cmd = "run";
  LogLevel level;
  if (f.log == "error") level = LogLevel::kError;
  else if (f.log == "warn") level = LogLevel::kWarn;
  else if (f.log == "info") level = LogLevel::kInfo;
  else if (f.log == "verbose") level = LogLevel::kVerbose;
  else return report_error(cmd, invalid_argument("--log must be error, warn, info or verbose, got '" + f.log + "'"));
  if (f.config.empty() == f.model.empty()) return report_error(cmd, invalid_argument("give exactly one of -c/--config and --model"));
  const int prompt_sources = !f.prompt.empty() + !f.prompt_file.empty() + !f.tokens_file.empty();
  if (prompt_sources != 1) return report_error(cmd, invalid_argument("give exactly one of -p/--prompt, --prompt_file and --tokens_file"));
  std::error_code ec;
  if (!f.profile.empty() && fs::exists(f.profile, ec)) {
    return report_error(cmd, invalid_argument("--profile " + f.profile + ": the file already exists (Genie refuses to overwrite a profile)"));
  }
  auto backend = parse_backend(f.backend);
  if (!backend.ok()) return report_error(cmd, backend.status());
  ThreadPool::set_global_threads(f.threads);

  // GenieDialog_create: load the model and the tokenizer.
  DialogCreateEvent create;
  create.start_us = wall_clock_us();
  GenerationConfig options;
  int64_t context_length = 4096;
  const std::string model_path = f.config.empty() ? f.model : f.config;
  if (!f.config.empty()) {
    auto config = load_bundle_config(f.config);
    if (!config.ok()) return report_error(cmd, config.status());
    const auto& s = config->sampler;
    context_length = config->context.size;
    options.stop_token_ids = config->context.eos_tokens;
    options.sampler.seed = s.seed;
    options.sampler.temperature = static_cast<float>(s.temp);
    options.sampler.top_k = static_cast<int32_t>(s.top_k);
    options.sampler.top_p = static_cast<float>(s.top_p);
    options.sampler.greedy = s.greedy.value_or(false);
    if (s.token_penalty) {
      options.sampler.repetition_penalty = static_cast<float>(s.token_penalty->repetition_penalty);
      options.sampler.presence_penalty = static_cast<float>(s.token_penalty->presence_penalty);
      options.sampler.frequency_penalty = static_cast<float>(s.token_penalty->frequency_penalty);
      options.sampler.penalize_last_n = static_cast<int32_t>(s.token_penalty->penalize_last_n);
    }
    options.stop_strings = config->stop_sequence;
    options.max_new_tokens = config->max_num_tokens.value_or(config->context.size);
  } else {
    options.max_new_tokens = context_length;  // until EOS or a full context; stop ids: the model's EOS
  }
  EngineOptions engine_options;
  engine_options.backend = *backend;
  engine_options.context_length = context_length;
  auto f16_weights = parse_prefill_f16_weights(f.prefill_f16_weights);
  if (!f16_weights.ok()) return report_error(cmd, f16_weights.status());
  engine_options.cuda_prefill_f16_weights = *f16_weights;
  engine_options.cuda_deterministic = f.deterministic;
  auto engine = Engine::load(model_path, engine_options);
  if (!engine.ok()) return report_error(cmd, engine.status());
  const Tokenizer* tokenizer = (*engine)->tokenizer();
  if (!tokenizer) return report_error(cmd, not_found(model_path + ": no tokenizer.json beside the model"));
  if (f.max_new_tokens >= 0) options.max_new_tokens = f.max_new_tokens;
  auto created = Session::create(*engine, context_length, kv_type_of(f.kv_type));
  if (!created.ok()) return report_error(cmd, created.status());
  Session& session = **created;
  create.stop_us = wall_clock_us();
  if (level >= LogLevel::kInfo) {
    const EngineLoadTimes& t = (*engine)->load_times();
    std::fprintf(stderr, "petrel run: loaded %s on %s in %.1f ms (weights read %.1f ms; tokenizer and template %.1f ms, "
                 "beside them", model_path.c_str(), backend_name((*engine)->backend()),
                 (create.stop_us - create.start_us) / 1e3, t.weights_ms, t.text_ms);
    if ((*engine)->backend() == Backend::kCuda) {
      std::fprintf(stderr, "; GPUs found %.1f ms; on the GPU %.1f ms: upload %.1f, fp16 copies %.1f, buffers %.1f, "
                   "warm-up %.1f, warm copies %.1f", t.devices_ms, t.gpu_ms, t.gpu.upload_ms, t.gpu.f16_copies_ms,
                   t.gpu.buffers_ms, t.gpu.warm_up_ms, t.gpu.warm_copies_ms);
    }
    std::fprintf(stderr, ")\n");
  }

  // The prompt.
  Result<std::vector<int32_t>> prompt = std::vector<int32_t>{};
  if (!f.tokens_file.empty()) {
    auto text = read_text_file(f.tokens_file);
    if (!text.ok()) return report_error(cmd, text.status());
    prompt = parse_token_ids(*text, f.tokens_file);
  } else {
    std::string text = f.prompt;
    if (!f.prompt_file.empty()) {
      auto file = read_text_file(f.prompt_file);
      if (!file.ok()) return report_error(cmd, file.status());
      text = *file;
    }
    prompt = tokenizer->encode(text, EncodeOptions{.add_special = false, .parse_special = true, .untrusted_ranges = {}});
  }
  if (!prompt.ok()) return report_error(cmd, prompt.status());
  if (prompt->empty()) return report_error(cmd, invalid_argument("the prompt has no tokens"));
  if (static_cast<int64_t>(prompt->size()) >= session.context_length()) {
    return report_error(cmd, out_of_range("Context Size was exceeded: the prompt has " + std::to_string(prompt->size()) +
                                          " tokens and the context holds " + std::to_string(session.context_length())));
  }

  // GenieDialog_query.
  DialogQueryEvent query;
  query.start_us = wall_clock_us();
  std::fputs("[BEGIN]: ", stdout);
  std::fflush(stdout);
  auto result = session.query_tokens(*prompt, options, [](int32_t, std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputs("[END]\n", stdout);
  std::fflush(stdout);
  query.stop_us = wall_clock_us();
  if (!result.ok()) return report_error(cmd, result.status());
  query.prompt_tokens = result->stats.prompt_tokens;
  query.generated_tokens = result->stats.generated_tokens;
  query.time_to_first_token_us = result->stats.time_to_first_token_s * 1e6;
  query.token_generation_time_us = result->stats.generation_s * 1e6;
  if (level >= LogLevel::kInfo) {
    std::fprintf(stderr, "petrel run: %lld prompt tokens, TTFT %.1f ms, %lld generated, %.2f tok/s\n",
                 static_cast<long long>(query.prompt_tokens), query.time_to_first_token_us / 1e3,
                 static_cast<long long>(query.generated_tokens),
                 query.token_generation_time_us > 0 ? query.generated_tokens / (query.token_generation_time_us / 1e6) : 0.0);
  }
  if (!f.profile.empty()) {
    Status s = write_file_atomic(f.profile, genie_profile_json(create, {query}).dump(2) + "\n");
    if (!s.ok()) return report_error(cmd, s);
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "genie-t2t-run compatible: prints \"[BEGIN]: \", the streamed answer and \"[END]\"; --profile writes Genie's\n"
      "profile JSON. The prompt is used verbatim (special tokens recognized, no BOS added), as Genie does.");
  cmd->add_option("-c,--config", f->config, "Bundle config (BUNDLE/config.json or BUNDLE)");
  cmd->add_option("--model", f->model, "A Hugging Face or quantized checkpoint directory instead of a bundle");
  cmd->add_option("-p,--prompt", f->prompt, "Prompt text");
  cmd->add_option("--prompt_file", f->prompt_file, "File holding the prompt text");
  cmd->add_option("--tokens_file", f->tokens_file, "File holding prompt token ids (spaces or commas)");
  cmd->add_option("--profile", f->profile, "Write Genie's profile JSON here (must not exist)");
  cmd->add_option("--log", f->log, "error, warn, info or verbose")->capture_default_str();
  cmd->add_option("-n,--max-new-tokens", f->max_new_tokens,
                  "Extension: stop after this many tokens (default: the config's max-num-tokens, else the context)");
  add_kv_type_option(cmd, f->kv_type);
  add_backend_option(cmd, f->backend);
  add_deterministic_option(cmd, f->deterministic);
  cmd->add_option("--prefill-f16-weights", f->prefill_f16_weights,
                  "cuda: fp16 copies of the 4-bit linears for prompts over 160 tokens (faster; ~3.5x the weights' GPU "
                  "memory): auto (when they take at most half of the free memory), on, off")
      ->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "Worker threads; 0 = all cores (the config's n-threads is advisory)")->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = run_run(*f); });
}

}  // namespace petrel::cli
