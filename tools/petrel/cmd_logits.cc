// petrel logits: float32 logits of every position, through the prompt processor or the token generator.
#include <memory>

#include "cli_util.h"
#include "commands.h"
#include "petrel/io/npy.h"
#include "petrel/model/llama.h"
#include "petrel/util/file.h"
#include "petrel/util/parallel.h"

namespace petrel::cli {

namespace {

struct LogitsFlags {
  std::string kv_type = "f16";
  std::string model_dir;
  std::string tokens_file;
  std::string out;
  bool token_generator = false;
  int64_t chunk_size = 128;
  int threads = 0;
};

int run_logits(const LogitsFlags& f) {
  ThreadPool::set_global_threads(f.threads);
  auto text = read_text_file(f.tokens_file);
  if (!text.ok()) return report_error("logits", text.status());
  auto tokens = parse_token_ids(*text, f.tokens_file);
  if (!tokens.ok()) return report_error("logits", tokens.status());
  if (tokens->empty()) return report_error("logits", invalid_argument(f.tokens_file + ": no token ids"));
  auto model = LlamaModel::load(f.model_dir);
  if (!model.ok()) return report_error("logits", model.status());
  const int64_t n = static_cast<int64_t>(tokens->size()), vocab = (*model)->config().vocab_size;
  auto cache = (*model)->new_cache(std::min<int64_t>(n, (*model)->config().max_position_embeddings),
                                   kv_type_of(f.kv_type));
  if (!cache.ok()) return report_error("logits", cache.status());
  std::vector<float> logits;
  if (!f.token_generator) {
    Status s = (*model)->process_prompt(*tokens, *cache, f.chunk_size, LogitsMode::kAll, &logits);
    if (!s.ok()) return report_error("logits", s);
  } else {
    logits.reserve(n * vocab);
    std::vector<float> step;
    for (int64_t i = 0; i < n; ++i) {
      Status s = (*model)->forward(std::span<const int32_t>(tokens->data() + i, 1), *cache, LogitsMode::kLast, &step);
      if (!s.ok()) return report_error("logits", s);
      logits.insert(logits.end(), step.begin(), step.end());
    }
  }
  Status s = write_npy_f32(f.out, logits.data(), {n, vocab});
  if (!s.ok()) return report_error("logits", s);
  return 0;
}

}  // namespace

void add_logits_command(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<LogitsFlags>();
  CLI::App* cmd = app.add_subcommand(
      "logits", "Write float32 logits [n_tokens, vocab] of a token sequence to a NumPy .npy file");
  cmd->add_option("--model", flags->model_dir, "Checkpoint directory")->required();
  cmd->add_option("--tokens-file", flags->tokens_file, "File of whitespace- or comma-separated token ids")->required();
  cmd->add_option("--out", flags->out, "Output .npy path (written atomically)")->required();
  cmd->add_flag("--token-generator", flags->token_generator,
                "Compute one token at a time (the token generator path) instead of prompt chunks");
  cmd->add_option("--chunk-size", flags->chunk_size, "Prompt processor sequence length")->capture_default_str();
  add_kv_type_option(cmd, flags->kv_type);
  cmd->add_option("-t,--threads", flags->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->callback([flags, &ctx] { ctx.exit_code = run_logits(*flags); });
}

}  // namespace petrel::cli
