// petrel template: render a conversation through a model's chat template, exactly as transformers would.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "petrel/text/chat_template.h"
#include "petrel/text/reasoning.h"
#include "petrel/util/file.h"

namespace petrel::cli {

namespace {

using nlohmann::ordered_json;

struct TemplateFlags {
  std::string tokenizer_dir;
  std::string template_file;
  std::string messages_file;
  std::string tools_file;
  bool add_generation_prompt = false;
  std::string reasoning = "default";
  std::string reasoning_style = "auto";
  bool prefill_empty_thinking = false;
  std::string now;
  std::vector<std::string> variables;
  bool show_untrusted = false;
  int bench_runs = 0;
};

Result<ordered_json> read_json(const std::string& path) {
  PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  ordered_json json = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_data(path + ": not valid JSON");
  return json;
}

// "2025-03-14" or "2025-03-14T09:26:53" as a complete std::tm.
Result<std::tm> parse_time(const std::string& text) {
  std::tm t{};
  int fields = std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour,
                           &t.tm_min, &t.tm_sec);
  if (fields != 3 && fields != 6) return invalid_argument("--now expects YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS");
  t.tm_year -= 1900;
  t.tm_mon -= 1;
  std::time_t seconds = timegm(&t);
  gmtime_r(&seconds, &t);
  return t;
}

int run_template(const TemplateFlags& flags) {
  const char* command = "template";
  if (flags.tokenizer_dir.empty() && flags.template_file.empty()) {
    return report_error(command, invalid_argument("give --tokenizer DIR (or --template FILE)"));
  }
  auto mode = text::parse_reasoning_mode(flags.reasoning);
  if (!mode.ok()) return report_error(command, mode.status());

  // The conversation: a list of messages, or {"messages": [...], "tools": [...]}.
  auto input = read_json(flags.messages_file);
  if (!input.ok()) return report_error(command, input.status());
  ordered_json messages = *input;
  std::optional<ordered_json> tools;
  if (messages.is_object()) {
    if (messages.contains("tools") && !messages["tools"].is_null()) tools = messages["tools"];
    messages = messages.value("messages", ordered_json());
  }
  if (!messages.is_array()) {
    return report_error(command, invalid_data(flags.messages_file + ": expected a list of messages"));
  }
  if (!flags.tools_file.empty()) {
    auto t = read_json(flags.tools_file);
    if (!t.ok()) return report_error(command, t.status());
    tools = *t;
  }

  // The template and the special tokens.
  ordered_json context = ordered_json::object();
  std::optional<text::ChatTemplateSet> set;
  if (!flags.tokenizer_dir.empty()) {
    auto loaded = text::load_chat_template(flags.tokenizer_dir);
    if (!loaded.ok() && flags.template_file.empty()) return report_error(command, loaded.status());
    if (loaded.ok()) {
      context = loaded->special_tokens;
      set = std::move(loaded).value();
    }
  }
  std::optional<text::ChatTemplate> from_file;
  if (!flags.template_file.empty()) {
    auto source = read_text_file(flags.template_file);
    if (!source.ok()) return report_error(command, source.status());
    auto parsed = text::ChatTemplate::parse(*source, flags.template_file);
    if (!parsed.ok()) return report_error(command, parsed.status());
    from_file = std::move(parsed).value();
  }
  const text::ChatTemplate& tpl = from_file ? *from_file : set->select(tools.has_value());
  for (const std::string& assignment : flags.variables) {
    size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      return report_error(command, invalid_argument("--var expects NAME=VALUE, got '" + assignment + "'"));
    }
    context[assignment.substr(0, eq)] = assignment.substr(eq + 1);
  }

  // Reasoning on/off.
  text::ReasoningSwitch reasoning;
  reasoning.mode = *mode;
  reasoning.prefill_empty_thinking_when_off = flags.prefill_empty_thinking;
  if (flags.reasoning_style == "auto") {
    reasoning.style = text::detect_reasoning_style(tpl.source());
  } else {
    auto style = text::parse_reasoning_style(flags.reasoning_style);
    if (!style.ok()) return report_error(command, style.status());
    reasoning.style = *style;
  }
  auto applied = text::apply_reasoning_mode(messages, reasoning);
  if (!applied.ok()) return report_error(command, applied.status());

  text::RenderOptions options;
  if (!flags.now.empty()) {
    auto now = parse_time(flags.now);
    if (!now.ok()) return report_error(command, now.status());
    options.now = *now;
  }
  const ordered_json* tools_pointer = tools ? &*tools : nullptr;
  auto render = [&] {
    return tpl.render(applied->messages, tools_pointer, flags.add_generation_prompt, context, options);
  };

  if (flags.bench_runs > 0) {
    std::vector<double> micros;
    size_t bytes = 0;
    for (int i = 0; i < flags.bench_runs; ++i) {
      auto start = std::chrono::steady_clock::now();
      auto rendered = render();
      auto end = std::chrono::steady_clock::now();
      if (!rendered.ok()) return report_error(command, rendered.status());
      bytes = rendered->text.size();
      micros.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
    std::sort(micros.begin(), micros.end());
    auto at = [&](double q) { return micros[static_cast<size_t>(q * (micros.size() - 1))]; };
    std::printf("petrel template --bench: %d renders of %zu messages, %zu tools -> %zu bytes\n", flags.bench_runs,
                applied->messages.size(), tools ? tools->size() : size_t{0}, bytes);
    std::printf("median %.1f us, min %.1f us, p10 %.1f us, p90 %.1f us\n", at(0.5), micros.front(), at(0.1), at(0.9));
    return 0;
  }

  auto rendered = render();
  if (!rendered.ok()) return report_error(command, rendered.status());
  std::string output = rendered->text;
  if (flags.add_generation_prompt) output += applied->assistant_prefill;
  std::fwrite(output.data(), 1, output.size(), stdout);
  std::fflush(stdout);
  if (flags.show_untrusted) {
    ordered_json ranges = ordered_json::array();
    for (const auto& [begin, end] : rendered->untrusted_ranges) ranges.push_back({begin, end});
    std::fprintf(stderr, "untrusted byte ranges: %s\n", ranges.dump().c_str());
  }
  return 0;
}

}  // namespace

void add_template_command(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<TemplateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "template",
      "Render a conversation with a model's chat template (tokenizer_config.json), byte for byte as\n"
      "transformers' apply_chat_template(tokenize=False) does; the prompt is printed as is, without a\n"
      "trailing newline.");
  cmd->add_option("--tokenizer", flags->tokenizer_dir,
                  "Directory with tokenizer_config.json (its chat_template and special tokens)");
  cmd->add_option("--template", flags->template_file,
                  "Use this Jinja file instead of the directory's chat_template");
  cmd->add_option("--messages", flags->messages_file,
                  "JSON file: a list of {role, content, ...} messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--tools", flags->tools_file, "JSON file with the list of tool (function) definitions");
  cmd->add_flag("--add-generation-prompt", flags->add_generation_prompt,
                "End with the header that starts the assistant's turn");
  cmd->add_option("--reasoning", flags->reasoning,
                  "Reasoning on, off, or default (leave the messages alone)")
      ->check(CLI::IsMember({"on", "off", "default"}));
  cmd->add_option("--reasoning-style", flags->reasoning_style,
                  "How the template switches reasoning: auto (detect from the template), nemotron-v1\n"
                  "(system prompt \"detailed thinking on/off\"), think-flag (\"/think\" or \"/no_think\" in the\n"
                  "system prompt), none")
      ->check(CLI::IsMember({"auto", "nemotron-v1", "think-flag", "none"}));
  cmd->add_flag("--prefill-empty-thinking", flags->prefill_empty_thinking,
                "With --reasoning off and the nemotron-v1 style, start the assistant turn with \"<think>\\n</think>\"");
  cmd->add_option("--now", flags->now,
                  "Date (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS) that strftime_now() formats, for reproducible output");
  cmd->add_option("--var", flags->variables,
                  "Extra template variable NAME=VALUE (a string), e.g. --var date_string=\"26 Jul 2024\"; repeatable");
  cmd->add_flag("--show-untrusted", flags->show_untrusted,
                "Also print to stderr the byte ranges that came from the conversation (never special tokens)");
  cmd->add_option("--bench", flags->bench_runs, "Render N times and print timing instead of the prompt")
      ->check(CLI::Range(1, 10000000));
  cmd->callback([flags, &ctx] { ctx.exit_code = run_template(*flags); });
}

}  // namespace petrel::cli
