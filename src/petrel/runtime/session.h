// The runtime library API: an Engine holds a loaded model (checkpoint or bundle) and its tokenizer and chat
// template; a Session is one dialog over it with its own KV cache (Genie's dialog handle).
//
//   auto engine = Engine::load("bundle/config.json");
//   Session session(*engine, 4096);
//   auto result = session.query(messages, GenerationConfig{}, ChatPromptOptions{}, on_token);
//
// Backends: Engine::load(path, EngineOptions) runs the model on the CPU (LlamaModel, host KV cache) or on a GPU
// (CudaModel: weights uploaded at load, fp16 KV cache on the device); kAuto takes the bundle's
// dialog.engine.backend.type, and cpu for a checkpoint. A bundle runs on either (a cpu bundle's padded qweight
// rows are compacted as they upload to the GPU; docs/BUNDLE_FORMAT.md). Sessions run through the same decoding loop (continue_generation over a ForwardPass). On cuda one
// Session at a time holds the engine's GPU KV cache; non-f16 KV caches are refused there. KV save/restore works on
// both and its files are the same: a state saved on one backend restores on the other.
//
// Multi-turn: query() renders the whole conversation and processes only the tokens after the longest prefix
// already in the KV cache, so earlier turns are not processed again. abort() may be called from another thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/runtime/generate.h"
#include "petrel/runtime/prompt.h"
#include "petrel/runtime/sampler.h"
#include "petrel/text/chat_template.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/status.h"

namespace petrel {

struct GenerationConfig {
  SamplerConfig sampler;
  int64_t max_new_tokens = 256;
  std::optional<std::vector<int32_t>> stop_token_ids;  // unset: the model's EOS ids
  std::vector<std::string> stop_strings;               // generation ends when the text contains one (not emitted)
  int64_t prompt_chunk_size = 128;
  // Log-probabilities (GenerateOptions): -1 off, else with this many alternatives. on_logprobs sees each
  // generated token's before the StreamCallback of that token. Prompt log-probabilities make query_prompt
  // process the whole prompt again (the cached prefix has no logits to give).
  int logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs;
  int prompt_logprobs = -1;
  LogitConstraint* constraint = nullptr;  // GenerateOptions::constraint (JSON mode); owned by the caller
};

// Timings of one query; rates follow Genie's definitions (see profile.h).
struct QueryStats {
  int64_t prompt_tokens = 0;     // processed by this query
  int64_t reused_tokens = 0;     // found in the KV cache already
  int64_t generated_tokens = 0;  // the first included
  double time_to_first_token_s = 0;
  double generation_s = 0;  // the tokens after the first
  double prompt_rate() const { return time_to_first_token_s > 0 ? prompt_tokens / time_to_first_token_s : 0; }
  double generation_rate() const { return generation_s > 0 ? generated_tokens / generation_s : 0; }
};

struct QueryResult {
  std::vector<int32_t> tokens;
  std::string text;  // decoded, stop string removed
  StopReason reason = StopReason::kMaxTokens;
  QueryStats stats;
  bool starts_in_reasoning = false;  // query(): the prompt ended inside an opened <think> block
  std::vector<TokenLogprobs> logprobs;         // one a generated token (config.logprobs >= 0)
  std::vector<TokenLogprobs> prompt_logprobs;  // the processed prompt tokens after the first (config.prompt_logprobs >= 0)
};

// Streaming callback: each token and the text it completes (possibly empty); return false to stop.
using StreamCallback = std::function<bool(int32_t token, std::string_view text)>;

enum class Backend { kAuto, kCpu, kCuda };
const char* backend_name(Backend backend);  // "auto", "cpu", "cuda"
// "auto", "cpu" or "cuda"; anything else is kInvalidArgument naming the value.
Result<Backend> parse_backend(std::string_view name);
// The backend a model runs on: `requested` unless kAuto; for kAuto the bundle's dialog.engine.backend.type,
// cpu for a checkpoint directory. Fails when the bundle's config cannot be read.
Result<Backend> resolve_backend(const std::filesystem::path& model_path, Backend requested);

struct EngineOptions {
  Backend backend = Backend::kAuto;
  int device = 0;                  // cuda: the GPU, as the CUDA runtime numbers them
  int64_t context_length = 4096;   // cuda: KV cache positions allocated on the GPU (a Session may use fewer)
  PrefillF16Weights cuda_prefill_f16_weights = PrefillF16Weights::kAuto;  // cuda: CudaModelOptions's (memory for prompt speed)
  // cuda: decode steps bitwise reproducible from run to run (CudaModelOptions::decode_atomic_reduce off: ~10%
  // slower generation); the CPU backend always is.
  bool cuda_deterministic = false;
  // cuda: constrained decoding (JSON mode, schemas, forced tool calls) masks the whole vocabulary's logits on the
  // host instead of on the GPU (CudaModelOptions::constraint_mask_on_device off): slower, for comparison.
  bool cuda_host_masks = false;
  ModelLoadOptions model;
};

// Where Engine::load's time went, in milliseconds of wall time (`petrel run --log info` prints it).
struct EngineLoadTimes {
  double devices_ms = 0;  // cuda: finding the GPUs (the CUDA driver's first call)
  double weights_ms = 0;  // reading the checkpoint or bundle into host memory
  double text_ms = 0;     // tokenizer and chat template, read on a thread of their own beside the weights
  double gpu_ms = 0;      // cuda: CudaModel::create (CudaInitTimes has its parts)
  CudaInitTimes gpu;
  double total_ms = 0;
};

class Session;

class Engine {
 public:
  static Result<std::shared_ptr<Engine>> load(const std::filesystem::path& model_path, const ModelLoadOptions& options = {});
  static Result<std::shared_ptr<Engine>> load(const std::filesystem::path& model_path, const EngineOptions& options);
  Backend backend() const { return backend_; }  // kCpu or kCuda
  CudaModel* cuda_model() const { return cuda_.get(); }  // set when backend() is kCuda
  const LlamaModel& model() const { return *model_; }
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  const text::ChatTemplateSet* templates() const { return templates_ ? &*templates_ : nullptr; }
  const EngineLoadTimes& load_times() const { return load_times_; }

 private:
  EngineLoadTimes load_times_;
  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<text::ChatTemplateSet> templates_;
  Backend backend_ = Backend::kCpu;
  std::unique_ptr<CudaModel> cuda_;
  // The cuda backend's one CudaModel is shared by the engine's Sessions in turns: the owner's sequence is in
  // the model's KV cache, every other Session's in its CudaKvStash (Session::take_gpu).
  mutable std::recursive_mutex cuda_mutex_;
  mutable const Session* cuda_owner_ = nullptr;  // guarded by cuda_mutex_
  friend class Session;
};

class Session {
 public:
  // kv_type: the KV cache's element type (f16 by default; q8 quarters float32's memory, f32 is the reference).
  // On a cuda engine the session cannot always be made (a KV type other than f16, a context longer than the
  // engine allocated): status() says why, and every query returns it. A cuda engine's Sessions share its GPU in
  // turns: a call that needs the GPU waits while another Session's runs, and when the last Session to run was
  // another, first sets that one's KV rows aside on the GPU and brings this one's back (GPU-to-GPU copies of the
  // positions in use; the set-aside memory grows with them and is freed with the Session or by reset()).
  // Sessions may be used from different threads; one Session from one thread at a time (abort() excepted).
  Session(std::shared_ptr<const Engine> engine, int64_t context_length, KvType kv_type = KvType::kF16);
  ~Session();
  // The constructor, failing with status()'s error instead.
  static Result<std::unique_ptr<Session>> create(std::shared_ptr<const Engine> engine, int64_t context_length,
                                                 KvType kv_type = KvType::kF16);
  const Status& status() const { return init_status_; }

  // Appends `tokens` to the dialog and generates. Fails with kOutOfRange ("Context Size was exceeded") when
  // they do not fit, leaving the session as it was.
  Result<QueryResult> query_tokens(std::span<const int32_t> tokens, const GenerationConfig& config,
                                   const StreamCallback& on_token = {});
  // Renders `messages` (the whole conversation) with the model's chat template and reuses the cached prefix.
  Result<QueryResult> query(const nlohmann::ordered_json& messages, const GenerationConfig& config,
                            const ChatPromptOptions& prompt_options = {}, const StreamCallback& on_token = {},
                            const nlohmann::ordered_json* tools = nullptr);
  // The same for a prompt already built (build_chat_prompt): its tokens are the whole conversation.
  Result<QueryResult> query_prompt(const ChatPrompt& prompt, const GenerationConfig& config,
                                   const StreamCallback& on_token = {});

  void abort() { abort_.store(true); }  // thread-safe; the running query stops after its current token
  void reset();
  // The dialog's tokens and KV cache, written atomically (a temporary name, renamed when complete). One format on
  // both backends (the f16 cache's rows are laid out alike), so a state moves between them; restore checks the
  // whole file (model shape, KV type, context, size) before it changes anything.
  Status save(const std::filesystem::path& path) const;
  Status restore(const std::filesystem::path& path);

  int64_t position() const;
  int64_t context_length() const { return forward_ ? forward_->context_length() : 0; }
  const std::vector<int32_t>& history() const { return history_; }

 private:
  std::shared_ptr<const Engine> engine_;
  KvCache cache_;  // the CPU backend's
  std::unique_ptr<ForwardPass> forward_;  // over cache_, or over the engine's CudaModel; null when !init_status_.ok()
  // On a cuda engine: waits for the GPU and makes this Session its owner (the previous owner's KV rows into its
  // stash, this one's out of its own); for the CPU backend an empty lock. Holds the GPU until the lock goes.
  Result<std::unique_lock<std::recursive_mutex>> take_gpu() const;

  Status init_status_;
  bool on_cuda_ = false;                     // forward_ runs the engine's CudaModel
  std::unique_ptr<CudaKvStash> cuda_stash_;  // this Session's sequence while another owns the GPU
  std::vector<int32_t> history_;  // tokens whose keys/values are in the cache, in order
  std::atomic<bool> abort_{false};
};

}  // namespace petrel
