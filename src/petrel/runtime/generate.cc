#include "petrel/runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "petrel/kernels/ref/ops.h"
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
  PETREL_RETURN_IF_ERROR(check_room(static_cast<int64_t>(tokens.size())));
  return model_.forward(tokens, mode, logits);  // the prompt processor in the model's own chunks
}

Status CudaForward::step(int32_t token, std::vector<float>* logits) {
  PETREL_RETURN_IF_ERROR(check_room(1));
  return model_.decode(token, logits);
}

int CudaForward::max_top_k() const { return CudaModel::max_top_k(model_.config()); }

Status CudaForward::prompt_top(std::span<const int32_t> tokens, int64_t, int k, TopLogits* top) {
  PETREL_RETURN_IF_ERROR(check_room(static_cast<int64_t>(tokens.size())));
  return model_.forward_top(tokens, k, top);
}

Status CudaForward::step_top(int32_t token, int k, TopLogits* top) {
  PETREL_RETURN_IF_ERROR(check_room(1));
  return model_.decode_top(token, k, top);
}

bool CudaForward::masks_on_device() const { return max_top_k() > 0 && model_.constraint_mask_on_device(); }

Status CudaForward::step_top_masked(int32_t token, int k, LogitConstraint& constraint, TopLogits* top) {
  PETREL_RETURN_IF_ERROR(check_room(1));
  return model_.decode_top_masked(token, k, [&](std::span<uint32_t> bits) { constraint.write_bits(bits); }, top);
}

Status CudaForward::check_room(int64_t n) const {
  if (n <= remaining()) return ok_status();
  return out_of_range("Context Size was exceeded: " + std::to_string(position()) + " positions used + " + std::to_string(n) +
                      " new > context length " + std::to_string(context_length_));
}

Result<Continuation> continue_generation(const LlamaModel& model, KvCache& cache, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token, const std::atomic<bool>* abort) {
  CpuForward forward(model, cache);
  return continue_generation(forward, history, new_tokens, options, on_token, abort);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top) {
  const double log_z = ref::log_sum_exp(logits);
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_z);
  const size_t k = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (k > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), more_likely);
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - log_z));
  }
  return out;
}

namespace {

// One task at a time on a thread of its own, started and awaited by the decoding loop: a constraint's next mask
// while the GPU computes the logits it will apply to. The thread starts at the first task and ends with the loop.
class SideTask {
 public:
  SideTask() = default;
  SideTask(const SideTask&) = delete;
  SideTask& operator=(const SideTask&) = delete;
  ~SideTask() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> task) {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = std::move(task);
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !task_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || task_; });
      if (!task_) return;  // quit_, nothing pending
      std::function<void()> task = task_;
      lock.unlock();
      task();
      lock.lock();
      task_ = nullptr;
      cv_.notify_all();
    }
  }

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool quit_ = false;
};

}  // namespace

Result<Continuation> continue_generation(ForwardPass& forward, std::vector<int32_t>& history,
                                         std::span<const int32_t> new_tokens, const GenerateOptions& options,
                                         const TokenCallback& on_token, const std::atomic<bool>* abort) {
  using clock = std::chrono::steady_clock;
  if (new_tokens.empty()) return invalid_argument("generate: no new tokens");
  Continuation result;
  Sampler sampler(options.sampler);
  // When the sampler needs only the k largest logits and the backend can pick them (the GPU), only those reach
  // the host: on an H200 with Llama 3's 128K vocabulary that saves ~0.1 ms a token of copying and scanning.
  const int32_t k = sampler.top_needed(static_cast<int32_t>(forward.config().vocab_size));
  const bool top_only = options.logprobs < 0 && !options.constraint && k > 0 && k <= forward.max_top_k();
  const int64_t vocab = forward.config().vocab_size;
  std::vector<float> logits;
  TopLogits top;
  // With a constraint, on a backend that can mask where the logits are, the steps after the first take the k
  // largest of the masked logits (the mask's bits written on the host during the step).
  const bool device_mask = options.logprobs < 0 && options.constraint && options.constraint->writes_bits() && k > 0 &&
                           k <= forward.max_top_k() && forward.masks_on_device();
  bool from_top = top_only;  // this token's candidates are in `top`, not `logits`
  auto pick = [&] {
    if (!from_top) return sampler.sample(logits, history);
    return top.all.empty() ? sampler.sample_top(top.values, top.ids) : sampler.sample(top.all, history);
  };
  // A constraint's next mask depends only on the text so far: where the forward pass runs on a GPU it is computed
  // on a side thread meanwhile (the prompt's, then each step's). An early return waits for it (~SideTask).
  const bool overlap_mask = options.constraint && forward.computes_on_device();
  SideTask side;
  if (overlap_mask) side.start([&] { options.constraint->prepare(); });
  const auto t0 = clock::now();
  if (options.prompt_logprobs >= 0) {
    // Every position's logits, one chunk at a time (a long prompt's [n, vocab] logits would not fit in memory);
    // the last row is the first generated token's.
    const int64_t n = static_cast<int64_t>(new_tokens.size()), chunk = std::max<int64_t>(options.prompt_chunk_size, 1);
    if (n > forward.remaining()) return out_of_range("Context Size was exceeded: " + std::to_string(forward.position()) +
                                                     " positions used + " + std::to_string(n) + " new tokens > context length " +
                                                     std::to_string(forward.context_length()));
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t count = std::min(chunk, n - begin);
      PETREL_RETURN_IF_ERROR(forward.prompt(new_tokens.subspan(begin, count), chunk, LogitsMode::kAll, &logits));
      for (int64_t i = 0; i < count && begin + i + 1 < n; ++i) {
        result.prompt_logprobs.push_back(token_logprobs(std::span<const float>(logits).subspan(i * vocab, vocab),
                                                        new_tokens[begin + i + 1], options.prompt_logprobs));
      }
    }
    logits.erase(logits.begin(), logits.end() - vocab);
  } else if (top_only) {
    PETREL_RETURN_IF_ERROR(forward.prompt_top(new_tokens, options.prompt_chunk_size, k, &top));
  } else {
    PETREL_RETURN_IF_ERROR(forward.prompt(new_tokens, options.prompt_chunk_size, LogitsMode::kLast, &logits));
  }
  history.insert(history.end(), new_tokens.begin(), new_tokens.end());
  if (overlap_mask) side.wait();
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
      if (device_mask) {
        PETREL_RETURN_IF_ERROR(forward.step_top_masked(result.tokens.back(), k, *options.constraint, &top));
        from_top = true;
      } else {
        if (overlap_mask) side.start([&] { options.constraint->prepare(); });
        Status stepped = top_only ? forward.step_top(result.tokens.back(), k, &top) : forward.step(result.tokens.back(), &logits);
        if (overlap_mask) side.wait();
        PETREL_RETURN_IF_ERROR(stepped);
      }
      history.push_back(result.tokens.back());
    }
    if (options.constraint && !from_top) options.constraint->mask(logits);
    const int32_t token = pick();
    if (options.constraint) options.constraint->accept(token);
    if (step == 0) t_first = clock::now();
    result.tokens.push_back(token);
    if (options.logprobs >= 0) {
      result.logprobs.push_back(token_logprobs(logits, token, options.logprobs));
      if (options.on_logprobs) options.on_logprobs(result.logprobs.back());
    }
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
