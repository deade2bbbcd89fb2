#include "petrel/eval/validate.h"

#include <cmath>
#include <cstdio>

namespace petrel::eval {

nlohmann::ordered_json ValidateThresholds::to_json() const {
  return {{"max_kl_mean", max_kl_mean}, {"min_top1", min_top1}, {"max_path_kl_mean", max_path_kl_mean},
          {"min_path_top1", min_path_top1}};
}

nlohmann::ordered_json ValidateReport::to_json() const {
  nlohmann::ordered_json j;
  j["passed"] = passed();
  j["failures"] = failures;
  j["windows"] = windows;
  j["prompt_processor"] = prompt_processor.to_json();
  j["token_generator"] = token_generator.to_json();
  j["paths_agreement"] = paths.to_json();
  j["thresholds"] = thresholds.to_json();
  return j;
}

namespace {

// All logits of a window through one path, with a KV cache of `kv_type`.
Status window_logits(const LlamaModel& model, std::span<const int32_t> window, bool token_generator,
                     int64_t chunk_size, KvType kv_type, std::vector<float>* logits) {
  PETREL_ASSIGN_OR_RETURN(KvCache cache, model.new_cache(static_cast<int64_t>(window.size()), kv_type));
  if (!token_generator) return model.process_prompt(window, cache, chunk_size, LogitsMode::kAll, logits);
  logits->clear();
  std::vector<float> step;
  for (size_t i = 0; i < window.size(); ++i) {
    PETREL_RETURN_IF_ERROR(model.forward(window.subspan(i, 1), cache, LogitsMode::kLast, &step));
    logits->insert(logits->end(), step.begin(), step.end());
  }
  return ok_status();
}

std::string fmt(const char* format, double a, double b) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b);
  return buf;
}

}  // namespace

Result<ValidateReport> validate_paths(const LlamaModel& quantized, const LlamaModel& reference,
                                      const std::vector<int32_t>& tokens, int32_t bos, const ValidateOptions& options,
                                      const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t vocab = reference.config().vocab_size;
  if (quantized.config().vocab_size != vocab) {
    return invalid_argument("the quantized model's vocabulary (" + std::to_string(quantized.config().vocab_size) +
                            ") differs from the reference's (" + std::to_string(vocab) + ")");
  }
  const int64_t w = options.window;
  if (w < 4 || w > reference.config().max_position_embeddings) {
    return invalid_argument("window " + std::to_string(w) + " must be in [4, max_position_embeddings]");
  }
  int64_t n_windows = static_cast<int64_t>(tokens.size()) / w;
  if (options.max_windows >= 0) n_windows = std::min(n_windows, options.max_windows);
  if (n_windows == 0) {
    return invalid_argument("the text has " + std::to_string(tokens.size()) + " tokens, fewer than one window of " +
                            std::to_string(w));
  }
  FidelityAccumulator pp, tg, paths;
  std::vector<float> ref_logits, pp_logits, tg_logits;
  for (int64_t k = 0; k < n_windows; ++k) {
    std::vector<int32_t> window(tokens.begin() + k * w, tokens.begin() + (k + 1) * w);
    window[0] = bos;
    // The reference keeps a float32 KV cache (its best numerics); the quantized model runs as deployed.
    PETREL_RETURN_IF_ERROR(window_logits(reference, window, false, options.chunk_size, KvType::kF32, &ref_logits));
    PETREL_RETURN_IF_ERROR(window_logits(quantized, window, false, options.chunk_size, options.kv_type, &pp_logits));
    PETREL_RETURN_IF_ERROR(window_logits(quantized, window, true, options.chunk_size, options.kv_type, &tg_logits));
    for (int64_t i = w / 2; i < w - 1; ++i) {
      std::span<const float> r(ref_logits.data() + i * vocab, vocab), p(pp_logits.data() + i * vocab, vocab),
          t(tg_logits.data() + i * vocab, vocab);
      pp.add(r, p, window[i + 1]);
      tg.add(r, t, window[i + 1]);
      paths.add(p, t, window[i + 1]);
    }
    if (progress) progress(k + 1, n_windows);
  }
  ValidateReport report;
  report.windows = n_windows;
  report.prompt_processor = pp.summary();
  report.token_generator = tg.summary();
  report.paths = paths.summary();
  report.thresholds = options.thresholds;
  const ValidateThresholds& th = options.thresholds;
  for (auto [name, s] : {std::pair<const char*, const FidelitySummary*>{"prompt processor", &report.prompt_processor},
                         {"token generator", &report.token_generator}}) {
    if (!(s->kl_mean <= th.max_kl_mean)) {
      report.failures.push_back(std::string(name) + fmt(": mean KL divergence to the float model %.4g exceeds %.4g", s->kl_mean, th.max_kl_mean));
    }
    if (!(s->top1_agreement >= th.min_top1)) {
      report.failures.push_back(std::string(name) + fmt(": top-1 agreement with the float model %.4f is below %.4f",
                                                        s->top1_agreement, th.min_top1));
    }
  }
  if (!(report.paths.kl_mean <= th.max_path_kl_mean)) {
    report.failures.push_back(fmt("the prompt processor and token generator disagree: mean KL %.4g exceeds %.4g", report.paths.kl_mean,
                                  th.max_path_kl_mean));
  }
  if (!(report.paths.top1_agreement >= th.min_path_top1)) {
    report.failures.push_back(fmt("the prompt processor and token generator disagree: top-1 agreement %.4f is below %.4f",
                                  report.paths.top1_agreement, th.min_path_top1));
  }
  return report;
}

namespace {

// The number of windows a text gives (checked), as validate_paths counts them.
Result<int64_t> count_windows(const LlamaConfig& config, size_t tokens, int64_t window, int64_t max_windows) {
  if (window < 4 || window > config.max_position_embeddings) {
    return invalid_argument("window " + std::to_string(window) + " must be in [4, max_position_embeddings]");
  }
  int64_t n = static_cast<int64_t>(tokens) / window;
  if (max_windows >= 0) n = std::min(n, max_windows);
  if (n == 0) {
    return invalid_argument("the text has " + std::to_string(tokens) + " tokens, fewer than one window of " + std::to_string(window));
  }
  return n;
}

}  // namespace

nlohmann::ordered_json PerplexityReport::to_json() const {
  return {{"windows", windows}, {"positions", positions}, {"nll_mean", nll_mean}, {"perplexity", perplexity},
          {"perplexity_stderr", perplexity_stderr}};
}

WindowLogits cpu_window_logits(const LlamaModel& model, int64_t chunk_size, KvType kv_type) {
  return [&model, chunk_size, kv_type](std::span<const int32_t> window, bool token_generator, std::vector<float>* logits) {
    return window_logits(model, window, token_generator, chunk_size, kv_type, logits);
  };
}

WindowLogits cuda_window_logits(CudaModel& model) {
  return [&model](std::span<const int32_t> window, bool token_generator, std::vector<float>* logits) -> Status {
    model.reset();
    if (!token_generator) return model.forward(window, LogitsMode::kAll, logits);
    logits->clear();
    std::vector<float> step;
    for (int32_t token : window) {
      PETREL_RETURN_IF_ERROR(model.decode(token, &step));
      logits->insert(logits->end(), step.begin(), step.end());
    }
    return ok_status();
  };
}

Result<PerplexityReport> perplexity(const LlamaModel& model, const std::vector<int32_t>& tokens, int32_t bos,
                                    const PerplexityOptions& options, const std::function<void(int64_t, int64_t)>& progress) {
  return perplexity(cpu_window_logits(model, options.chunk_size, options.kv_type), model.config(), tokens, bos, options, progress);
}

Result<PerplexityReport> perplexity(const WindowLogits& model, const LlamaConfig& config, const std::vector<int32_t>& tokens,
                                    int32_t bos, const PerplexityOptions& options,
                                    const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t w = options.window;
  PETREL_ASSIGN_OR_RETURN(const int64_t n_windows, count_windows(config, tokens.size(), w, options.max_windows));
  const int64_t vocab = config.vocab_size;
  double sum = 0, sum_sq = 0;
  int64_t positions = 0;
  std::vector<float> logits;
  std::vector<double> log_probs;
  for (int64_t k = 0; k < n_windows; ++k) {
    std::vector<int32_t> window(tokens.begin() + k * w, tokens.begin() + (k + 1) * w);
    window[0] = bos;
    PETREL_RETURN_IF_ERROR(model(window, options.token_generator, &logits));
    if (static_cast<int64_t>(logits.size()) != w * vocab) return internal_error("window logits: wrong size");
    for (int64_t i = w / 2; i < w - 1; ++i) {
      log_softmax(std::span<const float>(logits.data() + i * vocab, vocab), log_probs);
      const double nll = -log_probs[window[i + 1]];
      sum += nll;
      sum_sq += nll * nll;
      ++positions;
    }
    if (progress) progress(k + 1, n_windows);
  }
  PerplexityReport r;
  r.windows = n_windows;
  r.positions = positions;
  r.nll_mean = sum / positions;
  r.perplexity = std::exp(r.nll_mean);
  const double variance = positions > 1 ? (sum_sq / positions - r.nll_mean * r.nll_mean) * positions / (positions - 1) : 0.0;
  r.perplexity_stderr = r.perplexity * std::sqrt(std::max(variance, 0.0) / positions);
  return r;
}

Result<FidelitySummary> compare_models(const LlamaModel& model, const LlamaModel& reference, const std::vector<int32_t>& tokens,
                                       int32_t bos, const PerplexityOptions& options,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  if (model.config().vocab_size != reference.config().vocab_size) {
    return invalid_argument("the model's vocabulary (" + std::to_string(model.config().vocab_size) +
                            ") differs from the reference's (" + std::to_string(reference.config().vocab_size) + ")");
  }
  return compare_models(cpu_window_logits(model, options.chunk_size, options.kv_type),
                        cpu_window_logits(reference, options.chunk_size, KvType::kF32), reference.config(), tokens, bos,
                        options, progress);
}

Result<FidelitySummary> compare_models(const WindowLogits& model, const WindowLogits& reference, const LlamaConfig& config,
                                       const std::vector<int32_t>& tokens, int32_t bos, const PerplexityOptions& options,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t vocab = config.vocab_size;
  const int64_t w = options.window;
  PETREL_ASSIGN_OR_RETURN(const int64_t n_windows, count_windows(config, tokens.size(), w, options.max_windows));
  FidelityAccumulator acc;
  std::vector<float> ref_logits, logits;
  for (int64_t k = 0; k < n_windows; ++k) {
    std::vector<int32_t> window(tokens.begin() + k * w, tokens.begin() + (k + 1) * w);
    window[0] = bos;
    PETREL_RETURN_IF_ERROR(reference(window, false, &ref_logits));
    PETREL_RETURN_IF_ERROR(model(window, options.token_generator, &logits));
    if (static_cast<int64_t>(logits.size()) != w * vocab || static_cast<int64_t>(ref_logits.size()) != w * vocab) {
      return internal_error("window logits: wrong size");
    }
    for (int64_t i = w / 2; i < w - 1; ++i) {
      acc.add(std::span<const float>(ref_logits.data() + i * vocab, vocab), std::span<const float>(logits.data() + i * vocab, vocab),
              window[i + 1]);
    }
    if (progress) progress(k + 1, n_windows);
  }
  return acc.summary();
}

}  // namespace petrel::eval
