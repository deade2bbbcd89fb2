// `petrel validate`: a quantized model against its float reference on held-out text, through both deployment
// paths: the prompt processor (chunks of 128 tokens) and the token generator (one token at a time).
//
// Protocol (llama-perplexity's, so numbers compare with llama.cpp's): tokenize the text once with BOS, cut it
// into consecutive windows of `window` tokens, put BOS first in each, and score positions window/2 ...
// window-2 (each predicting the next token). Per path: KL divergence (float || quantized), top-1 agreement
// and perplexity; and the two paths of the quantized model against each other, which must agree within float
// tolerance (a broken deployment graph shows up there even when the quantizer "succeeded").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/eval/fidelity.h"
#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/util/status.h"

namespace petrel::eval {

struct ValidateThresholds {
  double max_kl_mean = 0.1;         // quantized vs float, each path
  double min_top1 = 0.75;           // quantized vs float, each path
  double max_path_kl_mean = 1e-4;   // prompt processor vs token generator of the quantized model
  double min_path_top1 = 0.99;
  nlohmann::ordered_json to_json() const;
};

struct ValidateOptions {
  int64_t window = 256;
  int64_t chunk_size = 128;
  int64_t max_windows = -1;  // -1: the whole text
  KvType kv_type = KvType::kF16;  // the quantized model's KV cache, as deployed (the reference uses float32)
  ValidateThresholds thresholds;
};

struct ValidateReport {
  int64_t windows = 0;
  FidelitySummary prompt_processor;  // quantized PP vs float
  FidelitySummary token_generator;   // quantized TG vs float
  FidelitySummary paths;             // quantized TG vs quantized PP
  ValidateThresholds thresholds;
  std::vector<std::string> failures;  // empty when passed
  bool passed() const { return failures.empty(); }
  nlohmann::ordered_json to_json() const;
};

// `tokens` is the tokenized text with BOS first. progress(windows_done, windows_total) may be empty.
Result<ValidateReport> validate_paths(const LlamaModel& quantized, const LlamaModel& reference,
                                      const std::vector<int32_t>& tokens, int32_t bos, const ValidateOptions& options,
                                      const std::function<void(int64_t, int64_t)>& progress = {});

// The logits of every position of one window, on the path asked for, from a fresh sequence: how eval ppl/kld
// reach a model on any backend. cpu_window_logits: a LlamaModel with a new KV cache of kv_type a window;
// cuda_window_logits: a CudaModel reset before each window (its prompt processor's chunk is the model's own).
using WindowLogits = std::function<Status(std::span<const int32_t> window, bool token_generator, std::vector<float>* logits)>;
WindowLogits cpu_window_logits(const LlamaModel& model, int64_t chunk_size, KvType kv_type);
WindowLogits cuda_window_logits(CudaModel& model);

// `petrel eval ppl`: one model's perplexity with the same protocol (windows of `window` tokens, BOS first, the
// second half scored), through the prompt processor or the token generator. ppl_stderr is the standard error of
// the estimate (exp(mean NLL) times the standard error of the mean NLL), as llama-perplexity prints it.
struct PerplexityOptions {
  int64_t window = 256;
  int64_t chunk_size = 128;
  int64_t max_windows = -1;
  KvType kv_type = KvType::kF16;
  bool token_generator = false;
};
struct PerplexityReport {
  int64_t windows = 0, positions = 0;
  double nll_mean = 0, perplexity = 0, perplexity_stderr = 0;
  nlohmann::ordered_json to_json() const;
};
Result<PerplexityReport> perplexity(const LlamaModel& model, const std::vector<int32_t>& tokens, int32_t bos,
                                    const PerplexityOptions& options,
                                    const std::function<void(int64_t, int64_t)>& progress = {});
// The same through any backend: `config` is the model's (vocabulary, positions).
Result<PerplexityReport> perplexity(const WindowLogits& model, const LlamaConfig& config, const std::vector<int32_t>& tokens,
                                    int32_t bos, const PerplexityOptions& options,
                                    const std::function<void(int64_t, int64_t)>& progress = {});

// `petrel eval kld`: a model against a reference on one path (the reference with a float32 KV cache, the model
// as deployed), same windows: KL divergence (reference || model), top-1 agreement, both perplexities.
Result<FidelitySummary> compare_models(const LlamaModel& model, const LlamaModel& reference, const std::vector<int32_t>& tokens,
                                       int32_t bos, const PerplexityOptions& options,
                                       const std::function<void(int64_t, int64_t)>& progress = {});
// The same through any backends (the reference is asked for the prompt processor's logits).
Result<FidelitySummary> compare_models(const WindowLogits& model, const WindowLogits& reference, const LlamaConfig& config,
                                       const std::vector<int32_t>& tokens, int32_t bos, const PerplexityOptions& options,
                                       const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace petrel::eval
