// petrel make-random: a random-weight bf16 checkpoint with a real model's shapes and config.json.
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "petrel/model/random_checkpoint.h"
#include "petrel/util/parallel.h"

namespace petrel::cli {

namespace {

struct MakeRandomFlags {
  RandomCheckpointOptions options;
  std::string out;
  int64_t layers = 0;
  std::string tokenizer;
  double max_shard_gb = 5.0;
  int threads = 0;
  std::string set_json;
};

int run_make_random(MakeRandomFlags f) {
  ThreadPool::set_global_threads(f.threads);
  if (f.layers > 0) f.options.num_layers = f.layers;
  if (!f.tokenizer.empty()) f.options.tokenizer_dir = f.tokenizer;
  if (!f.set_json.empty()) {
    auto overrides = nlohmann::ordered_json::parse(f.set_json, nullptr, false);
    if (overrides.is_discarded() || !overrides.is_object()) {
      return report_error("make-random", invalid_argument("--set: not a JSON object: " + f.set_json));
    }
    f.options.config_overrides = overrides;
  }
  f.options.max_shard_bytes = static_cast<uint64_t>(f.max_shard_gb * 1e9);
  const auto start = std::chrono::steady_clock::now();
  int last_percent = -1;
  const bool tty = ::isatty(2);
  Status s = write_random_checkpoint(f.out, f.options, [&](uint64_t done, uint64_t total) {
    const int percent = static_cast<int>(100.0 * done / total);
    if (percent == last_percent) return;
    last_percent = percent;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = done ? elapsed * (total - done) / done : 0;
    if (tty || percent % 10 == 0) {
      std::fprintf(stderr, "%smake-random: %3d%%  %.2f / %.2f GB  %.0f s elapsed, ETA %.0f s%s", tty ? "\r" : "",
                   percent, done / 1e9, total / 1e9, elapsed, eta, tty ? "" : "\n");
    }
  });
  if (tty) std::fprintf(stderr, "\n");
  if (!s.ok()) return report_error("make-random", s);
  std::fprintf(stderr, "make-random: wrote %s\n", f.out.c_str());
  return 0;
}

}  // namespace

void add_make_random_command(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<MakeRandomFlags>();
  std::string presets;
  for (const auto& p : random_checkpoint_presets()) presets += (presets.empty() ? "" : ", ") + p;
  CLI::App* cmd = app.add_subcommand(
      "make-random", "Write a random-weight bf16 HF checkpoint with a real model's shapes (for benchmarks)");
  cmd->add_option("--preset", flags->options.preset, "Model shape: " + presets)->capture_default_str();
  cmd->add_option("--out", flags->out, "Output checkpoint directory (must not exist unless --force)")->required();
  cmd->add_option("--layers", flags->layers, "Override the number of decoder layers");
  cmd->add_option("--seed", flags->options.seed, "Random seed")->capture_default_str();
  cmd->add_option("--tokenizer", flags->tokenizer, "Copy tokenizer.json / tokenizer_config.json from this directory");
  cmd->add_option("--max-shard-gb", flags->max_shard_gb, "Largest shard, in GB")->capture_default_str();
  cmd->add_option("--set", flags->set_json,
                  "JSON object merged into the preset's config.json, e.g. '{\"hidden_size\": 256}'");
  cmd->add_flag("--force", flags->options.overwrite, "Replace the output directory if it exists");
  cmd->add_option("-t,--threads", flags->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->callback([flags, &ctx] { ctx.exit_code = run_make_random(*flags); });
}

}  // namespace petrel::cli
