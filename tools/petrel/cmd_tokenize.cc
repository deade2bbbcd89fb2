// petrel tokenize / detokenize: text <-> token ids with a checkpoint's tokenizer, and a throughput
// benchmark (tokenize --bench N).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/file.h"

namespace petrel::cli {

namespace {

struct TokenizeFlags {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  bool add_special = false;
  bool no_parse_special = false;
  int bench_runs = 0;
  bool per_line = false;
};

struct DetokenizeFlags {
  std::string tokenizer_dir;
  std::string ids;
  bool skip_special = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Splits after each '\n', so that the lines put back together are the text.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    end = end == std::string_view::npos ? text.size() : end + 1;
    lines.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return lines;
}

// Encodes the text `runs` times on one thread and prints the throughput. The first run fills the BPE
// cache; the median is the steady state a long-running server sees.
int run_bench(const Tokenizer& tokenizer, const std::string& text, const EncodeOptions& options,
              const TokenizeFlags& f, double load_seconds) {
  const std::vector<std::string_view> lines =
      f.per_line ? split_lines(text) : std::vector<std::string_view>{std::string_view(text)};
  std::vector<double> mb_per_s;
  size_t id_count = 0;
  for (int run = 0; run < f.bench_runs; ++run) {
    id_count = 0;
    const auto start = std::chrono::steady_clock::now();
    for (std::string_view line : lines) {
      auto ids = tokenizer.encode(line, options);
      if (!ids.ok()) return report_error("tokenize", ids.status());
      id_count += ids->size();
    }
    mb_per_s.push_back(static_cast<double>(text.size()) / 1e6 / seconds_since(start));
  }
  const double first = mb_per_s.front();
  std::sort(mb_per_s.begin(), mb_per_s.end());
  const double median = mb_per_s[mb_per_s.size() / 2];
  std::printf("bytes=%zu ids=%zu runs=%d mode=%s load_s=%.3f first_MB/s=%.2f median_MB/s=%.2f best_MB/s=%.2f\n",
              text.size(), id_count, f.bench_runs, f.per_line ? "per-line" : "whole-text", load_seconds, first,
              median, mb_per_s.back());
  return 0;
}

int run_tokenize(const TokenizeFlags& f) {
  if (f.bench_runs < 0) return report_error("tokenize", invalid_argument("--bench wants a positive run count"));
  std::string text = f.text;
  if (!f.file.empty()) {
    auto contents = read_text_file(f.file);
    if (!contents.ok()) return report_error("tokenize", contents.status());
    text = std::move(contents).value();
  }
  const auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = Tokenizer::load(f.tokenizer_dir);
  if (!tokenizer.ok()) return report_error("tokenize", tokenizer.status());
  const double load_seconds = seconds_since(load_start);
  EncodeOptions options;
  options.add_special = f.add_special;
  options.parse_special = !f.no_parse_special;
  if (f.bench_runs > 0) {
    if (text.empty()) return report_error("tokenize", invalid_argument("--bench needs a non-empty text to time"));
    return run_bench(*tokenizer, text, options, f, load_seconds);
  }
  auto ids = tokenizer->encode(text, options);
  if (!ids.ok()) return report_error("tokenize", ids.status().with_context(f.file.empty() ? "--text" : f.file));
  std::string line;
  line.reserve(ids->size() * 7 + 1);
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) line.push_back(' ');
    line.append(std::to_string((*ids)[i]));
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

int run_detokenize(const DetokenizeFlags& f) {
  auto ids = parse_token_ids(f.ids, "--ids");
  if (!ids.ok()) return report_error("detokenize", ids.status());
  auto tokenizer = Tokenizer::load(f.tokenizer_dir);
  if (!tokenizer.ok()) return report_error("detokenize", tokenizer.status());
  auto text = tokenizer->decode(*ids, f.skip_special);
  if (!text.ok()) return report_error("detokenize", text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

void add_tokenize_commands(CLI::App& app, CliContext& ctx) {
  auto tokenize_flags = std::make_shared<TokenizeFlags>();
  CLI::App* tokenize = app.add_subcommand(
      "tokenize",
      "Print the token ids of a text, on one line separated by spaces.\n"
      "Special tokens written in the text (\"<|eot_id|>\") are recognized unless --no-parse-special.\n"
      "Example: petrel tokenize --tokenizer models/llama-3.1 --text 'Hello world' --add-special");
  tokenize->add_option("--tokenizer", tokenize_flags->tokenizer_dir,
                       "Directory with tokenizer.json (byte-level BPE) or tokenizer.model (SentencePiece), and "
                       "optionally tokenizer_config.json")
      ->required();
  auto* text_option = tokenize->add_option("--text", tokenize_flags->text, "The text to tokenize");
  auto* file_option = tokenize->add_option("--file", tokenize_flags->file, "Read the text from this file (UTF-8)");
  text_option->excludes(file_option);
  tokenize->add_flag("--add-special", tokenize_flags->add_special,
                     "Apply the post-processor: prepend <|begin_of_text|> (BOS) as the model expects");
  tokenize->add_flag("--no-parse-special", tokenize_flags->no_parse_special,
                     "Encode special-token strings in the text as plain text");
  tokenize->add_option("--bench", tokenize_flags->bench_runs,
                       "Instead of printing ids, encode the text N times on one thread and print MB/s "
                       "(first run, median, best)");
  tokenize->add_flag("--per-line", tokenize_flags->per_line,
                     "With --bench: encode each line separately instead of the whole text at once");
  tokenize->callback([tokenize_flags, text_option, file_option, &ctx] {
    if (text_option->count() == 0 && file_option->count() == 0) {
      ctx.exit_code = report_error("tokenize", invalid_argument("give the text with --text or --file"));
      return;
    }
    ctx.exit_code = run_tokenize(*tokenize_flags);
  });

  auto detokenize_flags = std::make_shared<DetokenizeFlags>();
  CLI::App* detokenize = app.add_subcommand(
      "detokenize",
      "Print the text of token ids exactly, with no newline added.\n"
      "Example: petrel detokenize --tokenizer models/llama-3.1 --ids \"9906, 1917\"");
  detokenize->add_option("--tokenizer", detokenize_flags->tokenizer_dir,
                         "Directory with tokenizer.json or tokenizer.model")
      ->required();
  detokenize->add_option("--ids", detokenize_flags->ids, "Token ids separated by spaces and/or commas")->required();
  detokenize->add_flag("--skip-special", detokenize_flags->skip_special,
                       "Leave out special tokens (<|begin_of_text|>, <|eot_id|>, ...)");
  detokenize->callback([detokenize_flags, &ctx] { ctx.exit_code = run_detokenize(*detokenize_flags); });
}

}  // namespace petrel::cli
