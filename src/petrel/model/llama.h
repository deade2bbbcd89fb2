// The Llama-family decoder (Llama 3.x, Nemotron Nano 8B), reference numerics: weights read in their stored
// dtype and widened to float32, float32 activations and accumulation. Matches transformers'
// modeling_llama.py (LlamaForCausalLM) run in float32.
//
// Two deployment shapes run through one forward():
//   - prompt processor: N tokens at once, in chunks of `chunk_size` (default 128, Qualcomm's AR-128);
//   - token generator: one token at a time (AR-1).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors.h"
#include "petrel/io/tensor_source.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/model/kv_cache.h"
#include "petrel/util/status.h"

namespace petrel {

// A linear layer's weight, y = x W^T: a dense float matrix, or GPTQ-quantized codes dequantized on the fly.
struct LinearWeight {
  enum class Kind { kDense, kGptq };
  Kind kind = Kind::kDense;
  ref::DenseMatrix dense;  // [out_features, in_features] when kDense
  ref::GptqMatrix gptq;    // when kGptq

  int64_t out_features() const { return kind == Kind::kDense ? dense.rows : gptq.rows; }
  int64_t in_features() const { return kind == Kind::kDense ? dense.cols : gptq.cols; }
};

// y[n_rows, out] = x[n_rows, in] W^T with the reference kernels.
void linear_forward(const float* x, int64_t n_rows, const LinearWeight& w, float* y);

// out[i, :] = row tokens[i] of an embedding table, dense or quantized (rows = vocabulary), widened to float32.
// Token ids must be in [0, table.out_features()).
void embedding_lookup(const LinearWeight& table, std::span<const int32_t> tokens, float* out);
// The bytes of one table row as stored (what a token's lookup reads).
int64_t embedding_row_bytes(const LinearWeight& table);

struct LlamaLayerWeights {
  ref::DenseMatrix input_norm;      // [1, hidden]
  LinearWeight q_proj;              // [n_heads * head_dim, hidden]
  LinearWeight k_proj;              // [n_kv_heads * head_dim, hidden]
  LinearWeight v_proj;              // [n_kv_heads * head_dim, hidden]
  LinearWeight o_proj;              // [hidden, n_heads * head_dim]
  ref::DenseMatrix post_attn_norm;  // [1, hidden]
  LinearWeight gate_proj;           // [intermediate, hidden]
  LinearWeight up_proj;             // [intermediate, hidden]
  LinearWeight down_proj;           // [hidden, intermediate]
};

struct LlamaWeights {
  LinearWeight embed_tokens;  // [vocab, hidden]: dense, or GPTQ (petrel quantize --embedding-bits)
  std::vector<LlamaLayerWeights> layers;
  ref::DenseMatrix final_norm;  // [1, hidden]
  LinearWeight lm_head;         // [vocab, hidden]; the (dense) embedding table when tied

  // True when the LM head is the embedding table itself (tie_word_embeddings, head not quantized).
  bool head_is_embedding() const {
    return lm_head.kind == LinearWeight::Kind::kDense && embed_tokens.kind == LinearWeight::Kind::kDense &&
           lm_head.dense.data == embed_tokens.dense.data;
  }
};

enum class LogitsMode {
  kNone,  // fill the cache only
  kLast,  // logits of the last token: [1, vocab]
  kAll,   // logits of every token: [n_tokens, vocab]
};

// The largest logits of one token, as a backend that can choose them itself returns them (CudaModel: k pairs
// reach the host instead of the vocabulary): values descending, ids ascending among equal values. When it
// could not choose (a NaN among the logits, say), `all` holds every logit instead and values/ids are empty.
struct TopLogits {
  std::vector<float> values;
  std::vector<int32_t> ids;
  std::vector<float> all;
};

// Called with named intermediate tensors ("layer3.attn_out", shape [n, dim]) when set; for comparing
// against Hugging Face hidden states while debugging.
using TensorObserver = std::function<void(const std::string& name, const float* data, int64_t rows, int64_t cols)>;

struct ModelLoadOptions {
  // Dequantize GPTQ weights to float32 once at load instead of on every matmul. The values are identical
  // (the reference kernel dequantizes the same way); memory grows to 4 bytes per weight, so this is for
  // small models, e.g. validate on tiny checkpoints.
  bool dequantize_weights = false;
};

class LlamaModel {
 public:
  // Loads a Hugging Face checkpoint directory (config.json + safetensors, float or GPTQ) or an exported bundle
  // (BUNDLE or BUNDLE/config.json); every tensor is checked for presence, shape and dtype.
  static Result<std::unique_ptr<LlamaModel>> load(const std::filesystem::path& path, const ModelLoadOptions& options = {});
  // Binds an already opened tensor source with its typed config.
  static Result<std::unique_ptr<LlamaModel>> from_source(LlamaConfig config, std::unique_ptr<TensorSource> source,
                                                         const ModelLoadOptions& options = {});

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  bool is_quantized() const { return config_.quantization.has_value(); }
  const TensorSource& tensors() const { return *source_; }

  // A cache for `context_length` positions (at most max_position_embeddings). kF32 keeps the reference
  // numerics (parity tests); kF16 is the runtime's default; kQ8 quarters the memory of kF32.
  Result<KvCache> new_cache(int64_t context_length, KvType type = KvType::kF16) const;

  // Runs `tokens` at positions cache.n_past ... through the model as one batch and appends them to the
  // cache. Fails with kOutOfRange, changing nothing, when they do not fit in the context.
  Status forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode, std::vector<float>* logits) const;

  // The prompt processor: forward() over consecutive chunks of at most `chunk_size` tokens.
  // With kAll the logits of every token are concatenated; with kLast only the final token's are kept.
  Status process_prompt(std::span<const int32_t> tokens, KvCache& cache, int64_t chunk_size, LogitsMode mode,
                        std::vector<float>* logits) const;

  void set_observer(TensorObserver observer) { observer_ = std::move(observer); }

 private:
  LlamaModel() = default;
  Status bind_weights();
  void dequantize_weights();

  LlamaConfig config_;
  std::unique_ptr<TensorSource> source_;
  LlamaWeights weights_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  TensorObserver observer_;
  std::vector<std::vector<float>> owned_;  // dequantized copies, when asked for
};

}  // namespace petrel
