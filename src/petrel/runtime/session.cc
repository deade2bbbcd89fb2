#include "petrel/runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>

#include "petrel/io/bundle.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/model/cuda_model.h"
#include "petrel/runtime/stop_strings.h"
#include "petrel/util/file.h"

namespace petrel {

namespace fs = std::filesystem;

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "?";
}

Result<Backend> parse_backend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  return invalid_argument("--backend must be cpu, cuda or auto, got '" + std::string(name) + "'");
}

Result<Backend> resolve_backend(const fs::path& model_path, Backend requested) {
  if (requested != Backend::kAuto) return requested;
  if (!is_bundle_path(model_path)) return Backend::kCpu;  // a checkpoint directory
  PETREL_ASSIGN_OR_RETURN(BundleConfig config, load_bundle_config(model_path));
  return config.backend == BundleBackend::kCuda ? Backend::kCuda : Backend::kCpu;
}

Result<std::shared_ptr<Engine>> Engine::load(const fs::path& model_path, const ModelLoadOptions& options) {
  EngineOptions engine_options;
  engine_options.model = options;
  return load(model_path, engine_options);
}

namespace {

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The tokenizer and chat template beside a model, each optional (token-only use works without them).
struct TextFiles {
  std::optional<Tokenizer> tokenizer;
  std::optional<text::ChatTemplateSet> templates;
  double ms = 0;
};

TextFiles load_text_files(const fs::path& model_path) {
  const auto start = std::chrono::steady_clock::now();
  TextFiles files;
  std::error_code ec;
  const fs::path text_dir = fs::is_directory(model_path, ec) ? model_path : model_path.parent_path();
  auto tokenizer = Tokenizer::load(text_dir);
  if (tokenizer.ok()) files.tokenizer = std::move(tokenizer).value();
  auto templates = text::load_chat_template(text_dir);
  if (templates.ok()) files.templates = std::move(templates).value();
  files.ms = milliseconds_since(start);
  return files;
}

}  // namespace

Result<std::shared_ptr<Engine>> Engine::load(const fs::path& model_path, const EngineOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto engine = std::make_shared<Engine>();
  EngineLoadTimes& times = engine->load_times_;
  PETREL_ASSIGN_OR_RETURN(engine->backend_, resolve_backend(model_path, options.backend));
  // The tokenizer (a Llama 3 tokenizer.json takes ~0.3-0.7 s to read) loads on its own thread while the
  // weights are read and uploaded; the future is waited for on every path out of here.
  std::future<TextFiles> text_files = std::async(std::launch::async, load_text_files, model_path);
  // Why the GPU was chosen, for the errors: asked for, or the bundle's config.
  const std::string why = options.backend == Backend::kCuda
                              ? std::string("backend cuda was asked for")
                              : model_path.string() + " was exported for petrel-cuda (dialog.engine.backend.type)";
  const std::string hint = options.backend == Backend::kCuda
                               ? std::string()
                               : "; to run it on the CPU pass --backend cpu (the CPU reads it as it is)";
  if (engine->backend_ == Backend::kCuda && !cuda::built_with_cuda()) {
    return unsupported(why + ", but the CUDA backend is not built (configure with nvcc available and -DPETREL_CUDA=ON)" + hint);
  }
  if (engine->backend_ == Backend::kCuda) {
    // Before the weights are read: a missing GPU is reported at once.
    const auto devices_start = std::chrono::steady_clock::now();
    PETREL_ASSIGN_OR_RETURN(std::vector<cuda::DeviceInfo> devices, cuda::list_devices());
    if (devices.empty()) return unsupported(why + ", but there is no CUDA device: " + cuda::no_device_reason() + hint);
    times.devices_ms = milliseconds_since(devices_start);
  }
  const auto weights_start = std::chrono::steady_clock::now();
  PETREL_ASSIGN_OR_RETURN(engine->model_, LlamaModel::load(model_path, options.model));
  times.weights_ms = milliseconds_since(weights_start);
  if (engine->backend_ == Backend::kCuda) {
    const auto gpu_start = std::chrono::steady_clock::now();
    CudaModelOptions cuda_options;
    cuda_options.device = options.device;
    cuda_options.context_length = options.context_length;
    cuda_options.prefill_f16_weights = options.cuda_prefill_f16_weights;
    cuda_options.decode_atomic_reduce = !options.cuda_deterministic;
    cuda_options.constraint_mask_on_device = !options.cuda_host_masks;
    auto gpu = CudaModel::create(*engine->model_, cuda_options);
    if (!gpu.ok()) return Status(gpu.status().code(), model_path.string() + " on the cuda backend: " + gpu.status().message());
    engine->cuda_ = std::move(gpu).value();
    times.gpu_ms = milliseconds_since(gpu_start);
    times.gpu = engine->cuda_->init_times();
  }
  TextFiles text = text_files.get();
  engine->tokenizer_ = std::move(text.tokenizer);
  engine->templates_ = std::move(text.templates);
  times.text_ms = text.ms;
  times.total_ms = milliseconds_since(start);
  return engine;
}

Session::Session(std::shared_ptr<const Engine> engine, int64_t context_length, KvType kv_type)
    : engine_(std::move(engine)) {
  const LlamaConfig& c = engine_->model().config();
  const int64_t context = std::min(context_length, c.max_position_embeddings);
  if (engine_->backend() != Backend::kCuda) {
    cache_ = KvCache(context, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, kv_type);
    forward_ = std::make_unique<CpuForward>(engine_->model(), cache_);
    return;
  }
  CudaModel& gpu = *engine_->cuda_model();
  if (kv_type != KvType::kF16) {
    init_status_ = unsupported(std::string("the cuda backend keeps an f16 KV cache; KV cache type ") +
                               cpu::kv_type_name(kv_type) + " is not supported on it yet (use f16, or the cpu backend)");
  } else if (context > gpu.context_length()) {
    init_status_ = invalid_argument("a context of " + std::to_string(context) + " positions is more than the " +
                                    std::to_string(gpu.context_length()) +
                                    " the engine allocated on the GPU (EngineOptions::context_length)");
  } else {
    on_cuda_ = true;
    cuda_stash_ = std::make_unique<CudaKvStash>();  // empty: the session starts with no positions
    forward_ = std::make_unique<CudaForward>(gpu, context);
  }
}

Session::~Session() {
  if (!on_cuda_) return;
  std::lock_guard lock(engine_->cuda_mutex_);
  if (engine_->cuda_owner_ == this) engine_->cuda_owner_ = nullptr;
}

Result<std::unique_lock<std::recursive_mutex>> Session::take_gpu() const {
  if (!on_cuda_) return std::unique_lock<std::recursive_mutex>();
  std::unique_lock lock(engine_->cuda_mutex_);
  const Session* owner = engine_->cuda_owner_;
  if (owner == this) return lock;
  CudaModel& gpu = *engine_->cuda_model();
  if (owner) {  // on failure the owner keeps the GPU and nothing has changed
    PETREL_RETURN_IF_ERROR(gpu.stash_kv(*owner->cuda_stash_));
    engine_->cuda_owner_ = nullptr;  // its sequence is in its stash now
  }
  PETREL_RETURN_IF_ERROR(gpu.unstash_kv(*cuda_stash_));
  engine_->cuda_owner_ = this;
  return lock;
}

int64_t Session::position() const {
  if (!forward_) return 0;
  if (!on_cuda_) return forward_->position();
  std::lock_guard lock(engine_->cuda_mutex_);
  return engine_->cuda_owner_ == this ? forward_->position() : cuda_stash_->position();
}

Result<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Engine> engine, int64_t context_length, KvType kv_type) {
  auto session = std::make_unique<Session>(std::move(engine), context_length, kv_type);
  PETREL_RETURN_IF_ERROR(session->status());
  return session;
}

void Session::reset() {
  if (on_cuda_) {
    std::lock_guard lock(engine_->cuda_mutex_);
    if (engine_->cuda_owner_ == this) forward_->reset();
    *cuda_stash_ = CudaKvStash();  // empty, its memory freed
  } else if (forward_) {
    forward_->reset();
  }
  history_.clear();
}

Result<QueryResult> Session::query_tokens(std::span<const int32_t> tokens, const GenerationConfig& config,
                                          const StreamCallback& on_token) {
  abort_.store(false);
  PETREL_RETURN_IF_ERROR(init_status_);
  PETREL_ASSIGN_OR_RETURN(const auto gpu_turn, take_gpu());
  if (static_cast<int64_t>(tokens.size()) > forward_->remaining()) {
    return out_of_range("Context Size was exceeded: " + std::to_string(forward_->position()) + " positions used + " +
                        std::to_string(tokens.size()) + " new > context length " + std::to_string(forward_->context_length()));
  }
  GenerateOptions options;
  options.max_new_tokens = config.max_new_tokens;
  options.prompt_chunk_size = config.prompt_chunk_size;
  options.sampler = config.sampler;
  options.stop_token_ids = config.stop_token_ids.value_or(engine_->model().config().eos_token_ids);
  options.logprobs = config.logprobs;
  options.on_logprobs = config.on_logprobs;
  options.prompt_logprobs = config.prompt_logprobs;
  options.constraint = config.constraint;

  // Text: decoded as it streams, held back while it may still become a stop string.
  QueryResult result;
  std::optional<StreamingDecoder> decoder;
  if (engine_->tokenizer()) decoder.emplace(*engine_->tokenizer(), /*skip_special=*/true);
  StopStringFilter stops(config.stop_strings);
  bool stop_string_seen = false;
  Status decode_status;
  auto on_generated = [&](int32_t token) {
    std::string piece;
    if (decoder) {
      auto raw = decoder->push(token);
      if (!raw.ok()) {
        decode_status = raw.status();
        return false;
      }
      piece = stops.push(*raw, &stop_string_seen);
      result.text += piece;
    }
    if (on_token && !on_token(token, piece)) return false;
    return !stop_string_seen;
  };
  PETREL_ASSIGN_OR_RETURN(Continuation generated,
                          continue_generation(*forward_, history_, tokens, options, on_generated, &abort_));
  PETREL_RETURN_IF_ERROR(decode_status);
  result.tokens = std::move(generated.tokens);
  result.logprobs = std::move(generated.logprobs);
  result.prompt_logprobs = std::move(generated.prompt_logprobs);
  result.reason = stop_string_seen ? StopReason::kStopString : generated.reason;
  if (decoder && !stop_string_seen) {
    bool stopped = false;
    std::string rest = stops.push(decoder->flush(), &stopped);
    if (!stopped) rest += stops.flush();
    result.text += rest;
    if (on_token && !rest.empty()) on_token(-1, rest);
  }
  result.stats.prompt_tokens = generated.stats.prompt_tokens;
  result.stats.generated_tokens = generated.stats.generated_tokens;
  result.stats.time_to_first_token_s = generated.stats.prompt_seconds;
  result.stats.generation_s = generated.stats.decode_seconds;
  return result;
}

Result<QueryResult> Session::query(const nlohmann::ordered_json& messages, const GenerationConfig& config,
                                   const ChatPromptOptions& prompt_options, const StreamCallback& on_token,
                                   const nlohmann::ordered_json* tools) {
  PETREL_RETURN_IF_ERROR(init_status_);
  if (!engine_->tokenizer() || !engine_->templates()) {
    return invalid_argument("query: the model has no tokenizer.json or chat template; use query_tokens");
  }
  PETREL_ASSIGN_OR_RETURN(ChatPrompt prompt,
                          build_chat_prompt(*engine_->tokenizer(), *engine_->templates(), messages, tools, prompt_options));
  return query_prompt(prompt, config, on_token);
}

Result<QueryResult> Session::query_prompt(const ChatPrompt& prompt, const GenerationConfig& config,
                                          const StreamCallback& on_token) {
  PETREL_RETURN_IF_ERROR(init_status_);
  if (prompt.tokens.empty()) return invalid_argument("query: the prompt has no tokens");
  // Reuse the longest prefix already in the cache; at least one token must be processed to get logits.
  size_t common = 0;
  while (common < history_.size() && common < prompt.tokens.size() && history_[common] == prompt.tokens[common]) ++common;
  if (common == prompt.tokens.size()) --common;
  if (config.prompt_logprobs >= 0) common = 0;  // every prompt position's logits are wanted
  PETREL_ASSIGN_OR_RETURN(const auto gpu_turn, take_gpu());  // held through query_tokens (it takes it again)
  if (static_cast<int64_t>(prompt.tokens.size() - common) > forward_->context_length() - static_cast<int64_t>(common)) {
    return out_of_range("Context Size was exceeded: the conversation has " + std::to_string(prompt.tokens.size()) +
                        " tokens and the context holds " + std::to_string(forward_->context_length()));
  }
  forward_->truncate(static_cast<int64_t>(common));
  history_.resize(common);
  PETREL_ASSIGN_OR_RETURN(QueryResult result,
                          query_tokens(std::span<const int32_t>(prompt.tokens).subspan(common), config, on_token));
  result.stats.reused_tokens = static_cast<int64_t>(common);
  result.starts_in_reasoning = prompt.starts_in_reasoning;
  return result;
}

namespace {
constexpr char kKvMagic[8] = {'P', 'E', 'T', 'R', 'E', 'L', 'K', 'V'};
constexpr uint32_t kKvVersion = 2;  // 2: the element type in the header, scales after each layer's kQ8 rows
constexpr size_t kKvHeaderFields = 6;

// A state file: magic, version, header {n_layers, kv_dim, context_length, n_past, tokens, KV type}, the tokens
// (int32), then for each layer its keys and then its values, each the rows of positions [0, n_past) (and for kQ8
// the rows' scales after them). The same on both backends: the cuda backend's f16 cache has the CPU f16 cache's
// row layout ([positions, n_kv_heads, head_dim]), so a state saved on one restores on the other.
struct KvShape {
  int64_t n_layers = 0, n_kv_heads = 0, kv_dim = 0, context_length = 0;
  KvType type = KvType::kF16;
  int64_t row_bytes(int64_t n) const { return n * kv_dim * cpu::kv_element_bytes(type); }
  int64_t scale_bytes(int64_t n) const { return type == KvType::kQ8 ? n * n_kv_heads * static_cast<int64_t>(sizeof(float)) : 0; }
};

KvShape cpu_shape(const KvCache& cache) {
  return {cache.n_layers, cache.n_kv_heads, cache.kv_dim, cache.context_length, cache.type};
}
KvShape gpu_shape(const LlamaConfig& c, int64_t context_length) {
  return {c.num_hidden_layers, c.num_key_value_heads, c.kv_dim(), context_length, KvType::kF16};
}

// A CPU cache's rows (and kQ8 scales) of positions [0, n) of layer l's keys or values.
struct LayerSpans {
  uint8_t* rows;
  float* scales;
};
LayerSpans layer_spans(KvCache& cache, int64_t l, bool values) {
  const cpu::KvLayer kv = cache.layer(l);
  return {static_cast<uint8_t*>(values ? kv.values : kv.keys), values ? kv.value_scales : kv.key_scales};
}
}  // namespace

Status Session::save(const fs::path& path) const {
  PETREL_RETURN_IF_ERROR(init_status_);
  PETREL_ASSIGN_OR_RETURN(const auto gpu_turn, take_gpu());
  CudaModel* gpu = on_cuda_ ? engine_->cuda_model() : nullptr;
  const KvShape shape = gpu ? gpu_shape(engine_->model().config(), forward_->context_length()) : cpu_shape(cache_);
  const int64_t n_past = gpu ? gpu->position() : cache_.n_past;
  if (static_cast<int64_t>(history_.size()) != n_past) {
    return internal_error(path.string() + ": the session's " + std::to_string(history_.size()) + " tokens and its " +
                          std::to_string(n_past) + " cached positions differ");
  }
  PETREL_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(path));
  const int64_t header[kKvHeaderFields] = {shape.n_layers, shape.kv_dim, shape.context_length, n_past,
                                           static_cast<int64_t>(history_.size()), static_cast<int64_t>(shape.type)};
  PETREL_RETURN_IF_ERROR(writer->write(kKvMagic, sizeof kKvMagic));
  PETREL_RETURN_IF_ERROR(writer->write(&kKvVersion, sizeof kKvVersion));
  PETREL_RETURN_IF_ERROR(writer->write(header, sizeof header));
  PETREL_RETURN_IF_ERROR(writer->write(history_.data(), history_.size() * sizeof(int32_t)));
  std::vector<uint16_t> staged(gpu ? static_cast<size_t>(n_past * shape.kv_dim) : 0);  // one layer's rows off the GPU
  KvCache& cache = const_cast<KvCache&>(cache_);  // layer views are non-const; nothing is modified
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    for (bool values : {false, true}) {
      if (gpu) {
        PETREL_RETURN_IF_ERROR(gpu->read_kv(l, values, n_past, staged));
        PETREL_RETURN_IF_ERROR(writer->write(staged.data(), shape.row_bytes(n_past)));
        continue;
      }
      const LayerSpans s = layer_spans(cache, l, values);
      PETREL_RETURN_IF_ERROR(writer->write(s.rows, shape.row_bytes(n_past)));
      if (s.scales) PETREL_RETURN_IF_ERROR(writer->write(s.scales, shape.scale_bytes(n_past)));
    }
  }
  return writer->commit();
}

Status Session::restore(const fs::path& path) {
  PETREL_RETURN_IF_ERROR(init_status_);
  PETREL_ASSIGN_OR_RETURN(const auto gpu_turn, take_gpu());
  CudaModel* gpu = on_cuda_ ? engine_->cuda_model() : nullptr;
  const KvShape shape = gpu ? gpu_shape(engine_->model().config(), forward_->context_length()) : cpu_shape(cache_);
  PETREL_ASSIGN_OR_RETURN(std::string bytes, read_text_file(path));
  const std::string where = path.string();
  const size_t header_size = sizeof kKvMagic + sizeof kKvVersion + kKvHeaderFields * sizeof(int64_t);
  if (bytes.size() < sizeof kKvMagic + sizeof kKvVersion || std::memcmp(bytes.data(), kKvMagic, sizeof kKvMagic) != 0) {
    return invalid_data(where + ": not a petrel KV state file");
  }
  uint32_t version;
  std::memcpy(&version, bytes.data() + 8, sizeof version);
  if (version != kKvVersion) return unsupported(where + ": KV state version " + std::to_string(version) + ", expected " + std::to_string(kKvVersion));
  if (bytes.size() < header_size) return invalid_data(where + ": truncated header");
  int64_t h[kKvHeaderFields];
  std::memcpy(h, bytes.data() + 12, sizeof h);
  if (h[0] != shape.n_layers || h[1] != shape.kv_dim) {
    return invalid_data(where + ": saved for " + std::to_string(h[0]) + " layers x " + std::to_string(h[1]) +
                        " KV width, this model has " + std::to_string(shape.n_layers) + " x " + std::to_string(shape.kv_dim));
  }
  if (h[5] != static_cast<int64_t>(shape.type)) {
    const bool known = h[5] >= 0 && h[5] <= static_cast<int64_t>(KvType::kQ8);
    return invalid_data(where + ": saved with a " +
                        (known ? std::string(cpu::kv_type_name(static_cast<KvType>(h[5]))) : "type " + std::to_string(h[5])) +
                        " KV cache, this session's is " + cpu::kv_type_name(shape.type) +
                        (gpu ? " (the cuda backend's)" : ""));
  }
  const int64_t n_past = h[3], n_history = h[4];
  if (n_past < 0 || n_past > shape.context_length || n_history != n_past) {
    return invalid_data(where + ": " + std::to_string(n_past) + " saved positions do not fit this session's context of " +
                        std::to_string(shape.context_length));
  }
  const int64_t layer_bytes = shape.row_bytes(n_past) + shape.scale_bytes(n_past);
  const size_t expected = header_size + n_history * sizeof(int32_t) + 2 * shape.n_layers * layer_bytes;
  if (bytes.size() != expected) {
    return invalid_data(where + ": " + std::to_string(bytes.size()) + " bytes, expected " + std::to_string(expected) + " (truncated?)");
  }
  // Everything is checked; from here on the cache is overwritten.
  const char* p = bytes.data() + header_size;
  std::vector<int32_t> tokens(reinterpret_cast<const int32_t*>(p), reinterpret_cast<const int32_t*>(p) + n_history);
  p += n_history * sizeof(int32_t);
  std::vector<uint16_t> rows(gpu ? static_cast<size_t>(n_past * shape.kv_dim) : 0);  // one layer's, aligned for the copy
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    for (bool values : {false, true}) {
      if (gpu) {
        std::memcpy(rows.data(), p, shape.row_bytes(n_past));
        if (Status s = gpu->write_kv(l, values, n_past, rows); !s.ok()) {
          reset();  // part of the cache is overwritten: the session starts empty rather than inconsistent
          return s.with_context(where);
        }
      } else {
        const LayerSpans s = layer_spans(cache_, l, values);
        std::memcpy(s.rows, p, shape.row_bytes(n_past));
        if (s.scales) std::memcpy(s.scales, p + shape.row_bytes(n_past), shape.scale_bytes(n_past));
      }
      p += layer_bytes;
    }
  }
  history_ = std::move(tokens);
  if (gpu) return gpu->set_position(n_past);
  cache_.n_past = n_past;
  return ok_status();
}

}  // namespace petrel
