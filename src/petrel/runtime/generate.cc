#include "petrel/runtime/generate.h"

#include <algorithm>
#include <chrono>

namespace petrel {

Result<std::vector<int32_t>> generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenCallback& on_token,
                                      GenerateStats* stats) {
  using clock = std::chrono::steady_clock;
  if (prompt.empty()) return invalid_argument("generate: the prompt has no tokens");
  const int64_t context = std::min(options.context_length, model.config().max_position_embeddings);
  if (static_cast<int64_t>(prompt.size()) > context) {
    return out_of_range("Context Size was exceeded: the prompt has " + std::to_string(prompt.size()) +
                        " tokens and the context holds " + std::to_string(context));
  }
  PETREL_ASSIGN_OR_RETURN(KvCache cache, model.new_cache(context));
  Sampler sampler(options.sampler);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<int32_t> output;
  std::vector<float> logits;

  const auto t0 = clock::now();
  PETREL_RETURN_IF_ERROR(model.process_prompt(prompt, cache, options.prompt_chunk_size, LogitsMode::kLast, &logits));
  auto t_first = t0;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (step > 0) {
      if (cache.remaining() == 0) break;  // the context is full: stop rather than fail
      PETREL_RETURN_IF_ERROR(model.forward(std::span<const int32_t>(&output.back(), 1), cache, LogitsMode::kLast, &logits));
    }
    const int32_t token = sampler.sample(logits, history);
    if (step == 0) t_first = clock::now();
    output.push_back(token);
    history.push_back(token);
    const bool keep_going = on_token ? on_token(token) : true;
    const bool is_stop = std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
                         options.stop_token_ids.end();
    if (!keep_going || is_stop) break;
  }
  const auto t_end = clock::now();
  if (stats) {
    stats->prompt_tokens = static_cast<int64_t>(prompt.size());
    stats->generated_tokens = static_cast<int64_t>(output.size());
    stats->prompt_seconds = std::chrono::duration<double>(t_first - t0).count();
    stats->decode_seconds = std::chrono::duration<double>(t_end - t_first).count();
  }
  return output;
}

}  // namespace petrel
