// Generation over a LlamaModel: new tokens through the prompt processor, then the token generator one token at a
// time. `continue_generation` is the one decoding loop; `generate` (fresh context) and Session (a dialog that
// keeps its KV cache) are built on it. The loop runs its forward passes through `ForwardPass`, a model with
// its KV cache: `CpuForward` (LlamaModel + KvCache) or `CudaForward` (CudaModel, whose cache is on the GPU).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "petrel/model/llama.h"
#include "petrel/runtime/sampler.h"
#include "petrel/util/status.h"

namespace petrel {

class CudaModel;
class LogitConstraint;

// A model bound to one sequence's KV cache: what the decoding loop needs of a backend.
class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  virtual const LlamaConfig& config() const = 0;
  virtual int64_t position() const = 0;        // tokens in the cache; the next one goes here
  virtual int64_t context_length() const = 0;  // positions the cache holds
  int64_t remaining() const { return context_length() - position(); }
  // The prompt processor: `tokens` at position() ..., appended to the cache; kLast: the last token's logits.
  // Fails with kOutOfRange, changing nothing, when they do not fit.
  virtual Status prompt(std::span<const int32_t> tokens, int64_t chunk_size, LogitsMode mode, std::vector<float>* logits) = 0;
  // The token generator: one token, its logits.
  virtual Status step(int32_t token, std::vector<float>* logits) = 0;
  // The same two with only the k largest logits of the last token (TopLogits), for backends that choose them
  // themselves: k up to max_top_k() (0: not offered, and these are not called).
  virtual int max_top_k() const { return 0; }
  virtual Status prompt_top(std::span<const int32_t>, int64_t, int, TopLogits*) { return unsupported("prompt_top"); }
  virtual Status step_top(int32_t, int, TopLogits*) { return unsupported("step_top"); }
  // step_top with a constraint's mask applied where the logits are (LogitConstraint::write_bits, called during
  // the step): for backends with masks_on_device().
  virtual bool masks_on_device() const { return false; }
  virtual Status step_top_masked(int32_t, int, LogitConstraint&, TopLogits*) { return unsupported("step_top_masked"); }
  virtual void truncate(int64_t n) = 0;  // forget positions >= n
  virtual void reset() = 0;
  // True where a step leaves the host's cores idle while it runs (the GPU), so that the decoding loop may use them
  // meanwhile (LogitConstraint::prepare); false where the step computes on the host's thread pool.
  virtual bool computes_on_device() const { return false; }
};

// The CPU: LlamaModel::process_prompt / forward over a host KvCache.
class CpuForward final : public ForwardPass {
 public:
  CpuForward(const LlamaModel& model, KvCache& cache) : model_(model), cache_(cache) {}
  const LlamaConfig& config() const override { return model_.config(); }
  int64_t position() const override { return cache_.n_past; }
  int64_t context_length() const override { return cache_.context_length; }
  Status prompt(std::span<const int32_t> tokens, int64_t chunk_size, LogitsMode mode, std::vector<float>* logits) override {
    return model_.process_prompt(tokens, cache_, chunk_size, mode, logits);
  }
  Status step(int32_t token, std::vector<float>* logits) override {
    return model_.forward(std::span<const int32_t>(&token, 1), cache_, LogitsMode::kLast, logits);
  }
  void truncate(int64_t n) override { cache_.truncate(n); }
  void reset() override { cache_.reset(); }

 private:
  const LlamaModel& model_;
  KvCache& cache_;
};

// The GPU: CudaModel's one-token step (prompts loop it), its fp16 KV cache on the device. `context_length`
// (at most the CudaModel's) limits the positions this sequence may use.
class CudaForward final : public ForwardPass {
 public:
  CudaForward(CudaModel& model, int64_t context_length);
  const LlamaConfig& config() const override;
  int64_t position() const override;
  int64_t context_length() const override { return context_length_; }
  Status prompt(std::span<const int32_t> tokens, int64_t chunk_size, LogitsMode mode, std::vector<float>* logits) override;
  Status step(int32_t token, std::vector<float>* logits) override;
  int max_top_k() const override;  // cuda::kMaxDeviceTopK for vocabularies the kernel takes
  Status prompt_top(std::span<const int32_t> tokens, int64_t chunk_size, int k, TopLogits* top) override;
  Status step_top(int32_t token, int k, TopLogits* top) override;
  bool masks_on_device() const override;  // CudaModelOptions::constraint_mask_on_device (off by default)
  Status step_top_masked(int32_t token, int k, LogitConstraint& constraint, TopLogits* top) override;
  void truncate(int64_t n) override;
  void reset() override;
  bool computes_on_device() const override { return true; }

 private:
  Status check_room(int64_t n) const;  // kOutOfRange unless n more positions fit

  CudaModel& model_;
  int64_t context_length_;
};

// Restricts what may be sampled (JSON mode, runtime/json_constraint.h): mask() sets the logits of the tokens that
// may not come next to -infinity, accept() is told each token chosen. Log-probabilities are then those of the
// masked logits. prepare() may do ahead what the next mask() needs of the state left by the last accept(): the
// decoding loop calls it on a thread of its own while a GPU computes the logits (ForwardPass::computes_on_device),
// so that the mask's host time hides behind the step; mask() gives the same result whether it ran or not.
class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  virtual void prepare() {}
  virtual void mask(std::span<float> logits) = 0;
  // The same mask as bits, for a backend that applies it where the logits are (ForwardPass::masks_on_device):
  // bit i % 32 of bits[i / 32] set where token i may come next; where none may, the end tokens (mask() keeps
  // their logits then). Only where writes_bits().
  virtual bool writes_bits() const { return false; }
  virtual void write_bits(std::span<uint32_t>) {}
  virtual void accept(int32_t token) = 0;
};

// A token's log-probability under the model: the log-softmax of the raw logits (before temperature, penalties
// and top-k/top-p: what vLLM reports by default and what a scoring harness needs), and the most likely tokens.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first, ids ascending on ties
};
// `token`'s log-probability in logits[vocab] and the `top` most likely (0: none). Computed in double.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top);

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  int64_t prompt_chunk_size = 128;  // the prompt processor's sequence length
  int64_t context_length = 4096;    // generate(): capped at the model's max_position_embeddings
  SamplerConfig sampler;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these (it is reported)
  // Log-probabilities: -1 off; else each generated token's with this many alternatives (the logits then all come
  // to the host, also on the GPU). on_logprobs, when set, sees each one before the token's TokenCallback.
  int logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs;
  // The same for the new prompt tokens: each one's given those before it, from the second on (the first has no
  // logits before it in this call). The prompt then runs with every position's logits, chunk by chunk.
  int prompt_logprobs = -1;
  // When set, every token is sampled from the logits it leaves (all logits then come to the host).
  LogitConstraint* constraint = nullptr;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;  // the first included
  double prompt_seconds = 0;  // prefill and sampling of the first token (time to first token)
  double decode_seconds = 0;  // the tokens after the first
};

enum class StopReason { kEndOfSequence, kStopString, kMaxTokens, kContextFull, kAborted, kCallback };
const char* stop_reason_name(StopReason reason);

// Called for each generated token (stop tokens included); return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

struct Continuation {
  std::vector<int32_t> tokens;
  StopReason reason = StopReason::kMaxTokens;
  GenerateStats stats;
  std::vector<TokenLogprobs> logprobs;         // one a generated token, when options.logprobs >= 0
  std::vector<TokenLogprobs> prompt_logprobs;  // new_tokens[1..], when options.prompt_logprobs >= 0
};

// Appends `new_tokens` to the dialog held by `cache` and `history` (the tokens whose keys and values the cache
// holds) and generates. The last generated token is not fed, so it is not in the cache or the history.
// Fails with kOutOfRange, changing nothing, when `new_tokens` do not fit. `abort` is polled between tokens.
Result<Continuation> continue_generation(const LlamaModel& model, KvCache& cache, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token = {},
                                         const std::atomic<bool>* abort = nullptr);

// The same loop over any backend; `forward` holds the cache whose tokens are `history`.
Result<Continuation> continue_generation(ForwardPass& forward, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token = {},
                                         const std::atomic<bool>* abort = nullptr);

// A fresh context of options.context_length positions.
Result<std::vector<int32_t>> generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenCallback& on_token = {},
                                      GenerateStats* stats = nullptr);
// On the GPU: `model`'s cache is reset first and options.context_length is capped at its context length.
Result<std::vector<int32_t>> generate(CudaModel& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                                      const TokenCallback& on_token = {}, GenerateStats* stats = nullptr);

}  // namespace petrel
