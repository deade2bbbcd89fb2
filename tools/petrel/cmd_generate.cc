// petrel generate: text generation from a checkpoint with the reference forward.
#include <cstdio>
#include <memory>

#include "cli_util.h"
#include "commands.h"
#include "petrel/model/llama.h"
#include "petrel/runtime/generate.h"
#include "petrel/util/parallel.h"

namespace petrel::cli {

namespace {

struct GenerateFlags {
  std::string model_dir;
  std::string tokens;
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
  ThreadPool::set_global_threads(f.threads);
  auto model = LlamaModel::load(f.model_dir);
  if (!model.ok()) return report_error("generate", model.status());
  auto prompt = parse_token_ids(f.tokens, "--tokens");
  if (!prompt.ok()) return report_error("generate", prompt.status());
  if (prompt->empty()) return report_error("generate", invalid_argument("--tokens: no token ids given"));

  GenerateOptions options;
  options.max_new_tokens = f.max_new_tokens;
  options.prompt_chunk_size = f.chunk_size;
  options.context_length = f.context_length;
  options.sampler = f.sampler;
  options.sampler.greedy = f.greedy;
  if (f.seed >= 0) options.sampler.seed = static_cast<uint64_t>(f.seed);
  if (!f.ignore_eos) options.stop_token_ids = (*model)->config().eos_token_ids;

  GenerateStats stats;
  bool first = true;
  auto output = generate(**model, *prompt, options, [&](int32_t token) {
    std::printf(first ? "%d" : " %d", token);
    std::fflush(stdout);
    first = false;
    return true;
  }, &stats);
  std::printf("\n");
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
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens from a Hugging Face checkpoint (reference forward)");
  cmd->add_option("--model", flags->model_dir, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--tokens", flags->tokens, "Prompt token ids, e.g. 1,2,3 or \"1 2 3\"")->required();
  cmd->add_option("-n,--max-new-tokens", flags->max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_flag("--greedy", flags->greedy, "Always pick the most likely token (same as --temp 0)");
  cmd->add_flag("--print-ids", flags->print_ids, "Print the generated ids on one line separated by spaces");
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
  cmd->add_option("--chunk-size", flags->chunk_size, "Prompt processor sequence length")->capture_default_str();
  cmd->add_option("-t,--threads", flags->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->callback([flags, &ctx] { ctx.exit_code = run_generate(*flags); });
}

}  // namespace petrel::cli
