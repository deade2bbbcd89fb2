#include "petrel/runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "petrel/model/cuda_model.h"

namespace petrel {

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::kEndOfSequence: return "eos";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kAborted: return "aborted";
    case StopReason::kCallback: return "callback";
  }
  return "?";
}

CudaForward::CudaForward(CudaModel& model, int64_t context_length)
    : model_(model), context_length_(std::min(context_length, model.context_length())) {}
const LlamaConfig& CudaForward::config() const { return model_.config(); }
int64_t CudaForward::position() const { return model_.position(); }
void CudaForward::truncate(int64_t n) { model_.truncate(n); }
void CudaForward::reset() { model_.reset(); }

Status CudaForward::prompt(std::span<const int32_t> tokens, int64_t, LogitsMode mode, std::vector<float>* logits) {
  if (static_cast<int64_t>(tokens.size()) > remaining()) {
    return out_of_range("Context Size was exceeded: " + std::to_string(position()) + " positions used + " +
                        std::to_string(tokens.size()) + " new > context length " + std::to_string(context_length_));
  }
  return model_.forward(tokens, mode, logits);  // no batched prefill on the GPU yet: the step, token by token
}

Status CudaForward::step(int32_t token, std::vector<float>* logits) {
  if (remaining() < 1) {
    return out_of_range("Context Size was exceeded: " + std::to_string(position()) + " positions used + 1 new > context length " +
                        std::to_string(context_length_));
  }
  return model_.decode(token, logits);
}

Result<Continuation> continue_generation(const LlamaModel& model, KvCache& cache, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token, const std::atomic<bool>* abort) {
  CpuForward forward(model, cache);
  return continue_generation(forward, history, new_tokens, options, on_token, abort);
}

Result<Continuation> continue_generation(ForwardPass& forward, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token, const std::atomic<bool>* abort) {
  using clock = std::chrono::steady_clock;
  if (new_tokens.empty()) return invalid_argument("generate: no new tokens");
  Continuation result;
  std::vector<float> logits;
  const auto t0 = clock::now();
  PETREL_RETURN_IF_ERROR(forward.prompt(new_tokens, options.prompt_chunk_size, LogitsMode::kLast, &logits));
  history.insert(history.end(), new_tokens.begin(), new_tokens.end());
  Sampler sampler(options.sampler);
  auto t_first = clock::now();
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (step > 0) {
      if (abort && abort->load()) {
        result.reason = StopReason::kAborted;
        break;
      }
      if (forward.remaining() == 0) {  // the context is full: stop rather than fail
        result.reason = StopReason::kContextFull;
        break;
      }
      PETREL_RETURN_IF_ERROR(forward.step(result.tokens.back(), &logits));
      history.push_back(result.tokens.back());
    }
    const int32_t token = sampler.sample(logits, history);
    if (step == 0) t_first = clock::now();
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.reason = StopReason::kCallback;
      break;
    }
    if (std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) != options.stop_token_ids.end()) {
      result.reason = StopReason::kEndOfSequence;
      break;
    }
  }
  result.stats.prompt_tokens = static_cast<int64_t>(new_tokens.size());
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.prompt_seconds = std::chrono::duration<double>(t_first - t0).count();
  result.stats.decode_seconds = std::chrono::duration<double>(clock::now() - t_first).count();
  return result;
}

Result<std::vector<int32_t>> generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenCallback& on_token,
                                      GenerateStats* stats) {
  if (prompt.empty()) return invalid_argument("generate: the prompt has no tokens");
  const int64_t context = std::min(options.context_length, model.config().max_position_embeddings);
  if (static_cast<int64_t>(prompt.size()) > context) {
    return out_of_range("Context Size was exceeded: the prompt has " + std::to_string(prompt.size()) +
                        " tokens and the context holds " + std::to_string(context));
  }
  PETREL_ASSIGN_OR_RETURN(KvCache cache, model.new_cache(context));
  std::vector<int32_t> history;
  PETREL_ASSIGN_OR_RETURN(Continuation result, continue_generation(model, cache, history, prompt, options, on_token));
  if (stats) *stats = result.stats;
  return std::move(result.tokens);
}

Result<std::vector<int32_t>> generate(CudaModel& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                                      const TokenCallback& on_token, GenerateStats* stats) {
  if (prompt.empty()) return invalid_argument("generate: the prompt has no tokens");
  CudaForward forward(model, options.context_length);
  if (static_cast<int64_t>(prompt.size()) > forward.context_length()) {
    return out_of_range("Context Size was exceeded: the prompt has " + std::to_string(prompt.size()) +
                        " tokens and the context holds " + std::to_string(forward.context_length()));
  }
  forward.reset();
  std::vector<int32_t> history;
  PETREL_ASSIGN_OR_RETURN(Continuation result, continue_generation(forward, history, prompt, options, on_token));
  if (stats) *stats = result.stats;
  return std::move(result.tokens);
}

}  // namespace petrel
