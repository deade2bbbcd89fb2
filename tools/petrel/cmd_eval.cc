// petrel eval ppl / kld: perplexity and KL divergence with llama-perplexity's protocol (eval/validate.h).
// petrel eval bfcl: BFCL-style tool calling (src/petrel/eval/bfcl.h), asked of a model in process (through the
// same chat-completion code as `petrel serve`: template, tool-call format, reasoning switch) or of any
// OpenAI-compatible endpoint, so that a float and a quantized model, or petrel and another server, are scored with
// the same prompts, parser and checker.
#include <httplib.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "petrel/eval/validate.h"
#include "petrel/model/llama.h"
#include "petrel/eval/bfcl.h"
#include "petrel/runtime/session.h"
#include "petrel/serve/openai_api.h"
#include "petrel/serve/server.h"
#include "petrel/util/file.h"
#include "petrel/util/parallel.h"
#include "petrel/util/progress.h"

namespace petrel::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct EvalBfclFlags {
  std::string data = PETREL_DEFAULT_BFCL;
  std::string categories = "simple_python,multiple,parallel,parallel_multiple,live_simple,live_multiple,live_parallel,"
                           "live_parallel_multiple,irrelevance,live_irrelevance,live_relevance";
  int64_t limit = -1;
  std::string model, endpoint, api_key, model_name = "petrel";
  std::string backend = "auto", tool_format = "auto", reasoning = "default", out;
  int64_t context_length = 4096, max_tokens = 512;
  float temperature = 0.0f;
  double timeout_s = 300;
  int threads = 0;
  bool deterministic = false;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// An OpenAI endpoint: "http://host:port/v1" -> POST host:port /v1/chat/completions.
Result<eval::BfclAsk> endpoint_ask(const EvalBfclFlags& f) {
  const std::string& url = f.endpoint;
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return invalid_argument("--endpoint " + url + ": expected http://HOST:PORT/v1");
  const size_t path_start = url.find('/', scheme_end + 3);
  const std::string origin = url.substr(0, path_start);
  std::string base = path_start == std::string::npos ? "" : url.substr(path_start);
  while (!base.empty() && base.back() == '/') base.pop_back();
  auto client = std::make_shared<httplib::Client>(origin);
  if (!client->is_valid()) return invalid_argument("--endpoint " + url + ": not a usable http(s) origin");
  client->set_read_timeout(std::chrono::duration<double>(f.timeout_s));
  client->set_write_timeout(std::chrono::seconds(60));
  client->set_connection_timeout(std::chrono::seconds(10));
  if (!f.api_key.empty()) client->set_bearer_token_auth(f.api_key);
  const std::string path = base + "/chat/completions";
  return eval::BfclAsk([client, path](const ojson& request) {
    auto res = client->Post(path, request.dump(), "application/json");
    if (!res) {
      eval::BfclAnswer a;
      a.error = "HTTP request failed: " + httplib::to_string(res.error());
      return a;
    }
    ojson body = ojson::parse(res->body, nullptr, false);
    if (body.is_discarded()) {
      eval::BfclAnswer a;
      a.error = "HTTP " + std::to_string(res->status) + ": the body is not JSON";
      return a;
    }
    eval::BfclAnswer a = eval::bfcl_answer_from_response(body);
    if (a.ok && res->status != 200) {
      a.ok = false;
      a.error = "HTTP " + std::to_string(res->status);
    }
    return a;
  });
}

int run_eval_bfcl(const EvalBfclFlags& f) {
  const char* cmd = "eval bfcl";
  if (f.model.empty() == f.endpoint.empty()) return report_error(cmd, invalid_argument("give --model or --endpoint (one of them)"));
  eval::BfclOptions options;
  options.max_tokens = f.max_tokens;
  options.temperature = f.temperature;
  options.model_name = f.model_name;
  auto mode = text::parse_reasoning_mode(f.reasoning);
  if (!mode.ok()) return report_error(cmd, mode.status());
  if (*mode != text::ReasoningMode::kDefault) options.extra_request["reasoning"] = f.reasoning;

  eval::BfclAsk ask;
  std::shared_ptr<serve::EngineGenerator> generator;
  serve::CompletionOptions completion;
  ojson meta = {{"data", f.data}, {"max_tokens", f.max_tokens}, {"temperature", f.temperature}, {"reasoning", f.reasoning}};
  if (!f.model.empty()) {
    auto engine = load_engine(f.model, f.backend, f.context_length, f.deterministic, f.threads);
    if (!engine.ok()) return report_error(cmd, engine.status());
    auto created = serve::EngineGenerator::create(*engine, f.context_length);
    if (!created.ok()) return report_error(cmd, created.status());
    generator = std::move(*created);
    completion.model_name = f.model_name;
    completion.limits.max_tokens = f.context_length;
    if (Status s = generator->configure_tools(f.tool_format, completion); !s.ok()) return report_error(cmd, s);
    meta["model"] = f.model;
    meta["backend"] = backend_name((*engine)->backend());
    meta["tool_format"] = serve::tool_call_format_name(completion.tool_format);
    ask = [&](const ojson& request) {
      eval::BfclAnswer a;
      try {  // as the server answers a request: checked, then run; any failure is this entry's error
        auto parsed = serve::parse_chat_request(request.dump(), completion.limits);
        if (auto* e = std::get_if<serve::ApiError>(&parsed)) {
          a.error = e->message;
          return a;
        }
        auto result = serve::run_chat_completion(*generator, std::get<serve::ChatRequest>(parsed), completion, nullptr);
        if (auto* e = std::get_if<serve::ApiError>(&result)) {
          a.error = e->message;
          return a;
        }
        return eval::bfcl_answer_from_response(std::get<ojson>(result));
      } catch (const std::exception& e) {
        a.error = std::string("internal error: ") + e.what();
        return a;
      }
    };
  } else {
    auto made = endpoint_ask(f);
    if (!made.ok()) return report_error(cmd, made.status());
    ask = std::move(*made);
    meta["endpoint"] = f.endpoint;
  }

  std::vector<eval::BfclCategoryResult> results;
  for (const std::string& category : split_list(f.categories)) {
    auto entries = eval::load_bfcl_category(f.data, category, f.limit);
    if (!entries.ok()) return report_error(cmd, entries.status());
    ProgressBar bar("bfcl " + category, static_cast<double>(entries->size()));
    results.push_back(eval::run_bfcl_category(category, *entries, ask, options,
                                              [&](int64_t done, int64_t) { bar.update(static_cast<double>(done)); }));
    bar.finish(std::to_string(results.back().correct) + "/" + std::to_string(results.back().total) + " correct");
  }

  std::printf("| category | entries | correct | accuracy | empty | errors | seconds |\n|---|---:|---:|---:|---:|---:|---:|\n");
  int64_t total = 0, correct = 0;
  for (const auto& r : results) {
    std::printf("| %s | %lld | %lld | %.1f%% | %lld | %lld | %.1f |\n", r.category.c_str(), static_cast<long long>(r.total),
                static_cast<long long>(r.correct), 100.0 * r.accuracy(), static_cast<long long>(r.empty),
                static_cast<long long>(r.errors), r.seconds);
    total += r.total;
    correct += r.correct;
  }
  std::printf("| all | %lld | %lld | %.1f%% | | | |\n", static_cast<long long>(total), static_cast<long long>(correct),
              total ? 100.0 * correct / total : 0.0);
  if (!f.out.empty()) {
    if (Status s = write_file_atomic(f.out, eval::bfcl_report_json(results, meta).dump(2) + "\n"); !s.ok()) {
      return report_error(cmd, s);
    }
    std::fprintf(stderr, "petrel eval bfcl: report written to %s\n", f.out.c_str());
  }
  return 0;
}

struct EvalTextFlags {
  std::string model, reference, text, path = "prompt", kv_type = "f16", out, backend = "auto";
  double text_tail = 0.1;
  eval::PerplexityOptions options;
  int threads = 0;
  bool quiet = false;
};

// eval ppl (reference empty) or eval kld.
int run_eval_text(const EvalTextFlags& f, bool kld) {
  const char* cmd = kld ? "eval kld" : "eval ppl";
  eval::PerplexityOptions options = f.options;
  if (f.path != "prompt" && f.path != "token") return report_error(cmd, invalid_argument("--path must be prompt or token, got " + f.path));
  options.token_generator = f.path == "token";
  options.kv_type = kv_type_of(f.kv_type);
  // A model on its backend: the CPU's reference kernels and SIMD kernels, or the GPU's (a KV cache of one window).
  auto load = [&](const std::string& path, KvType kv_type) -> Result<std::pair<std::shared_ptr<Engine>, eval::WindowLogits>> {
    PETREL_ASSIGN_OR_RETURN(std::shared_ptr<Engine> engine, load_engine(path, f.backend, options.window, false, f.threads));
    eval::WindowLogits logits = engine->backend() == Backend::kCuda
                                    ? eval::cuda_window_logits(*engine->cuda_model())
                                    : eval::cpu_window_logits(engine->model(), options.chunk_size, kv_type);
    return std::make_pair(std::move(engine), std::move(logits));
  };
  auto model = load(f.model, options.kv_type);
  if (!model.ok()) return report_error(cmd, model.status());
  std::optional<std::pair<std::shared_ptr<Engine>, eval::WindowLogits>> reference;
  if (kld) {
    auto loaded = load(f.reference, KvType::kF32);
    if (!loaded.ok()) return report_error(cmd, loaded.status());
    reference = std::move(*loaded);
    if (reference->first->model().config().vocab_size != model->first->model().config().vocab_size) {
      return report_error(cmd, invalid_argument("the model's vocabulary differs from the reference's"));
    }
  }
  const LlamaConfig& config = model->first->model().config();
  const Engine& text_source = kld ? *reference->first : *model->first;  // the reference's tokenizer, as validate
  if (!text_source.tokenizer()) return report_error(cmd, invalid_argument((kld ? f.reference : f.model) + ": no tokenizer.json"));
  auto held_out = held_out_tokens(*text_source.tokenizer(), f.text, f.text_tail, config.bos_token_id);
  if (!held_out.ok()) return report_error(cmd, held_out.status());
  ProgressBar bar(kld ? "kld" : "ppl", 1, !f.quiet);
  auto on_progress = [&](int64_t done, int64_t total) {
    bar.update(static_cast<double>(done) / total, "window " + std::to_string(done) + "/" + std::to_string(total));
  };
  ojson report = {{"model", f.model}, {"text", held_out->description}, {"window", options.window},
                  {"path", options.token_generator ? "token generator" : "prompt processor"}, {"kv_type", f.kv_type},
                  {"backend", backend_name(model->first->backend())}};
  if (!kld) {
    auto r = eval::perplexity(model->second, config, held_out->tokens, held_out->bos, options, on_progress);
    if (!r.ok()) return report_error(cmd, r.status());
    bar.finish();
    std::printf("eval ppl: %lld windows of %lld tokens, %lld scored positions: PPL = %.4f +/- %.4f\n",
                static_cast<long long>(r->windows), static_cast<long long>(options.window), static_cast<long long>(r->positions),
                r->perplexity, r->perplexity_stderr);
    const ojson numbers = r->to_json();
    for (auto it = numbers.begin(); it != numbers.end(); ++it) report[it.key()] = it.value();
  } else {
    auto r = eval::compare_models(model->second, reference->second, config, held_out->tokens, held_out->bos, options, on_progress);
    if (!r.ok()) return report_error(cmd, r.status());
    bar.finish();
    std::printf("eval kld: %lld scored positions: KL mean %.6f  p99 %.5f  max %.4f   top-1 %.2f%%   ppl %.4f (reference %.4f)\n",
                static_cast<long long>(r->positions), r->kl_mean, r->kl_p99, r->kl_max, 100 * r->top1_agreement, r->perplexity,
                r->reference_perplexity);
    report["reference"] = f.reference;
    const ojson numbers = r->to_json();
    for (auto it = numbers.begin(); it != numbers.end(); ++it) report[it.key()] = it.value();
  }
  if (!f.out.empty()) {
    if (Status s = write_file_atomic(f.out, report.dump(2) + "\n"); !s.ok()) return report_error(cmd, s);
  }
  return 0;
}

void add_text_options(CLI::App* cmd, EvalTextFlags& f) {
  cmd->add_option("--text", f.text, "Text to score (default: the last 10% of the shipped WikiText-2 corpus, as validate)");
  cmd->add_option("--window", f.options.window, "Tokens per window (BOS first; the second half is scored)")->capture_default_str();
  cmd->add_option("--chunk-size", f.options.chunk_size, "Prompt processor sequence length")->capture_default_str();
  cmd->add_option("--max-windows", f.options.max_windows, "Score at most this many windows (-1: all)")->capture_default_str();
  cmd->add_option("--path", f.path, "prompt (the prompt processor, chunks) or token (the token generator, one at a time)")
      ->capture_default_str();
  add_kv_type_option(cmd, f.kv_type);
  add_backend_option(cmd, f.backend);
  cmd->add_option("-o,--out", f.out, "Write a JSON report here");
  cmd->add_flag("-q,--quiet", f.quiet, "No progress bar");
  cmd->add_option("-t,--threads", f.threads, "Worker threads; 0 = all cores")->capture_default_str();
}

}  // namespace

void add_eval_command(CLI::App& app, CliContext& ctx) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a model: ppl (perplexity), kld (against a reference), bfcl (tool calling)");
  eval->require_subcommand(1);
  {
    auto f = std::make_shared<EvalTextFlags>();
    CLI::App* ppl = eval->add_subcommand(
        "ppl", "Perplexity with llama-perplexity's protocol (windows with BOS first, second half scored)");
    ppl->add_option("--model", f->model, "Checkpoint directory (float or quantized) or bundle")->required();
    add_text_options(ppl, *f);
    ppl->callback([f, &ctx] { ctx.exit_code = run_eval_text(*f, false); });
  }
  {
    auto f = std::make_shared<EvalTextFlags>();
    CLI::App* kld = eval->add_subcommand(
        "kld", "KL divergence, top-1 agreement and perplexities of a model against a reference, same protocol");
    kld->add_option("--model", f->model, "Checkpoint directory or bundle (e.g. the quantized one)")->required();
    kld->add_option("--reference", f->reference, "Reference checkpoint (e.g. the float one; its tokenizer is used)")->required();
    add_text_options(kld, *f);
    kld->callback([f, &ctx] { ctx.exit_code = run_eval_text(*f, true); });
  }
  auto f = std::make_shared<EvalBfclFlags>();
  CLI::App* cmd = eval->add_subcommand("bfcl", "BFCL-style tool calling: BFCL's AST categories, scored by BFCL's AST rules");
  cmd->add_option("--model", f->model, "Bundle, BUNDLE/config.json or checkpoint, run in process (as petrel serve runs it)");
  cmd->add_option("--endpoint", f->endpoint, "An OpenAI-compatible API instead, e.g. http://127.0.0.1:8080/v1");
  cmd->add_option("--api-key", f->api_key, "Bearer token for --endpoint");
  cmd->add_option("--model-name", f->model_name, "The request's \"model\"")->capture_default_str();
  cmd->add_option("--data", f->data, "Directory of BFCL_v4_<category>.json and possible_answer/ (default: the subset in tests/data/bfcl)")
      ->capture_default_str();
  cmd->add_option("--categories", f->categories, "Comma-separated categories")->capture_default_str();
  cmd->add_option("--limit", f->limit, "Entries per category (-1: all)")->capture_default_str();
  cmd->add_option("--max-tokens", f->max_tokens, "Tokens an answer may take")->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--reasoning", f->reasoning, "on, off or default (sent as the request's \"reasoning\")")->capture_default_str();
  cmd->add_option("--tool-format", f->tool_format, "--model: auto, nemotron, llama3-json, hermes")->capture_default_str();
  add_backend_option(cmd, f->backend);
  add_deterministic_option(cmd, f->deterministic);
  cmd->add_option("--context-length", f->context_length, "--model: KV cache positions")->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "--endpoint: seconds to wait for an answer")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "CPU worker threads; 0 = all cores")->capture_default_str();
  cmd->add_option("-o,--out", f->out, "Write the JSON report (every entry's outcome and output) here");
  cmd->callback([f, &ctx] { ctx.exit_code = run_eval_bfcl(*f); });
}

}  // namespace petrel::cli
