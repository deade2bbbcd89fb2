#include "petrel/model/llama.h"

#include <algorithm>
#include <array>

#include "petrel/io/bundle.h"
#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/kernels/cpu/ops.h"
#include "petrel/model/rope.h"

namespace petrel {

namespace fs = std::filesystem;

namespace {

Result<ref::DenseMatrix> dense_from(const TensorSource& ckpt, const std::string& name,
                                    std::vector<int64_t> shape) {
  PETREL_ASSIGN_OR_RETURN(TensorView view, ckpt.tensor(name, shape));
  if (view.dtype != DType::kF32 && view.dtype != DType::kF16 && view.dtype != DType::kBF16) {
    return unsupported(ckpt.describe() + ": tensor '" + name + "' has dtype " +
                       std::string(dtype_name(view.dtype)) + "; the float model needs F32, F16 or BF16");
  }
  ref::DenseMatrix m;
  m.dtype = view.dtype;
  m.rows = shape.size() == 2 ? shape[0] : 1;
  m.cols = shape.back();
  m.data = view.data;
  return m;
}

Result<TensorView> typed_tensor(const TensorSource& ckpt, const std::string& name, DType dtype,
                                std::vector<int64_t> shape) {
  PETREL_ASSIGN_OR_RETURN(TensorView view, ckpt.tensor(name, shape));
  if (view.dtype != dtype) {
    return invalid_data(ckpt.describe() + ": tensor '" + name + "' has dtype " + std::string(dtype_name(view.dtype)) +
                        ", expected " + std::string(dtype_name(dtype)));
  }
  return view;
}

// A GPTQ linear: bits and group size follow from the tensor shapes and are checked against the config.
Result<LinearWeight> gptq_linear_from(const TensorSource& ckpt, const GptqConfig& q, const std::string& name,
                                      int64_t out_features, int64_t in_features) {
  const std::string where = ckpt.describe() + ": " + name;
  PETREL_ASSIGN_OR_RETURN(TensorView qweight, ckpt.tensor_padded_rows(name + ".qweight"));
  if (qweight.dtype != DType::kI32 || qweight.shape.size() != 2 || qweight.shape[1] != out_features ||
      (qweight.shape[0] * 32) % in_features != 0) {
    return invalid_data(where + ".qweight: I32 " + shape_to_string(qweight.shape) + " does not pack [" +
                        std::to_string(out_features) + ", " + std::to_string(in_features) + "] weights");
  }
  const int bits = static_cast<int>(qweight.shape[0] * 32 / in_features);
  if (bits != 4 && bits != 8) return unsupported(where + ": " + std::to_string(bits) + "-bit weights");
  // The head may differ without a `dynamic` entry (AutoGPTQ's lm_head); petrel's quantized embedding has one.
  if (bits != q.bits_for(name) && name != "lm_head") {
    return invalid_data(where + ": stored with " + std::to_string(bits) + " bits, config.json says " +
                        std::to_string(q.bits_for(name)));
  }
  PETREL_ASSIGN_OR_RETURN(TensorView scales, ckpt.tensor(name + ".scales"));
  if (scales.dtype != DType::kF16 || scales.shape.size() != 2 || scales.shape[1] != out_features ||
      scales.shape[0] <= 0 || in_features % scales.shape[0] != 0) {
    return invalid_data(where + ".scales: " + std::string(dtype_name(scales.dtype)) + " " + shape_to_string(scales.shape) +
                        ", expected F16 [groups, " + std::to_string(out_features) + "]");
  }
  const int64_t groups = scales.shape[0];
  PETREL_ASSIGN_OR_RETURN(TensorView qzeros, typed_tensor(ckpt, name + ".qzeros", DType::kI32,
                                                          {groups, out_features * bits / 32}));
  LinearWeight w;
  w.kind = LinearWeight::Kind::kGptq;
  w.gptq.bits = bits;
  w.gptq.rows = out_features;
  w.gptq.cols = in_features;
  w.gptq.group_size = in_features / groups;
  w.gptq.zero_offset = q.zero_offset;
  w.gptq.qweight = static_cast<const int32_t*>(qweight.data);
  w.gptq.word_row_stride = qweight.row_stride;  // 0 (dense) but in a CPU bundle
  w.gptq.scales = static_cast<const uint16_t*>(scales.data);
  w.gptq.qzeros = static_cast<const int32_t*>(qzeros.data);
  if (ckpt.has(name + ".g_idx")) {
    PETREL_ASSIGN_OR_RETURN(TensorView g_idx, typed_tensor(ckpt, name + ".g_idx", DType::kI32, {in_features}));
    const int32_t* g = static_cast<const int32_t*>(g_idx.data);
    bool trivial = true;
    for (int64_t c = 0; c < in_features; ++c) {
      if (g[c] < 0 || g[c] >= groups) {
        return invalid_data(where + ".g_idx[" + std::to_string(c) + "] = " + std::to_string(g[c]) +
                            " is not a group in [0, " + std::to_string(groups) + ")");
      }
      trivial = trivial && g[c] == c / w.gptq.group_size;
    }
    if (!trivial) w.gptq.g_idx = g;  // act-order checkpoints
  }
  return w;
}

Result<LinearWeight> linear_from(const TensorSource& ckpt, const LlamaConfig& config, const std::string& name,
                                 int64_t out_features, int64_t in_features) {
  if (config.quantization && ckpt.has(name + ".qweight")) {
    return gptq_linear_from(ckpt, *config.quantization, name, out_features, in_features);
  }
  PETREL_ASSIGN_OR_RETURN(ref::DenseMatrix dense, dense_from(ckpt, name + ".weight", {out_features, in_features}));
  LinearWeight w;
  w.dense = dense;
  return w;
}

void linear(const float* x, int64_t n_rows, const LinearWeight& w, float* y) { linear_forward(x, n_rows, w, y); }

// The embedding table: GPTQ tensors `model.embed_tokens.{qweight,scales,qzeros,g_idx}` when the checkpoint
// quantized it (petrel's extension, docs/QUANTIZATION.md), else the float `model.embed_tokens.weight`.
Result<LinearWeight> embedding_from(const TensorSource& ckpt, const LlamaConfig& c) {
  if (ckpt.has("model.embed_tokens.qweight")) {
    if (!c.quantization) {
      return invalid_data(ckpt.describe() + ": model.embed_tokens is quantized but config.json has no quantization_config");
    }
    return gptq_linear_from(ckpt, *c.quantization, "model.embed_tokens", c.vocab_size, c.hidden_size);
  }
  PETREL_ASSIGN_OR_RETURN(ref::DenseMatrix dense, dense_from(ckpt, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  LinearWeight w;
  w.dense = dense;
  return w;
}

// Several linears of the same input (q/k/v, gate/up): one call of the SIMD kernels when they are all GPTQ, so
// that the activations are packed once and the token generator's GEMVs share one thread-pool dispatch.
template <size_t N>
void linears(const float* x, int64_t n_rows, const std::array<const LinearWeight*, N>& ws, const std::array<float*, N>& ys) {
  std::array<const ref::GptqMatrix*, N> matrices;
  bool simd = true;
  for (size_t i = 0; i < N; ++i) {
    simd = simd && ws[i]->kind == LinearWeight::Kind::kGptq && cpu::gptq_matmul_supports(ws[i]->gptq);
    matrices[i] = &ws[i]->gptq;
  }
  if (simd) {
    cpu::gptq_matmul_shared_input(x, n_rows, matrices, ys);
    return;
  }
  for (size_t i = 0; i < N; ++i) linear(x, n_rows, *ws[i], ys[i]);
}

}  // namespace

void linear_forward(const float* x, int64_t n_rows, const LinearWeight& w, float* y) {
  if (w.kind == LinearWeight::Kind::kGptq) {
    // The SIMD kernels read the GPTQ words in place: GEMV for one row, GEMM for a chunk.
    if (cpu::gptq_matmul_supports(w.gptq)) {
      cpu::gptq_matmul(x, n_rows, w.gptq, y);
      return;
    }
    ref::matmul(x, n_rows, w.gptq, y);
  } else {
    ref::matmul(x, n_rows, w.dense, y);
  }
}

void embedding_lookup(const LinearWeight& table, std::span<const int32_t> tokens, float* out) {
  if (table.kind == LinearWeight::Kind::kGptq) {
    ref::embedding_lookup(table.gptq, tokens, out);
  } else {
    ref::embedding_lookup(table.dense, tokens, out);
  }
}

int64_t embedding_row_bytes(const LinearWeight& table) {
  if (table.kind == LinearWeight::Kind::kDense) return table.dense.cols * static_cast<int64_t>(dtype_size(table.dense.dtype));
  const ref::GptqMatrix& g = table.gptq;  // codes, plus a scale and a zero point per group
  return g.cols * g.bits / 8 + g.n_groups() * (16 + g.bits) / 8;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const fs::path& path, const ModelLoadOptions& options) {
  if (is_bundle_path(path)) {
    PETREL_ASSIGN_OR_RETURN(Bundle bundle, Bundle::open(path));
    PETREL_ASSIGN_OR_RETURN(LlamaConfig config, load_llama_config_file(bundle.config().bundle_dir / kBundleModelConfig));
    return from_source(std::move(config), make_tensor_source(std::make_unique<Bundle>(std::move(bundle))), options);
  }
  PETREL_ASSIGN_OR_RETURN(LlamaConfig config, load_llama_config(path));
  PETREL_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(path));
  return from_source(std::move(config), make_tensor_source(std::move(ckpt)), options);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_source(LlamaConfig config, std::unique_ptr<TensorSource> source,
                                                            const ModelLoadOptions& options) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->config_ = std::move(config);
  model->source_ = std::move(source);
  PETREL_RETURN_IF_ERROR(model->bind_weights());
  model->inv_freq_ = rope_inverse_frequencies(model->config_.rope, model->config_.head_dim);
  if (options.dequantize_weights) model->dequantize_weights();
  return model;
}

void LlamaModel::dequantize_weights() {
  auto convert = [&](LinearWeight& w) {
    if (w.kind != LinearWeight::Kind::kGptq) return;
    std::vector<float> values(w.gptq.rows * w.gptq.cols);
    for (int64_t r = 0; r < w.gptq.rows; ++r) w.gptq.row_to_f32(r, values.data() + r * w.gptq.cols);
    w.dense = ref::DenseMatrix{DType::kF32, w.gptq.rows, w.gptq.cols, values.data()};
    w.kind = LinearWeight::Kind::kDense;
    owned_.push_back(std::move(values));
  };
  for (LlamaLayerWeights& l : weights_.layers) {
    for (LinearWeight* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) convert(*w);
  }
  convert(weights_.lm_head);
}

Status LlamaModel::bind_weights() {
  const LlamaConfig& c = config_;
  const TensorSource& ck = *source_;
  const int64_t h = c.hidden_size;
  PETREL_ASSIGN_OR_RETURN(weights_.embed_tokens, embedding_from(ck, c));
  weights_.layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LlamaLayerWeights& w = weights_.layers[l];
    PETREL_ASSIGN_OR_RETURN(w.input_norm, dense_from(ck, p + "input_layernorm.weight", {h}));
    PETREL_ASSIGN_OR_RETURN(w.q_proj, linear_from(ck, c, p + "self_attn.q_proj", c.q_dim(), h));
    PETREL_ASSIGN_OR_RETURN(w.k_proj, linear_from(ck, c, p + "self_attn.k_proj", c.kv_dim(), h));
    PETREL_ASSIGN_OR_RETURN(w.v_proj, linear_from(ck, c, p + "self_attn.v_proj", c.kv_dim(), h));
    PETREL_ASSIGN_OR_RETURN(w.o_proj, linear_from(ck, c, p + "self_attn.o_proj", h, c.q_dim()));
    PETREL_ASSIGN_OR_RETURN(w.post_attn_norm, dense_from(ck, p + "post_attention_layernorm.weight", {h}));
    PETREL_ASSIGN_OR_RETURN(w.gate_proj, linear_from(ck, c, p + "mlp.gate_proj", c.intermediate_size, h));
    PETREL_ASSIGN_OR_RETURN(w.up_proj, linear_from(ck, c, p + "mlp.up_proj", c.intermediate_size, h));
    PETREL_ASSIGN_OR_RETURN(w.down_proj, linear_from(ck, c, p + "mlp.down_proj", h, c.intermediate_size));
  }
  PETREL_ASSIGN_OR_RETURN(weights_.final_norm, dense_from(ck, "model.norm.weight", {h}));
  if (c.tie_word_embeddings) {
    if (weights_.embed_tokens.kind != LinearWeight::Kind::kDense) {
      return invalid_data(ck.describe() + ": tie_word_embeddings is true but the embedding is quantized (a "
                          "quantized tied model is written untied, with its own lm_head)");
    }
    weights_.lm_head = weights_.embed_tokens;  // transformers ties lm_head to the embedding
  } else {
    PETREL_ASSIGN_OR_RETURN(weights_.lm_head, linear_from(ck, c, "lm_head", c.vocab_size, h));
  }
  return ok_status();
}

Result<KvCache> LlamaModel::new_cache(int64_t context_length, KvType type) const {
  if (context_length <= 0 || context_length > config_.max_position_embeddings) {
    return invalid_argument("context length " + std::to_string(context_length) + " must be in [1, " +
                            std::to_string(config_.max_position_embeddings) + "] (max_position_embeddings)");
  }
  return KvCache(context_length, config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim, type);
}

// One forward pass over n tokens, in the order of transformers' LlamaDecoderLayer.forward.
Status LlamaModel::forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode,
                           std::vector<float>* logits) const {
  const LlamaConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return invalid_argument("forward: no tokens");
  if (cache.n_layers != c.num_hidden_layers || cache.n_kv_heads != c.num_key_value_heads || cache.head_dim != c.head_dim) {
    return invalid_argument("forward: the KV cache was made for another model shape");
  }
  if (n > cache.remaining()) {
    return out_of_range("Context Size was exceeded: " + std::to_string(cache.n_past) + " positions used + " +
                        std::to_string(n) + " new tokens > context length " + std::to_string(cache.context_length));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return invalid_argument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
  }
  const int64_t h = c.hidden_size, first_pos = cache.n_past, half = c.head_dim / 2;
  auto observe = [&](const std::string& name, const float* data, int64_t cols) {
    if (observer_) observer_(name, data, n, cols);
  };

  std::vector<float> x(n * h);          // the residual stream [n, hidden]
  std::vector<float> normed(n * h);     // [n, hidden]
  std::vector<float> q(n * c.q_dim());  // [n, n_heads * head_dim]
  std::vector<float> k(n * c.kv_dim()), v(n * c.kv_dim());  // this chunk's keys and values, before the cache
  std::vector<float> attn(n * c.q_dim());
  std::vector<float> proj(n * h);
  std::vector<float> gate(n * c.intermediate_size), up(n * c.intermediate_size);
  std::vector<float> cos(n * half), sin(n * half);
  rope_cos_sin(inv_freq_, first_pos, n, cos.data(), sin.data());

  embedding_lookup(weights_.embed_tokens, tokens, x.data());
  observe("embed", x.data(), h);
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[l];
    const std::string name = "layer" + std::to_string(l);
    // Self-attention block: x = x + o_proj(attention(rope(q), rope(k), v)).
    cpu::rms_norm(x.data(), n, h, w.input_norm, eps, normed.data());
    linears<3>(normed.data(), n, {&w.q_proj, &w.k_proj, &w.v_proj}, {q.data(), k.data(), v.data()});
    cpu::apply_rope(q.data(), n, c.num_attention_heads, c.head_dim, cos.data(), sin.data());
    cpu::apply_rope(k.data(), n, c.num_key_value_heads, c.head_dim, cos.data(), sin.data());
    const cpu::KvLayer kv = cache.layer(l);
    cpu::kv_store(kv, first_pos, n, k.data(), v.data());
    cpu::attention(q.data(), kv, n, first_pos, c.num_attention_heads, attn.data());
    linear(attn.data(), n, w.o_proj, proj.data());
    observe(name + ".attn_out", proj.data(), h);
    cpu::add_in_place(x.data(), proj.data(), n * h);
    // Feed-forward block: x = x + down_proj(silu(gate_proj(x)) * up_proj(x)).
    cpu::rms_norm(x.data(), n, h, w.post_attn_norm, eps, normed.data());
    linears<2>(normed.data(), n, {&w.gate_proj, &w.up_proj}, {gate.data(), up.data()});
    cpu::silu_mul(gate.data(), up.data(), n * c.intermediate_size, gate.data());
    linear(gate.data(), n, w.down_proj, proj.data());
    observe(name + ".mlp_out", proj.data(), h);
    cpu::add_in_place(x.data(), proj.data(), n * h);
    observe(name + ".out", x.data(), h);
  }
  cache.n_past += n;

  if (mode == LogitsMode::kNone) return ok_status();
  const int64_t first_row = mode == LogitsMode::kLast ? n - 1 : 0;
  const int64_t rows = n - first_row;
  cpu::rms_norm(x.data() + first_row * h, rows, h, weights_.final_norm, eps, normed.data());
  logits->resize(rows * c.vocab_size);
  linear(normed.data(), rows, weights_.lm_head, logits->data());
  return ok_status();
}

Status LlamaModel::process_prompt(std::span<const int32_t> tokens, KvCache& cache, int64_t chunk_size,
                                  LogitsMode mode, std::vector<float>* logits) const {
  if (chunk_size <= 0) return invalid_argument("prompt chunk size must be positive");
  if (static_cast<int64_t>(tokens.size()) > cache.remaining()) {
    return out_of_range("Context Size was exceeded: the prompt has " + std::to_string(tokens.size()) +
                        " tokens, " + std::to_string(cache.remaining()) + " of " +
                        std::to_string(cache.context_length) + " positions are free");
  }
  if (logits) logits->clear();
  std::vector<float> chunk_logits;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0; begin < n; begin += chunk_size) {
    const int64_t count = std::min(chunk_size, n - begin);
    const bool last_chunk = begin + count == n;
    LogitsMode chunk_mode = mode == LogitsMode::kAll ? LogitsMode::kAll
                            : (mode == LogitsMode::kLast && last_chunk) ? LogitsMode::kLast
                                                                        : LogitsMode::kNone;
    PETREL_RETURN_IF_ERROR(forward(tokens.subspan(begin, count), cache, chunk_mode, &chunk_logits));
    if (chunk_mode != LogitsMode::kNone) logits->insert(logits->end(), chunk_logits.begin(), chunk_logits.end());
  }
  return ok_status();
}

}  // namespace petrel
