// petrel validate: a quantized checkpoint against its float reference, on both deployment paths.
#include <cstdio>
#include <memory>

#include "cli_util.h"
#include "commands.h"
#include "petrel/eval/validate.h"
#include "petrel/model/llama.h"
#include "petrel/quant/calibration.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/file.h"
#include "petrel/util/parallel.h"
#include "petrel/util/progress.h"

namespace petrel::cli {

namespace {

struct ValidateFlags {
  std::string kv_type = "f16";
  std::string checkpoint, reference, text, report;
  double text_tail = 0.1;
  eval::ValidateOptions options;
  bool quiet = false;
  bool dequantize_at_load = false;
  int threads = 0;
};

void print_summary(const char* name, const eval::FidelitySummary& s) {
  std::printf("  %-18s KL mean %.5f  p99 %.5f  max %.4f   top-1 %6.2f%%   ppl %.3f (float %.3f)\n", name, s.kl_mean,
              s.kl_p99, s.kl_max, 100 * s.top1_agreement, s.perplexity, s.reference_perplexity);
}

int run_validate(ValidateFlags f) {
  ThreadPool::set_global_threads(f.threads);
  // By default the quantized model runs the kernels it deploys with (the SIMD GEMV in the token generator);
  // --dequantize-at-load expands the weights to float once instead (same values, reference kernels only).
  auto quantized = LlamaModel::load(f.checkpoint, ModelLoadOptions{.dequantize_weights = f.dequantize_at_load});
  if (!quantized.ok()) return report_error("validate", quantized.status());
  auto reference = LlamaModel::load(f.reference);
  if (!reference.ok()) return report_error("validate", reference.status());
  auto held_out = held_out_tokens(f.reference, f.text, f.text_tail, (*reference)->config().bos_token_id);
  if (!held_out.ok()) return report_error("validate", held_out.status());
  const std::vector<int32_t>& tokens = held_out->tokens;
  const int32_t* bos = &held_out->bos;

  ProgressBar progress("validate", 1, !f.quiet);
  f.options.kv_type = kv_type_of(f.kv_type);
  auto report = eval::validate_paths(**quantized, **reference, tokens, *bos, f.options, [&](int64_t done, int64_t total) {
    progress.update(static_cast<double>(done) / total, "window " + std::to_string(done) + "/" + std::to_string(total));
  });
  if (!report.ok()) return report_error("validate", report.status());
  progress.finish();

  auto json = report->to_json();
  json["checkpoint"] = f.checkpoint;
  json["reference"] = f.reference;
  json["text"] = held_out->description;
  json["window"] = f.options.window;
  json["chunk_size"] = f.options.chunk_size;
  json["kv_type"] = f.kv_type;
  const std::string report_path = f.report.empty() ? f.checkpoint + "/validation.json" : f.report;
  Status s = write_file_atomic(report_path, json.dump(2) + "\n");
  if (!s.ok()) return report_error("validate", s);

  std::printf("validate: %lld windows of %lld tokens, %lld scored positions per path\n",
              static_cast<long long>(report->windows), static_cast<long long>(f.options.window),
              static_cast<long long>(report->prompt_processor.positions));
  print_summary("prompt processor", report->prompt_processor);
  print_summary("token generator", report->token_generator);
  std::printf("  %-18s KL mean %.3g  max %.3g   top-1 %6.2f%%\n", "PP vs TG", report->paths.kl_mean,
              report->paths.kl_max, 100 * report->paths.top1_agreement);
  std::printf("report: %s\n", report_path.c_str());
  if (!report->passed()) {
    for (const auto& failure : report->failures) std::fprintf(stderr, "petrel validate: FAILED: %s\n", failure.c_str());
    return 5;
  }
  std::printf("validate: PASSED\n");
  return 0;
}

}  // namespace

void add_validate_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<ValidateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Check a quantized checkpoint against its float reference on held-out text, through the prompt processor\n"
      "(128-token chunks) and the token generator (1 token at a time). Writes a JSON report; exits 5 when a\n"
      "threshold is exceeded, naming the path that failed.");
  cmd->add_option("--checkpoint", f->checkpoint, "Quantized checkpoint directory")->required();
  cmd->add_option("--reference", f->reference, "Float checkpoint directory (its tokenizer is used)")->required();
  cmd->add_option("--text", f->text, "Held-out text (default: the last 10% of the shipped WikiText-2 corpus)");
  cmd->add_option("--report", f->report, "JSON report path (default: CHECKPOINT/validation.json)");
  cmd->add_option("--window", f->options.window, "Tokens per window (BOS first; the second half is scored)")->capture_default_str();
  cmd->add_option("--chunk-size", f->options.chunk_size, "Prompt processor sequence length")->capture_default_str();
  cmd->add_option("--max-windows", f->options.max_windows, "Score at most this many windows (-1: all)")->capture_default_str();
  add_kv_type_option(cmd, f->kv_type);
  cmd->add_option("--max-kl", f->options.thresholds.max_kl_mean, "Fail when a path's mean KL to the float model exceeds this")->capture_default_str();
  cmd->add_option("--min-top1", f->options.thresholds.min_top1, "Fail when a path's top-1 agreement is below this")->capture_default_str();
  cmd->add_option("--max-path-kl", f->options.thresholds.max_path_kl_mean, "Fail when PP and TG differ by more mean KL")->capture_default_str();
  cmd->add_option("--min-path-top1", f->options.thresholds.min_path_top1, "Fail when PP and TG top-1 agreement is below this")->capture_default_str();
  cmd->add_flag("-q,--quiet", f->quiet, "No progress bar");
  cmd->add_flag("--dequantize-at-load", f->dequantize_at_load,
                "Expand the quantized weights to float32 once and use the reference kernels on both paths");
  cmd->add_option("-t,--threads", f->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = run_validate(*f); });
}

}  // namespace petrel::cli
