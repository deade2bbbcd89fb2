// The GPU token generator (cuda_model.h): weight upload, device buffers, and the decode step as a sequence
// of kernels/cuda launches on one stream, captured in a CUDA graph. Plain C++ over kernels/cuda's API; in a
// build without CUDA those calls answer "not built" and create() says so first.
#include "petrel/model/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemm.h"
#include "petrel/kernels/cuda/gemv_dense.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/gemv_tma.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/cuda/resident_gemv.h"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/kernels/cuda/stream.h"
#include "petrel/kernels/cuda/top_k.h"
#include "petrel/kernels/cuda/uploader.h"
#include "petrel/model/rope.h"
#include "petrel/util/parallel.h"

namespace petrel {

namespace {

// A linear layer on the device: GPTQ codes read by gemv_gptq, or a dense matrix read by gemv_dense.
struct DeviceLinear {
  bool gptq = false;
  cuda::DeviceGptqWeights quantized;
  cuda::DeviceBuffer dense_storage;  // empty when the matrix is shared (a tied LM head)
  cuda::DeviceDenseMatrix dense;
  // CudaModelOptions::prefill_f16_weights: W dequantized to fp16 [rows, cols] for long prompt chunks.
  cuda::DeviceBuffer f16_storage;
  cuda::DeviceDenseMatrix f16;

  int64_t bytes() const {
    return (gptq ? quantized.view().weight_bytes() : static_cast<int64_t>(dense_storage.size())) +
           static_cast<int64_t>(f16_storage.size());
  }
};

struct DeviceNorm {
  cuda::DeviceBuffer storage;
  cuda::DeviceVector weight;
};

struct DeviceLayer {
  DeviceNorm input_norm, post_attn_norm;
  DeviceLinear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

// Weights go through one HostUploader (pinned staging, several host threads): create() calls finish() before
// the first kernel reads them.
Result<cuda::DeviceBuffer> upload_bytes(const void* host, size_t bytes, const std::string& what, cuda::HostUploader& up) {
  auto buffer = cuda::DeviceBuffer::allocate(bytes);
  if (!buffer.ok()) return Status(buffer.status().code(), what + ": " + buffer.status().message());
  Status uploaded = up.copy(buffer->data(), host, bytes);
  if (!uploaded.ok()) return Status(uploaded.code(), what + ": " + uploaded.message());
  return std::move(buffer).value();
}

Result<DeviceNorm> upload_norm(const ref::DenseMatrix& host, const std::string& name, cuda::HostUploader& up) {
  DeviceNorm norm;
  const size_t bytes = static_cast<size_t>(host.rows * host.cols) * dtype_size(host.dtype);
  PETREL_ASSIGN_OR_RETURN(norm.storage, upload_bytes(host.data, bytes, name, up));
  norm.weight = cuda::DeviceVector{host.dtype, host.rows * host.cols, norm.storage.data()};
  return norm;
}

Result<DeviceLinear> upload_linear(const LinearWeight& host, const std::string& name, cuda::HostUploader& up) {
  DeviceLinear linear;
  if (host.kind == LinearWeight::Kind::kGptq) {
    auto uploaded = cuda::DeviceGptqWeights::upload(host.gptq, &up);
    if (!uploaded.ok()) return Status(uploaded.status().code(), name + ": " + uploaded.status().message());
    linear.gptq = true;
    linear.quantized = std::move(uploaded).value();
    return linear;
  }
  const ref::DenseMatrix& m = host.dense;
  const size_t bytes = static_cast<size_t>(m.rows * m.cols) * dtype_size(m.dtype);
  PETREL_ASSIGN_OR_RETURN(linear.dense_storage, upload_bytes(m.data, bytes, name, up));
  linear.dense = cuda::DeviceDenseMatrix{m.dtype, m.rows, m.cols, linear.dense_storage.data()};
  return linear;
}

// The embedding table on the device as stored: a float table read by cuda::embedding_lookup, or GPTQ codes
// (petrel quantize --embedding-bits) read by cuda::embedding_lookup_gptq, which dequantizes the rows it looks up
// to the CPU's float32 values, so a quantized table costs its stored size (Llama-3.1-8B at 8 bits: 0.5 GB, not
// 2.1 GB of float32). A tied LM head reads the same device copy.
struct DeviceEmbedding {
  DeviceLinear table;
  Status lookup(const int32_t* tokens, int64_t n_tokens, float* out, cuda::Stream s) const {
    return table.gptq ? cuda::embedding_lookup_gptq(table.quantized.view(), tokens, n_tokens, out, s)
                      : cuda::embedding_lookup(table.dense, tokens, n_tokens, out, s);
  }
};

Status with_context(Status status, const std::string& what) {
  if (status.ok()) return status;
  return Status(status.code(), what + ": " + status.message());
}

int64_t host_linear_bytes(const LinearWeight& w) {
  if (w.kind == LinearWeight::Kind::kGptq) {
    const ref::GptqMatrix& g = w.gptq;
    return g.rows * g.cols * g.bits / 8 + g.n_groups() * g.rows * 2 + g.n_groups() * g.rows * g.bits / 8;
  }
  return w.dense.rows * w.dense.cols * static_cast<int64_t>(dtype_size(w.dense.dtype));
}

int64_t host_matrix_bytes(const ref::DenseMatrix& m) { return m.rows * m.cols * static_cast<int64_t>(dtype_size(m.dtype)); }

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

// CudaModelOptions::warm_copies: `count` device-to-device copies between two 1 MiB buffers, freed after, on the
// stream `where` says (CudaModelOptions::warm_copies_stream; a kept one is left in *kept). Best effort: where the
// buffers cannot be had with 256 MiB to spare (a full GPU) nothing is copied and create() goes on. The count is
// what matters, not the bytes (session 49: 21 copies of 1 MiB as good as 21 of 64 MiB).
Status warm_copies(int count, int where, cuda::Stream model_stream, cuda::CudaStream* kept) {
  if (count <= 0) return ok_status();
  constexpr size_t kBytes = size_t{1} << 20;
  PETREL_ASSIGN_OR_RETURN(const cuda::MemoryInfo memory, cuda::memory_info());
  if (memory.free_bytes < static_cast<int64_t>(2 * kBytes + (size_t{256} << 20))) return ok_status();
  auto a = cuda::DeviceBuffer::allocate(kBytes);
  auto b = cuda::DeviceBuffer::allocate(kBytes);
  if (!a.ok() || !b.ok()) return ok_status();
  cuda::CudaStream own;
  cuda::Stream stream = model_stream;
  if (where == CudaModelOptions::kWarmLegacyStream) {
    stream = nullptr;
  } else if (where != CudaModelOptions::kWarmModelStream) {
    PETREL_ASSIGN_OR_RETURN(own, cuda::CudaStream::create());
    stream = own.get();
  }
  // What the bytes are does not matter (the bench's --warm copies unset buffers too).
  for (int i = 0; i < count; ++i) PETREL_RETURN_IF_ERROR(cuda::copy_on_device(b->data(), a->data(), kBytes, stream));
  PETREL_RETURN_IF_ERROR(cuda::synchronize());
  if (where == CudaModelOptions::kWarmKeptStream) *kept = std::move(own);
  return ok_status();
}

}  // namespace

// Bytes of prefill attention workspace for chunks of `chunk` tokens: enough for a whole chunk over the whole
// context, capped at kMaxPrefillAttentionBytes (late chunks of a long context are then cut shorter).
constexpr int64_t kMaxPrefillAttentionBytes = int64_t{1} << 30;
int64_t prefill_attention_bytes(const LlamaConfig& c, int64_t chunk, int64_t context_length) {
  const cuda::PrefillAttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  return std::min(cuda::prefill_attention_workspace_bytes(shape, chunk, context_length), kMaxPrefillAttentionBytes);
}

// Activations of `chunk` prompt tokens (float32): x, normed, proj [hidden]; q, attn [q_dim]; k, v [kv_dim];
// gate, up [intermediate]; plus the token ids.
int64_t prefill_activation_bytes(const LlamaConfig& c, int64_t chunk) {
  return chunk * (4 * (3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size) + 4);
}

constexpr int64_t kGemmScratchBytes = int64_t{256} << 20;  // GemmWorkspace's scratch (gemm.h), plus 32 MiB cuBLAS
constexpr int64_t kGemmWorkspaceBytes = kGemmScratchBytes + (int64_t{32} << 20);
// The prompt processor's batch GEMV partial sums (gemv_gptq_batch): gate/up of Llama-3.1-8B at 32 tokens
// takes 28672 x 32 floats per split, so 4M floats (16 MiB) leave it 4 splits.
constexpr int64_t kPrefillGemvPartials = int64_t{4} << 20;

Result<PrefillF16Weights> parse_prefill_f16_weights(const std::string& text) {
  if (text == "auto") return PrefillF16Weights::kAuto;
  if (text == "off") return PrefillF16Weights::kOff;
  if (text == "on") return PrefillF16Weights::kOn;
  return invalid_argument("prefill fp16 weights must be auto, on or off, not '" + text + "'");
}

GpuMemoryNeed gpu_memory_need(const LlamaModel& model, int64_t context_length, int64_t prefill_chunk,
                              bool prefill_f16_weights) {
  const LlamaConfig& c = model.config();
  const LlamaWeights& w = model.weights();
  GpuMemoryNeed need;
  need.context_length = std::min(context_length, c.max_position_embeddings);
  need.weight_bytes = host_linear_bytes(w.embed_tokens) + host_matrix_bytes(w.final_norm);
  for (const LlamaLayerWeights& l : w.layers) {
    need.weight_bytes += host_matrix_bytes(l.input_norm) + host_matrix_bytes(l.post_attn_norm);
    for (const LinearWeight* lin : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      need.weight_bytes += host_linear_bytes(*lin);
      if (prefill_f16_weights && prefill_chunk > 1 && lin->kind == LinearWeight::Kind::kGptq) {
        need.weight_bytes += 2 * lin->gptq.rows * lin->gptq.cols;
      }
    }
  }
  if (!w.head_is_embedding()) need.weight_bytes += host_linear_bytes(w.lm_head);
  need.kv_cache_bytes = 2 * c.num_hidden_layers * need.context_length * c.kv_dim() * 2;
  // Activations of one token, the attention workspace (bounded by heads x splits x head_dim), and 64 MiB of
  // headroom for the GEMV workspaces, the graph and the allocator's rounding.
  need.scratch_bytes = 4 * (4 * c.hidden_size + 3 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size + 2 * c.vocab_size) +
                       4 * c.num_attention_heads * (need.context_length / 16 + 1) * (c.head_dim + 2) + (int64_t{64} << 20);
  if (prefill_chunk > 1) {
    const int64_t chunk = std::min(prefill_chunk, need.context_length);
    // The [chunk, vocab] logits of a kAll prompt are allocated at the first one (validation, perplexity), but
    // counted here so that the check up front covers them.
    need.scratch_bytes += prefill_activation_bytes(c, chunk) + prefill_attention_bytes(c, chunk, need.context_length) +
                          kGemmWorkspaceBytes + 4 * kPrefillGemvPartials + chunk * c.vocab_size * 4;
  }
  return need;
}

Status check_gpu_memory(const GpuMemoryNeed& need, int64_t free_bytes, int64_t total_bytes, const std::string& device) {
  if (need.total() <= free_bytes) return ok_status();
  return unsupported("not enough GPU memory on " + device + ": the model needs " + gib(need.total()) + " (" +
                     std::to_string(need.total()) + " bytes: weights " + gib(need.weight_bytes) + " + fp16 KV cache " +
                     gib(need.kv_cache_bytes) + " for " + std::to_string(need.context_length) + " positions + scratch " +
                     gib(need.scratch_bytes) + "), " + gib(free_bytes) + " (" + std::to_string(free_bytes) +
                     " bytes) is free of " + gib(total_bytes) + "; use a shorter context or a smaller model");
}

// What a decode step leaves behind: the final hidden state in `normed` (no LM head), the logits in host
// memory (host_logits), or the top-k of the logits (top_host; `logits` on the device too).
enum class CudaModel::StepOutput { kNormed, kLogits, kTop };

constexpr size_t kTopResultBytes = (sizeof(cuda::TopKResult) + 255) / 256 * 256;

struct CudaModel::State {
  LlamaConfig config;
  CudaModelOptions options;
  int64_t position = 0;

  cuda::CudaStream stream;
  cuda::CudaStream warm_stream;  // CudaModelOptions::kWarmKeptStream's, unused after create()
  cuda::GemvWorkspace gemv_workspace;
  // Independent projections run side by side: k and v beside q, up beside gate (each GEMV of a small
  // matrix is mostly fixed latency; see kernels/cuda/gemv_gptq.cu). Each side stream has its own workspace.
  cuda::CudaStream side_streams[2];
  cuda::GemvWorkspace side_workspaces[2];
  cuda::CudaEvent fork_event, join_events[2];
  cuda::CudaEvent step_start, step_end;  // options.time_steps
  double step_device_ms = 0;
  // The decode step as graphs, each captured at its first use (create()'s warm-up makes all three): without the
  // LM head (StepOutput::kNormed), with the LM head and the logits to the host (kLogits), with the LM head and
  // its top_graph_k() largest logits (kTop; decode_top's k is a prefix of them, so one graph serves every k and
  // no sampler setting captures a graph in the middle of a generation).
  cuda::CudaGraph step_graph, logits_graph, top_graph;

  DeviceEmbedding embed;
  std::vector<DeviceLayer> layers;
  DeviceNorm final_norm;
  DeviceLinear lm_head;
  cuda::DeviceBuffer inv_freq;  // [head_dim / 2]

  // KV cache, [n_layers, context_length, n_kv_heads, head_dim] fp16 each.
  cuda::DeviceBuffer keys, values;
  // Activations of one token (each its own allocation: the GEMVs want 16-byte aligned vectors).
  cuda::DeviceBuffer step_input;  // int32 {token, position}, copied from host_input by every step
  cuda::PinnedBuffer host_input;
  cuda::DeviceBuffer x, normed, q, k, v, attn, proj, gate, up, logits, attention_workspace;
  cuda::PinnedBuffer host_logits;
  bool logits_mapped = false;  // options.logits_to_mapped_host where host_logits maps into the device
  // decode_top / forward_top: cuda::top_k_logits' answer on the device and its pinned copy on the host.
  cuda::DeviceBuffer top_device;  // the answer, then (at kTopResultBytes) top_k_logits' workspace
  cuda::PinnedBuffer top_host;
  // decode_top_masked: the constraint's mask, one bit a token, written on the host and copied by masked_head_graph.
  cuda::PinnedBuffer allowed_host;
  cuda::DeviceBuffer allowed_device;
  cuda::CudaGraph masked_head_graph;
  // The fused decode step (options.fused_step on a checkpoint whose decoder linears are all GPTQ):
  // uint32 [n_kv_heads] split arrival counters of decode_attention_rope, zero between steps.
  bool fused = false;
  bool overlap = false;  // options.overlap_kernels on a GPU that has programmatic dependent launch
  cuda::DeviceBuffer attention_counters;
  // The resident step (options.resident_step, where cuda::ResidentGemvChains takes the checkpoint): chain 0 is
  // layer 0's q/k/v, chain l (1 .. L - 1) layer l - 1's o, gate/up and down and layer l's q/k/v, chain L the
  // last layer's o, gate/up and down.
  cuda::ResidentGemvChains resident;

  // The prompt processor (options.prefill_chunk > 1): activations of up to `chunk` tokens, row-major.
  struct Prefill {
    int64_t chunk = 0;
    cuda::GemmWorkspace gemm;
    cuda::GemvWorkspace gemv;  // the batch GEMV's (chunks of up to cuda::kMaxGemvTokens tokens)
    bool batch = false;        // options.batch_prefill on a checkpoint the batch GEMV reads (batch_prefill_applies)
    cuda::DeviceBuffer tokens;  // int32 [chunk]
    cuda::DeviceBuffer x, normed, q, k, v, attn, proj, gate, up;
    cuda::DeviceBuffer attention_workspace;
    cuda::DeviceBuffer logits;  // [chunk, vocab], allocated at the first kAll prompt
    int64_t bytes() const {
      int64_t b = 0;
      for (const cuda::DeviceBuffer* d : {&tokens, &x, &normed, &q, &k, &v, &attn, &proj, &gate, &up, &attention_workspace, &logits}) {
        b += static_cast<int64_t>(d->size());
      }
      return b + (chunk > 0 ? kGemmWorkspaceBytes + 4 * kPrefillGemvPartials : 0);
    }
  } prefill;

  int64_t weight_bytes = 0;
  CudaInitTimes init_times;

  cuda::DecodeAttentionShape attention_shape() const {
    cuda::DecodeAttentionShape s;
    s.n_heads = config.num_attention_heads;
    s.n_kv_heads = config.num_key_value_heads;
    s.head_dim = config.head_dim;
    s.context_length = options.context_length;
    s.split_positions = options.attention_split;
    s.fused_max_blocks = options.decode_attention_blocks;
    s.tensor_cores = options.decode_attention_tensor_cores;
    s.warm_code = options.decode_attention_warm;
    return s;
  }

  int64_t kv_layer_elements() const { return options.context_length * config.kv_dim(); }

  // side -1: the main stream; 0 or 1: a side stream (between fork() and join()).
  Status linear(const DeviceLinear& w, const cuda::DeviceBuffer& in, cuda::DeviceBuffer& out, int side = -1) {
    return linear(w, in.as<float>(), out.as<float>(), side);
  }
  // `out` may also be mapped host memory (the decode step's logits).
  Status linear(const DeviceLinear& w, const float* in, float* out, int side = -1) {
    const cuda::Stream s = side < 0 ? stream.get() : side_streams[side].get();
    cuda::GemvWorkspace& ws = side < 0 ? gemv_workspace : side_workspaces[side];
    if (w.gptq) return cuda::gemv_gptq(w.quantized.view(), in, out, ws, s);
    return cuda::gemv_dense(w.dense, in, out, s);
  }

  // The side streams wait for the work issued so far on the main stream.
  Status fork(int sides) {
    PETREL_RETURN_IF_ERROR(fork_event.record(stream.get()));
    for (int i = 0; i < sides; ++i) PETREL_RETURN_IF_ERROR(fork_event.wait_in(side_streams[i].get()));
    return ok_status();
  }
  // The main stream waits for the work issued on the side streams.
  Status join(int sides) {
    for (int i = 0; i < sides; ++i) {
      PETREL_RETURN_IF_ERROR(join_events[i].record(side_streams[i].get()));
      PETREL_RETURN_IF_ERROR(join_events[i].wait_in(stream.get()));
    }
    return ok_status();
  }

  // The fused step: five launches per layer, each overlapping the one before it (when `overlap`):
  //   q/k/v grouped GEMV, RMSNorm of x folded into its staging of x;
  //   RoPE + KV store + split attention + combine (decode_attention_rope);
  //   o_proj GEMV, x += its output in its epilogue;
  //   gate/up grouped GEMV, RMSNorm of x in its staging;
  //   down_proj GEMV, SiLU(gate) * up in its staging, x += in its epilogue.
  // x is the residual stream, up to date after every layer (the unfused step keeps the last add pending in
  // `proj`). Same formulas as the unfused step; only the sum of squares of the norms is summed in another order.
  // A product's options in the fused step: its input splits, where set its own L2 prefetch steps, and for the
  // RMSNorm products how many batches of weight loads go out after the wait and whether three are in flight
  // (CudaModelOptions::decode_splits, decode_l2_prefetch, decode_late_batches, decode_deep_batches).
  static cuda::GemvOptions for_phase(cuda::GemvOptions o, int k_splits, int l2_prefetch_steps, int late_batches = 0,
                                     bool deep_batches = true) {
    o.k_splits = k_splits;
    if (l2_prefetch_steps >= 0) o.l2_prefetch_steps = l2_prefetch_steps;
    o.late_batches = late_batches;
    o.deep_batches = deep_batches;
    return o;
  }

  Status enqueue_fused_step(bool with_final_norm) {
    const LlamaConfig& c = config;
    const cuda::Stream s = stream.get();
    const float eps = static_cast<float>(c.rms_norm_eps);
    const int32_t* token = step_input.as<int32_t>();
    const int32_t* pos = token + 1;
    const cuda::DecodeAttentionShape attention = attention_shape();
    cuda::GemvOptions gemv;
    gemv.overlap_previous = overlap;
    gemv.l2_prefetch_steps = options.gemv_l2_prefetch_steps;
    gemv.cluster_reduce = options.gemv_cluster_reduce;
    gemv.uniform_zeros = options.decode_uniform_zeros;
    // Atomic split-K (CudaModelOptions::decode_atomic_reduce): every product but layer 0's q/k/v adds its slices
    // into its output, so each output must be zero (or, for o and down, the residual stream) when its product
    // runs. Each is cleared by a launch after its last reader and before its writer: up by the layer's q/k/v
    // (down of the layer before, which read it, has completed by q/k/v's wait), gate by o, q by gate/up (the
    // layer's attention read it), k and v by down. Layer 0's q/k/v sums in order, so a step needs nothing zeroed
    // beforehand.
    cuda::GemvOptions atomic = gemv;
    atomic.atomic_reduce = options.decode_atomic_reduce;
    auto clearing = [&](cuda::GemvFusion f, const cuda::DeviceBuffer& a, int64_t a_count, const cuda::DeviceBuffer* b = nullptr,
                        int64_t b_count = 0) {
      if (!atomic.atomic_reduce) return f;
      f.clear[0] = {a.as<float>(), a_count};
      if (b) f.clear[1] = {b->as<float>(), b_count};
      return f;
    };
    float* residual = x.as<float>();
    PETREL_RETURN_IF_ERROR(embed.lookup(token, 1, residual, s));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const DeviceLayer& w = layers[l];
      uint16_t* layer_keys = keys.as<uint16_t>() + l * kv_layer_elements();
      uint16_t* layer_values = values.as<uint16_t>() + l * kv_layer_elements();
      cuda::GemvFusion input_norm;
      input_norm.input = cuda::GemvInput::kRmsNorm;
      input_norm.norm_weight = w.input_norm.weight;
      input_norm.norm_eps = eps;
      const cuda::GemvGroupMember qkv[] = {{&w.q_proj.quantized.view(), q.as<float>()},
                                           {&w.k_proj.quantized.view(), k.as<float>()},
                                           {&w.v_proj.quantized.view(), v.as<float>()}};
      const uint32_t skip = options.decode_skip_phases;  // diagnostic (CudaModelOptions::decode_skip_phases)
      const CudaModelOptions::DecodeCarveouts& carveouts = options.decode_phase_carveouts;
      // The tensor-copy GEMV's options for a product (stages 0: the register GEMV takes it).
      auto tma_for = [&](int stages, int k_splits, std::initializer_list<const cuda::DeviceGptqMatrix*> matrices) {
        bool ok = stages > 0 && atomic.atomic_reduce;
        for (const cuda::DeviceGptqMatrix* m : matrices) ok = ok && cuda::gemv_gptq_tma_supports(*m).ok();
        cuda::GemvTmaOptions tma;
        tma.stages = ok ? stages : 0;
        tma.k_splits = k_splits;
        tma.prewait_stages = options.decode_tma_prewait;
        tma.late_dependents = options.decode_tma_late_dependents;
        tma.overlap_previous = overlap;
        return tma;
      };
      const cuda::GemvTmaOptions tma_qkv = tma_for(
          l > 0 ? options.decode_tma_qkv_stages : 0, options.decode_splits.qkv,
          {&w.q_proj.quantized.view(), &w.k_proj.quantized.view(), &w.v_proj.quantized.view()});
      if (!(skip & CudaModelOptions::kSkipQkv) && tma_qkv.stages > 0) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.qkv);
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_tma_grouped(qkv, residual, gemv_workspace.multiprocessors(), s, tma_qkv,
                                                           clearing(input_norm, up, c.intermediate_size)));
      } else if (!(skip & CudaModelOptions::kSkipQkv)) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.qkv);
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_grouped(qkv, residual, gemv_workspace, s,
                                                       for_phase(l > 0 ? atomic : gemv, options.decode_splits.qkv, options.decode_l2_prefetch.qkv,
                                                                 options.decode_late_batches.qkv, options.decode_deep_batches.qkv),
                                                       clearing(input_norm, up, c.intermediate_size)));
      }
      if (!(skip & CudaModelOptions::kSkipAttention)) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.attention);
        PETREL_RETURN_IF_ERROR(cuda::decode_attention_rope(q.as<float>(), k.as<float>(), v.as<float>(), inv_freq.as<float>(),
                                                           pos, layer_keys, layer_values, attention,
                                                           attention_workspace.as<float>(), attention_counters.as<uint32_t>(),
                                                           attn.as<float>(), s, overlap));
      }
      cuda::GemvFusion add_to_residual;
      add_to_residual.residual = residual;
      const cuda::GemvTmaOptions tma_o = tma_for(options.decode_tma_o_stages, options.decode_splits.o, {&w.o_proj.quantized.view()});
      if (!(skip & CudaModelOptions::kSkipO) && tma_o.stages > 0) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.o);
        const cuda::GemvGroupMember o_proj[] = {{&w.o_proj.quantized.view(), residual}};  // the sums added into the residual
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_tma_grouped(o_proj, attn.as<float>(), gemv_workspace.multiprocessors(), s, tma_o,
                                                           clearing(cuda::GemvFusion{}, gate, c.intermediate_size)));
      } else if (!(skip & CudaModelOptions::kSkipO)) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.o);
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq(w.o_proj.quantized.view(), attn.as<float>(), residual, gemv_workspace, s,
                                               for_phase(atomic, options.decode_splits.o, options.decode_l2_prefetch.o),
                                               clearing(add_to_residual, gate, c.intermediate_size)));
      }
      cuda::GemvFusion post_attention_norm = input_norm;
      post_attention_norm.norm_weight = w.post_attn_norm.weight;
      const cuda::GemvGroupMember gate_up[] = {{&w.gate_proj.quantized.view(), gate.as<float>()},
                                               {&w.up_proj.quantized.view(), up.as<float>()}};
      const cuda::GemvTmaOptions tma_gate_up = tma_for(options.decode_tma_gate_up_stages, options.decode_splits.gate_up,
                                                       {&w.gate_proj.quantized.view(), &w.up_proj.quantized.view()});
      if (!(skip & CudaModelOptions::kSkipGateUp) && tma_gate_up.stages > 0) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.gate_up);
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_tma_grouped(gate_up, residual, gemv_workspace.multiprocessors(), s, tma_gate_up,
                                                           clearing(post_attention_norm, q, c.q_dim())));
      } else if (!(skip & CudaModelOptions::kSkipGateUp)) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.gate_up);
        PETREL_RETURN_IF_ERROR(
            cuda::gemv_gptq_grouped(gate_up, residual, gemv_workspace, s, for_phase(atomic, options.decode_splits.gate_up, options.decode_l2_prefetch.gate_up,
                                                                                          options.decode_late_batches.gate_up,
                                                                                          options.decode_deep_batches.gate_up),
                                    clearing(post_attention_norm, q, c.q_dim())));
      }
      cuda::GemvFusion silu_and_add;
      silu_and_add.input = cuda::GemvInput::kSiluMul;
      silu_and_add.up = up.as<float>();
      silu_and_add.residual = residual;
      const cuda::GemvTmaOptions tma_down =
          tma_for(options.decode_tma_down_stages, options.decode_splits.down, {&w.down_proj.quantized.view()});
      if (!(skip & CudaModelOptions::kSkipDown) && tma_down.stages > 0) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.down);
        cuda::GemvFusion silu = silu_and_add;
        silu.residual = nullptr;  // the sums are added into the residual stream itself
        const cuda::GemvGroupMember down[] = {{&w.down_proj.quantized.view(), residual}};
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_tma_grouped(down, gate.as<float>(), gemv_workspace.multiprocessors(), s, tma_down,
                                                           clearing(silu, k, c.kv_dim(), &v, c.kv_dim())));
      } else if (!(skip & CudaModelOptions::kSkipDown)) {
        const cuda::ScopedLaunchCarveout carveout(carveouts.down);
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq(w.down_proj.quantized.view(), gate.as<float>(), residual, gemv_workspace, s,
                                               for_phase(atomic, options.decode_splits.down,
                                                         w.down_proj.quantized.view().group_size < c.intermediate_size
                                                             ? options.decode_l2_prefetch.down_grouped
                                                             : options.decode_l2_prefetch.down),
                                               clearing(silu_and_add, k, c.kv_dim(), &v, c.kv_dim())));
      }
    }
    if (!with_final_norm) return ok_status();
    return cuda::rms_norm(residual, nullptr, 1, c.hidden_size, final_norm.weight, eps, normed.as<float>(), s);
  }

  // The resident step: the fused step's products and attention calls in the same order, the products between
  // two attention calls in one launch (resident_chains says which); the fused step's bits with
  // options.resident_min_unit_steps 0, otherwise the same sums cut into longer input slices.
  Status enqueue_resident_step(bool with_final_norm) {
    const LlamaConfig& c = config;
    const cuda::Stream s = stream.get();
    const int32_t* token = step_input.as<int32_t>();
    const int32_t* pos = token + 1;
    const cuda::DecodeAttentionShape attention = attention_shape();
    PETREL_RETURN_IF_ERROR(embed.lookup(token, 1, x.as<float>(), s));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      PETREL_RETURN_IF_ERROR(resident.enqueue(static_cast<int>(l), s, overlap));
      PETREL_RETURN_IF_ERROR(cuda::decode_attention_rope(q.as<float>(), k.as<float>(), v.as<float>(), inv_freq.as<float>(),
                                                         pos, keys.as<uint16_t>() + l * kv_layer_elements(),
                                                         values.as<uint16_t>() + l * kv_layer_elements(), attention,
                                                         attention_workspace.as<float>(), attention_counters.as<uint32_t>(),
                                                         attn.as<float>(), s, overlap));
    }
    PETREL_RETURN_IF_ERROR(resident.enqueue(static_cast<int>(c.num_hidden_layers), s, overlap));
    if (!with_final_norm) return ok_status();
    return cuda::rms_norm(x.as<float>(), nullptr, 1, c.hidden_size, final_norm.weight, static_cast<float>(c.rms_norm_eps),
                          normed.as<float>(), s);
  }

  // The fused step's products grouped into the resident step's chains (enqueue_resident_step).
  std::vector<std::vector<cuda::ResidentGemv>> resident_chains() const {
    const LlamaConfig& c = config;
    const float eps = static_cast<float>(c.rms_norm_eps);
    float* residual = x.as<float>();
    std::vector<std::vector<cuda::ResidentGemv>> chains(static_cast<size_t>(c.num_hidden_layers) + 1);
    for (int64_t l = 0; l <= c.num_hidden_layers; ++l) {
      std::vector<cuda::ResidentGemv>& chain = chains[static_cast<size_t>(l)];
      if (l > 0) {
        const DeviceLayer& w = layers[l - 1];
        cuda::ResidentGemv o;
        o.members = {{&w.o_proj.quantized.view(), residual}};
        o.x = attn.as<float>();
        o.fusion.residual = residual;
        chain.push_back(o);
        cuda::ResidentGemv gate_up;
        gate_up.members = {{&w.gate_proj.quantized.view(), gate.as<float>()}, {&w.up_proj.quantized.view(), up.as<float>()}};
        gate_up.x = residual;
        gate_up.fusion.input = cuda::GemvInput::kRmsNorm;
        gate_up.fusion.norm_weight = w.post_attn_norm.weight;
        gate_up.fusion.norm_eps = eps;
        chain.push_back(gate_up);
        cuda::ResidentGemv down;
        down.members = {{&w.down_proj.quantized.view(), residual}};
        down.x = gate.as<float>();
        down.fusion.input = cuda::GemvInput::kSiluMul;
        down.fusion.up = up.as<float>();
        down.fusion.residual = residual;
        chain.push_back(down);
      }
      if (l < c.num_hidden_layers) {
        const DeviceLayer& w = layers[l];
        cuda::ResidentGemv qkv;
        qkv.members = {{&w.q_proj.quantized.view(), q.as<float>()},
                       {&w.k_proj.quantized.view(), k.as<float>()},
                       {&w.v_proj.quantized.view(), v.as<float>()}};
        qkv.x = residual;
        qkv.fusion.input = cuda::GemvInput::kRmsNorm;
        qkv.fusion.norm_weight = w.input_norm.weight;
        qkv.fusion.norm_eps = eps;
        chain.push_back(qkv);
      }
    }
    return chains;
  }

  // The fused step reads every decoder linear as GPTQ, q/k/v and gate/up each in one grouped launch.
  bool fused_step_applies() const {
    for (const DeviceLayer& w : layers) {
      for (const DeviceLinear* lin : {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.gate_proj, &w.up_proj, &w.down_proj}) {
        if (!lin->gptq) return false;
      }
      const cuda::GemvGroupMember qkv[] = {{&w.q_proj.quantized.view(), nullptr},
                                           {&w.k_proj.quantized.view(), nullptr},
                                           {&w.v_proj.quantized.view(), nullptr}};
      const cuda::GemvGroupMember gate_up[] = {{&w.gate_proj.quantized.view(), nullptr},
                                               {&w.up_proj.quantized.view(), nullptr}};
      const int sms = gemv_workspace.multiprocessors();
      const int64_t capacity = gemv_workspace.partial_capacity();
      if (!cuda::plan_gemv_gptq_grouped(qkv, sms, capacity).ok() || !cuda::plan_gemv_gptq_grouped(gate_up, sms, capacity).ok()) {
        return false;
      }
    }
    return true;
  }

  // The batch prompt path reads every decoder linear as 4-bit GPTQ, q/k/v and gate/up each in one grouped
  // launch, at up to cuda::kMaxGemvTokens tokens within the prompt processor's GEMV workspace.
  bool batch_prefill_applies() const {
    const int sms = prefill.gemv.multiprocessors();
    const int64_t capacity = prefill.gemv.partial_capacity();
    for (const DeviceLayer& w : layers) {
      for (const DeviceLinear* lin : {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.gate_proj, &w.up_proj, &w.down_proj}) {
        if (!lin->gptq || lin->quantized.view().bits != 4) return false;
      }
      const cuda::GemvGroupMember qkv[] = {{&w.q_proj.quantized.view(), nullptr},
                                           {&w.k_proj.quantized.view(), nullptr},
                                           {&w.v_proj.quantized.view(), nullptr}};
      const cuda::GemvGroupMember gate_up[] = {{&w.gate_proj.quantized.view(), nullptr},
                                               {&w.up_proj.quantized.view(), nullptr}};
      const cuda::GemvGroupMember o[] = {{&w.o_proj.quantized.view(), nullptr}};
      const cuda::GemvGroupMember down[] = {{&w.down_proj.quantized.view(), nullptr}};
      for (std::span<const cuda::GemvGroupMember> members : {std::span<const cuda::GemvGroupMember>(qkv),
                                                              std::span<const cuda::GemvGroupMember>(gate_up),
                                                              std::span<const cuda::GemvGroupMember>(o),
                                                              std::span<const cuda::GemvGroupMember>(down)}) {
        if (!cuda::plan_gemv_gptq_batch(members, cuda::kMaxGemvTokens, sms, capacity).ok()) return false;
      }
    }
    return true;
  }

  // Whether the LM head takes the final RMSNorm into its staging (the fused and resident steps, whose residual
  // stream x is complete at the end, with a GPTQ LM head), so that the step leaves `normed` alone.
  bool head_takes_final_norm() const { return (fused || resident.size() > 0) && lm_head.gptq; }

  // Everything up to the final RMSNorm (into `normed`; with_final_norm false, only where head_takes_final_norm(),
  // stops before it), for the token and position in step_input.
  Status enqueue_step(bool with_final_norm = true) {
    if (resident.size() > 0) return enqueue_resident_step(with_final_norm);
    if (fused) return enqueue_fused_step(with_final_norm);
    const LlamaConfig& c = config;
    const cuda::Stream s = stream.get();
    const float eps = static_cast<float>(c.rms_norm_eps);
    const int32_t* token = step_input.as<int32_t>();
    const int32_t* pos = token + 1;
    const cuda::RopeShape rope{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
    const cuda::DecodeAttentionShape attention = attention_shape();
    PETREL_RETURN_IF_ERROR(embed.lookup(token, 1, x.as<float>(), s));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      DeviceLayer& w = layers[l];
      uint16_t* layer_keys = keys.as<uint16_t>() + l * kv_layer_elements();
      uint16_t* layer_values = values.as<uint16_t>() + l * kv_layer_elements();
      // Self-attention: the previous layer's MLP output is added to x as x is normalized.
      PETREL_RETURN_IF_ERROR(cuda::rms_norm(x.as<float>(), l == 0 ? nullptr : proj.as<float>(), 1, c.hidden_size,
                                            w.input_norm.weight, eps, normed.as<float>(), s));
      PETREL_RETURN_IF_ERROR(fork(2));
      PETREL_RETURN_IF_ERROR(linear(w.q_proj, normed, q));
      PETREL_RETURN_IF_ERROR(linear(w.k_proj, normed, k, 0));
      PETREL_RETURN_IF_ERROR(linear(w.v_proj, normed, v, 1));
      PETREL_RETURN_IF_ERROR(join(2));
      PETREL_RETURN_IF_ERROR(cuda::rope_store_kv(q.as<float>(), k.as<float>(), v.as<float>(), rope, inv_freq.as<float>(),
                                                 pos, layer_keys, layer_values, s));
      PETREL_RETURN_IF_ERROR(cuda::decode_attention(q.as<float>(), layer_keys, layer_values, pos, attention,
                                                    attention_workspace.as<float>(), attn.as<float>(), s));
      PETREL_RETURN_IF_ERROR(linear(w.o_proj, attn, proj));
      // Feed-forward: x += attention output, normalized.
      PETREL_RETURN_IF_ERROR(cuda::rms_norm(x.as<float>(), proj.as<float>(), 1, c.hidden_size, w.post_attn_norm.weight,
                                            eps, normed.as<float>(), s));
      PETREL_RETURN_IF_ERROR(fork(1));
      PETREL_RETURN_IF_ERROR(linear(w.gate_proj, normed, gate));
      PETREL_RETURN_IF_ERROR(linear(w.up_proj, normed, up, 0));
      PETREL_RETURN_IF_ERROR(join(1));
      PETREL_RETURN_IF_ERROR(cuda::silu_mul(gate.as<float>(), up.as<float>(), c.intermediate_size, gate.as<float>(), s));
      PETREL_RETURN_IF_ERROR(linear(w.down_proj, gate, proj));
    }
    return cuda::rms_norm(x.as<float>(), proj.as<float>(), 1, c.hidden_size, final_norm.weight, eps, normed.as<float>(), s);
  }

  // Y[n, out] = X[n, in] W^T for the prompt processor. With an fp16 copy of W, the chunks that gemm_gptq
  // would dequantize for (kDequantCublas) read the copy instead.
  Status prefill_linear(const DeviceLinear& w, const float* in, int64_t n, float* out) {
    if (w.gptq && w.f16.data && cuda::auto_gemm_algorithm(w.quantized.view(), n) == cuda::GemmAlgorithm::kDequantCublas) {
      return cuda::gemm_dense(w.f16, in, n, out, prefill.gemm, stream.get());
    }
    cuda::GemmOptions gemm;
    gemm.overlap_previous = overlap;
    if (w.gptq) return cuda::gemm_gptq(w.quantized.view(), in, n, out, prefill.gemm, stream.get(), gemm);
    return cuda::gemm_dense(w.dense, in, n, out, prefill.gemm, stream.get());
  }

  // True when layer w's MLP at n tokens runs through gemm_gptq_group with its element-wise steps fused into
  // the stagings (CudaModelOptions::fused_prefill_inputs): GPTQ gate/up/down whose plans are one launch of the
  // fused kernel each (not dequantize + cuBLAS or the fp16 copies, which long chunks take).
  bool fused_mlp_inputs(const DeviceLayer& w, int64_t n) {
    const bool batch_mlp = options.batch_prefill_gate_up || options.batch_prefill_down;  // asked for the batch GEMV
    if (!options.fused_prefill_inputs || (prefill.batch && n <= cuda::kMaxGemvTokens && batch_mlp)) {
      return false;
    }
    if (!w.gate_proj.gptq || !w.up_proj.gptq || !w.down_proj.gptq) return false;
    const cuda::GemvGroupMember gate_up[] = {{&w.gate_proj.quantized.view(), nullptr}, {&w.up_proj.quantized.view(), nullptr}};
    const cuda::GemvGroupMember down[] = {{&w.down_proj.quantized.view(), nullptr}};
    return cuda::gemm_gptq_group_applies(gate_up, n, prefill.gemm) && cuda::gemm_gptq_group_applies(down, n, prefill.gemm);
  }

  // True when layer w's q/k/v at n tokens run as one fused-GEMM launch with the input RMSNorm in its staging
  // (CudaModelOptions::prefill_qkv_gemm).
  bool fused_qkv_inputs(const DeviceLayer& w, int64_t n) {
    if (!options.fused_prefill_inputs || !options.prefill_qkv_gemm) return false;
    if (!w.q_proj.gptq || !w.k_proj.gptq || !w.v_proj.gptq) return false;
    const cuda::GemvGroupMember qkv[] = {
        {&w.q_proj.quantized.view(), nullptr}, {&w.k_proj.quantized.view(), nullptr}, {&w.v_proj.quantized.view(), nullptr}};
    return cuda::gemm_gptq_group_applies(qkv, n, prefill.gemm);
  }

  // The staging fusion for an RMSNorm of the prompt processor's residual stream (prefill.x): cuda::rms_norm's
  // x += residual (when `residual` is not null) and norm, done while the GEMM stages its input.
  cuda::GemmInputFusion residual_norm(const DeviceNorm& norm, const float* residual) const {
    cuda::GemmInputFusion f;
    f.input = cuda::GemvInput::kRmsNorm;
    f.norm_weight = norm.weight;
    f.norm_eps = static_cast<float>(config.rms_norm_eps);
    f.residual = residual;
    f.residual_sum = residual ? prefill.x.as<float>() : nullptr;
    return f;
  }

  // The prompt processor's layers for n tokens (ids already in prefill.tokens) at positions start ..
  // start + n - 1, up to the final RMSNorm into prefill.normed. The order of enqueue_step, with every
  // activation n rows tall and the linears as GEMMs, or for short chunks (batch_prefill) q/k/v and o as batch
  // GEMVs. Where the decode step overlaps its kernels (`overlap`), so do these: every kernel launched to
  // overlap its predecessor waits for it before it touches activations or the KV cache (the batch GEMVs
  // stream their first weights before that wait).
  Status enqueue_prefill(int64_t start, int64_t n) {
    const LlamaConfig& c = config;
    const cuda::Stream s = stream.get();
    const float eps = static_cast<float>(c.rms_norm_eps);
    Prefill& p = prefill;
    const cuda::RopeShape rope{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
    const cuda::PrefillAttentionShape attention{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
    float* x_rows = p.x.as<float>();
    float* normed_rows = p.normed.as<float>();
    float* proj_rows = p.proj.as<float>();
    // Short chunks: the linears through the batch GEMV, each launch overlapping the kernel before it as in the
    // decode step (every kernel it follows completes before it reads an activation: gemv_gptq.h).
    const bool batch = p.batch && n <= cuda::kMaxGemvTokens;
    cuda::GemvOptions gemv;
    gemv.overlap_previous = overlap;
    gemv.l2_prefetch_steps = options.gemv_l2_prefetch_steps;
    PETREL_RETURN_IF_ERROR(embed.lookup(p.tokens.as<int32_t>(), n, x_rows, s));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const DeviceLayer& w = layers[l];
      uint16_t* layer_keys = keys.as<uint16_t>() + l * kv_layer_elements();
      uint16_t* layer_values = values.as<uint16_t>() + l * kv_layer_elements();
      const cuda::GemvGroupMember qkv[] = {{&w.q_proj.quantized.view(), p.q.as<float>()},
                                           {&w.k_proj.quantized.view(), p.k.as<float>()},
                                           {&w.v_proj.quantized.view(), p.v.as<float>()}};
      const bool qkv_gemm = fused_qkv_inputs(w, n);
      if (qkv_gemm) {  // one GEMM launch, the input RMSNorm and residual add in its staging
        cuda::GemmOptions gemm;
        gemm.overlap_previous = overlap && l > 0;
        PETREL_RETURN_IF_ERROR(cuda::gemm_gptq_group(qkv, x_rows, n, p.gemm, s, gemm,
                                                     residual_norm(w.input_norm, l == 0 ? nullptr : proj_rows)));
      } else {
        PETREL_RETURN_IF_ERROR(cuda::rms_norm(x_rows, l == 0 ? nullptr : proj_rows, n, c.hidden_size, w.input_norm.weight,
                                              eps, normed_rows, s, overlap && l > 0));
        if (batch) {
          PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_batch(qkv, normed_rows, n, p.gemv, s, gemv));
        } else {
          PETREL_RETURN_IF_ERROR(prefill_linear(w.q_proj, normed_rows, n, p.q.as<float>()));
          PETREL_RETURN_IF_ERROR(prefill_linear(w.k_proj, normed_rows, n, p.k.as<float>()));
          PETREL_RETURN_IF_ERROR(prefill_linear(w.v_proj, normed_rows, n, p.v.as<float>()));
        }
      }
      PETREL_RETURN_IF_ERROR(cuda::rope_store_kv_rows(p.q.as<float>(), p.k.as<float>(), p.v.as<float>(), n, start, rope,
                                                      inv_freq.as<float>(), layer_keys, layer_values, s, overlap));
      if (cuda::prefill_attention_short_preferred(start, n)) {  // a short prompt: one launch, no cuBLAS
        PETREL_RETURN_IF_ERROR(cuda::prefill_attention_short(p.q.as<float>(), layer_keys, layer_values, start, n, attention,
                                                             p.attn.as<float>(), s, overlap));
      } else {
        PETREL_RETURN_IF_ERROR(cuda::prefill_attention(p.q.as<float>(), layer_keys, layer_values, start, n, attention,
                                                       p.gemm.blas(), p.attention_workspace.data(),
                                                       static_cast<int64_t>(p.attention_workspace.size()),
                                                       p.attn.as<float>(), s));
      }
      if (batch) {
        const cuda::GemvGroupMember o[] = {{&w.o_proj.quantized.view(), proj_rows}};
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_batch(o, p.attn.as<float>(), n, p.gemv, s, gemv));
      } else {
        PETREL_RETURN_IF_ERROR(prefill_linear(w.o_proj, p.attn.as<float>(), n, proj_rows));
      }
      const cuda::GemvGroupMember gate_up[] = {{&w.gate_proj.quantized.view(), p.gate.as<float>()},
                                               {&w.up_proj.quantized.view(), p.up.as<float>()}};
      const cuda::GemvGroupMember down[] = {{&w.down_proj.quantized.view(), proj_rows}};
      if (fused_mlp_inputs(w, n)) {  // the post-attention norm and SiLU*up inside the GEMMs' staging launches
        cuda::GemmOptions gemm;
        gemm.overlap_previous = overlap;
        PETREL_RETURN_IF_ERROR(cuda::gemm_gptq_group(gate_up, x_rows, n, p.gemm, s, gemm, residual_norm(w.post_attn_norm, proj_rows)));
        cuda::GemmInputFusion silu;
        silu.input = cuda::GemvInput::kSiluMul;
        silu.up = p.up.as<float>();
        PETREL_RETURN_IF_ERROR(cuda::gemm_gptq_group(down, p.gate.as<float>(), n, p.gemm, s, gemm, silu));
        continue;
      }
      PETREL_RETURN_IF_ERROR(
          cuda::rms_norm(x_rows, proj_rows, n, c.hidden_size, w.post_attn_norm.weight, eps, normed_rows, s, overlap));
      if (batch && options.batch_prefill_gate_up) {
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_batch(gate_up, normed_rows, n, p.gemv, s, gemv));
      } else {
        PETREL_RETURN_IF_ERROR(prefill_linear(w.gate_proj, normed_rows, n, p.gate.as<float>()));
        PETREL_RETURN_IF_ERROR(prefill_linear(w.up_proj, normed_rows, n, p.up.as<float>()));
      }
      if (batch && options.batch_prefill_down) {
        cuda::GemvFusion silu;
        silu.input = cuda::GemvInput::kSiluMul;
        silu.up = p.up.as<float>();
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_batch(down, p.gate.as<float>(), n, p.gemv, s, gemv, silu));
      } else {
        PETREL_RETURN_IF_ERROR(
            cuda::silu_mul(p.gate.as<float>(), p.up.as<float>(), n * c.intermediate_size, p.gate.as<float>(), s, overlap));
        PETREL_RETURN_IF_ERROR(prefill_linear(w.down_proj, p.gate.as<float>(), n, proj_rows));
      }
    }
    return cuda::rms_norm(x_rows, proj_rows, n, c.hidden_size, final_norm.weight, eps, normed_rows, s, overlap);
  }

  // The most tokens of one chunk starting at `start` whose attention fits the workspace.
  int64_t prefill_tokens_at(int64_t start, int64_t wanted) const {
    const cuda::PrefillAttentionShape shape{config.num_attention_heads, config.num_key_value_heads, config.head_dim};
    const int64_t capacity = static_cast<int64_t>(prefill.attention_workspace.size());
    int64_t n = std::min(wanted, prefill.chunk);
    while (n > 1 && cuda::prefill_attention_workspace_bytes(shape, n, start + n) > capacity) n = (n + 1) / 2;
    return n;
  }

  // n tokens (n <= prefill.chunk) through the prompt processor at `position`; appends to `logits` the last
  // row's (all == false) or every row's (all == true) logits when `logits` is not null.
  // With top_k > 0 (and no logits), the last row's top_k largest logits go to *top instead (last_top).
  Status prefill_chunk(const int32_t* tokens, int64_t n, bool all, std::vector<float>* logits, int top_k = 0,
                       TopLogits* top = nullptr) {
    const LlamaConfig& c = config;
    const cuda::Stream s = stream.get();
    Prefill& p = prefill;
    PETREL_RETURN_IF_ERROR(cuda::copy_to_device(p.tokens.data(), tokens, static_cast<size_t>(n) * 4, s));
    PETREL_RETURN_IF_ERROR(enqueue_prefill(position, n));
    const size_t row_bytes = static_cast<size_t>(c.vocab_size) * 4;
    if (logits && all) {
      if (p.logits.size() < static_cast<size_t>(p.chunk) * row_bytes) {
        auto buffer = cuda::DeviceBuffer::allocate(static_cast<size_t>(p.chunk) * row_bytes);
        if (!buffer.ok()) return with_context(buffer.status(), "the prompt processor's logits for every token");
        p.logits = std::move(buffer).value();
      }
      PETREL_RETURN_IF_ERROR(prefill_linear(lm_head, p.normed.as<float>(), n, p.logits.as<float>()));
      const size_t old = logits->size();
      logits->resize(old + static_cast<size_t>(n) * c.vocab_size);
      PETREL_RETURN_IF_ERROR(cuda::copy_to_host(logits->data() + old, p.logits.data(), n * row_bytes, s));
    } else if (logits || top_k > 0) {
      // The last row through the token generator's LM head (one GEMV instead of a GEMM of n rows).
      PETREL_RETURN_IF_ERROR(cuda::copy_on_device(normed.data(), p.normed.as<float>() + (n - 1) * c.hidden_size,
                                                  static_cast<size_t>(c.hidden_size) * 4, s));
      if (logits) {
        PETREL_RETURN_IF_ERROR(linear(lm_head, normed, this->logits));
        PETREL_RETURN_IF_ERROR(cuda::copy_to_host(host_logits.data(), this->logits.data(), row_bytes, s));
      } else {
        PETREL_RETURN_IF_ERROR(last_top(top_k, top));  // synchronizes
      }
    }
    if (logits || top_k <= 0) PETREL_RETURN_IF_ERROR(with_context(stream.synchronize(), "the CUDA prompt processor"));
    if (logits && !all) {
      const size_t old = logits->size();
      logits->resize(old + c.vocab_size);
      std::memcpy(logits->data() + old, host_logits.data(), row_bytes);
    }
    position += n;
    return ok_status();
  }

  // The LM head on `normed` (the last token's final hidden state), its top_k largest logits chosen on the GPU
  // (cuda::top_k_logits) and only those copied back; synchronizes. When the kernel cannot choose (a NaN in the
  // logits), every logit is copied instead (TopLogits::all).
  Status last_top(int top_k, TopLogits* top) {
    PETREL_RETURN_IF_ERROR(linear(lm_head, normed, logits));
    PETREL_RETURN_IF_ERROR(enqueue_top(top_k));
    return read_top(top_k, top);
  }

  // The top_k largest of `logits` (on the device) into top_host.
  Status enqueue_top(int top_k) {
    const cuda::Stream s = stream.get();
    auto* result = static_cast<cuda::TopKResult*>(top_device.data());
    void* workspace = static_cast<char*>(top_device.data()) + kTopResultBytes;
    PETREL_RETURN_IF_ERROR(cuda::top_k_logits(logits.as<float>(), config.vocab_size, top_k, result, workspace, s, overlap));
    return cuda::copy_to_host(top_host.data(), result, sizeof(cuda::TopKResult), s);
  }

  // The k of the decode step's top-k graph: the most a caller may ask.
  int top_graph_k() const { return static_cast<int>(std::min<int64_t>(cuda::kMaxDeviceTopK, config.vocab_size)); }

  // Waits for enqueue_top's answer and returns it (every logit when the kernel could not choose).
  Status read_top(int top_k, TopLogits* top) {
    const cuda::Stream s = stream.get();
    PETREL_RETURN_IF_ERROR(with_context(stream.synchronize(), "the CUDA LM head and top-k"));
    const auto* answer = static_cast<const cuda::TopKResult*>(top_host.data());
    top->all.clear();
    if (answer->count == top_k) {
      top->values.assign(answer->values, answer->values + top_k);
      top->ids.assign(answer->ids, answer->ids + top_k);
      return ok_status();
    }
    top->values.clear();
    top->ids.clear();
    top->all.resize(config.vocab_size);
    PETREL_RETURN_IF_ERROR(cuda::copy_to_host(top->all.data(), logits.data(), static_cast<size_t>(config.vocab_size) * 4, s));
    return with_context(stream.synchronize(), "copying the logits");
  }

  // One decode step for the token and position in host_input, up to `output`: the input's copy to the device,
  // the step, and (kLogits, kTop) the LM head, with the final RMSNorm in its staging where it can, and the
  // logits to host_logits (written there by the LM head itself when logits_mapped) or their top_k to top_host.
  Status enqueue_decode(StepOutput output, int top_k) {
    const cuda::Stream s = stream.get();
    const cuda::ScopedLaunchCarveout carveout(options.decode_shared_carveout);
    PETREL_RETURN_IF_ERROR(cuda::copy_to_device(step_input.data(), host_input.data(), 2 * sizeof(int32_t), s));
    const bool head = output != StepOutput::kNormed;
    const bool fold_norm = head && head_takes_final_norm();
    PETREL_RETURN_IF_ERROR(enqueue_step(!fold_norm));
    if (!head) return ok_status();
    const bool to_host = output == StepOutput::kLogits && logits_mapped;
    float* y = to_host ? static_cast<float*>(host_logits.device_data()) : logits.as<float>();
    if (fold_norm) {
      cuda::GemvOptions gemv;
      gemv.overlap_previous = overlap;
      gemv.l2_prefetch_steps = options.gemv_l2_prefetch_steps;
      cuda::GemvFusion norm;
      norm.input = cuda::GemvInput::kRmsNorm;
      norm.norm_weight = final_norm.weight;
      norm.norm_eps = static_cast<float>(config.rms_norm_eps);
      PETREL_RETURN_IF_ERROR(cuda::gemv_gptq(lm_head.quantized.view(), x.as<float>(), y, gemv_workspace, s, gemv, norm));
    } else {
      PETREL_RETURN_IF_ERROR(linear(lm_head, normed.as<float>(), y));
    }
    if (output == StepOutput::kTop) return enqueue_top(top_k);
    if (to_host) return ok_status();
    return cuda::copy_to_host(host_logits.data(), logits.data(), static_cast<size_t>(config.vocab_size) * 4, s);
  }

  // decode_top_masked's second half, after the step without its head (StepOutput::kNormed): the mask's copy to
  // the device, the LM head on `normed`, the mask, the top-k into top_host; replayed from its graph.
  Status enqueue_masked_head(int top_k) {
    const cuda::Stream s = stream.get();
    const cuda::ScopedLaunchCarveout carveout(options.decode_shared_carveout);
    PETREL_RETURN_IF_ERROR(cuda::copy_to_device(allowed_device.data(), allowed_host.data(), allowed_host.size(), s));
    PETREL_RETURN_IF_ERROR(linear(lm_head, normed.as<float>(), logits.as<float>()));
    PETREL_RETURN_IF_ERROR(cuda::mask_logits(logits.as<float>(), allowed_device.as<uint32_t>(), config.vocab_size, s, overlap));
    return enqueue_top(top_k);
  }
  Status run_masked_head(int top_k) {
    if (!options.use_graph) return enqueue_masked_head(top_k);
    if (masked_head_graph.empty()) {
      PETREL_RETURN_IF_ERROR(cuda::CudaGraph::begin_capture(stream.get()));
      Status enqueued = enqueue_masked_head(top_k);
      auto captured = cuda::CudaGraph::end_capture(stream.get());
      PETREL_RETURN_IF_ERROR(enqueued);
      PETREL_RETURN_IF_ERROR(with_context(captured.status(), "capturing the masked LM head"));
      masked_head_graph = std::move(captured).value();
    }
    return masked_head_graph.launch(stream.get());
  }

  // enqueue_decode, replayed from its graph (captured at the first use of each output and k) unless
  // options.use_graph is off.
  Status run_step(StepOutput output, int top_k) {
    if (!options.use_graph) return enqueue_decode(output, top_k);
    cuda::CudaGraph& graph = output == StepOutput::kNormed   ? step_graph
                             : output == StepOutput::kLogits ? logits_graph
                                                             : top_graph;
    if (graph.empty()) {
      PETREL_RETURN_IF_ERROR(cuda::CudaGraph::begin_capture(stream.get()));
      Status enqueued = enqueue_decode(output, top_k);
      auto captured = cuda::CudaGraph::end_capture(stream.get());  // always end the capture, also after an error
      PETREL_RETURN_IF_ERROR(enqueued);
      PETREL_RETURN_IF_ERROR(with_context(captured.status(), "capturing the decode step"));
      graph = std::move(captured).value();
    }
    return graph.launch(stream.get());
  }
};

CudaModel::CudaModel(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaModel::~CudaModel() = default;

const LlamaConfig& CudaModel::config() const { return state_->config; }
int64_t CudaModel::position() const { return state_->position; }
int64_t CudaModel::context_length() const { return state_->options.context_length; }
void CudaModel::reset() { state_->position = 0; }
void CudaModel::truncate(int64_t n) {
  if (n >= 0 && n < state_->position) state_->position = n;
}

namespace {
Status check_kv_rows(const char* what, int64_t layer, int64_t n, size_t elements, const LlamaConfig& c, int64_t context) {
  const std::string where = std::string("CudaModel::") + what + ": ";
  if (layer < 0 || layer >= c.num_hidden_layers) {
    return invalid_argument(where + "layer " + std::to_string(layer) + " of " + std::to_string(c.num_hidden_layers));
  }
  if (n < 0 || n > context) {
    return invalid_argument(where + std::to_string(n) + " positions, the cache holds " + std::to_string(context));
  }
  if (static_cast<int64_t>(elements) != n * c.kv_dim()) {
    return invalid_argument(where + std::to_string(elements) + " elements for " + std::to_string(n) + " positions of " +
                            std::to_string(c.kv_dim()) + " (n_kv_heads x head_dim)");
  }
  return ok_status();
}
}  // namespace

Status CudaModel::read_kv(int64_t layer, bool values, int64_t n, std::span<uint16_t> out) const {
  const State& s = *state_;
  PETREL_RETURN_IF_ERROR(check_kv_rows("read_kv", layer, n, out.size(), s.config, s.options.context_length));
  const uint16_t* rows = (values ? s.values : s.keys).as<uint16_t>() + layer * s.kv_layer_elements();
  PETREL_RETURN_IF_ERROR(cuda::copy_to_host(out.data(), rows, out.size_bytes(), s.stream.get()));
  return with_context(s.stream.synchronize(), "copying the KV cache to the host");
}

Status CudaModel::write_kv(int64_t layer, bool values, int64_t n, std::span<const uint16_t> in) {
  State& s = *state_;
  PETREL_RETURN_IF_ERROR(check_kv_rows("write_kv", layer, n, in.size(), s.config, s.options.context_length));
  uint16_t* rows = (values ? s.values : s.keys).as<uint16_t>() + layer * s.kv_layer_elements();
  PETREL_RETURN_IF_ERROR(cuda::copy_to_device(rows, in.data(), in.size_bytes(), s.stream.get()));
  return with_context(s.stream.synchronize(), "copying the KV cache to the GPU");
}

Status CudaModel::set_position(int64_t n) {
  if (n < 0 || n > state_->options.context_length) {
    return invalid_argument("CudaModel::set_position: " + std::to_string(n) + " positions, the cache holds " +
                            std::to_string(state_->options.context_length));
  }
  state_->position = n;
  return ok_status();
}

struct CudaKvStash::Buffers {
  cuda::DeviceBuffer keys, values;  // [layers, capacity, kv_dim] fp16 each
};
CudaKvStash::CudaKvStash() = default;
CudaKvStash::~CudaKvStash() = default;
CudaKvStash::CudaKvStash(CudaKvStash&&) noexcept = default;
CudaKvStash& CudaKvStash::operator=(CudaKvStash&&) noexcept = default;
int64_t CudaKvStash::device_bytes() const {
  return buffers_ ? static_cast<int64_t>(buffers_->keys.size() + buffers_->values.size()) : 0;
}

Status CudaModel::stash_kv(CudaKvStash& stash) const {
  const State& s = *state_;
  const int64_t n = s.position, layers = s.config.num_hidden_layers;
  const int64_t row_bytes = s.config.kv_dim() * static_cast<int64_t>(sizeof(uint16_t));
  if (n > stash.capacity_) {
    const int64_t capacity = std::min(s.options.context_length, std::max(n, 2 * stash.capacity_));
    const size_t bytes = static_cast<size_t>(layers * capacity * row_bytes);
    auto grown = std::make_unique<CudaKvStash::Buffers>();
    auto keys = cuda::DeviceBuffer::allocate(bytes);
    auto values = keys.ok() ? cuda::DeviceBuffer::allocate(bytes) : Result<cuda::DeviceBuffer>(keys.status());
    if (!values.ok()) {
      return Status(values.status().code(), "setting a session's KV cache aside on the GPU (2 x " + std::to_string(bytes) +
                                                " bytes for " + std::to_string(capacity) + " positions): " +
                                                values.status().message());
    }
    grown->keys = std::move(keys).value();
    grown->values = std::move(values).value();
    stash.buffers_ = std::move(grown);
    stash.capacity_ = capacity;
  }
  for (int64_t l = 0; l < layers && n > 0; ++l) {
    const size_t from = static_cast<size_t>(l * s.kv_layer_elements()), to = static_cast<size_t>(l * stash.capacity_ * s.config.kv_dim());
    PETREL_RETURN_IF_ERROR(cuda::copy_on_device(stash.buffers_->keys.as<uint16_t>() + to, s.keys.as<uint16_t>() + from,
                                                static_cast<size_t>(n * row_bytes), s.stream.get()));
    PETREL_RETURN_IF_ERROR(cuda::copy_on_device(stash.buffers_->values.as<uint16_t>() + to, s.values.as<uint16_t>() + from,
                                                static_cast<size_t>(n * row_bytes), s.stream.get()));
  }
  PETREL_RETURN_IF_ERROR(with_context(s.stream.synchronize(), "setting a session's KV cache aside on the GPU"));
  stash.position_ = n;
  return ok_status();
}

Status CudaModel::unstash_kv(const CudaKvStash& stash) {
  State& s = *state_;
  const int64_t n = stash.position_, layers = s.config.num_hidden_layers;
  if (n > s.options.context_length || n > stash.capacity_) {
    return invalid_argument("CudaModel::unstash_kv: " + std::to_string(n) + " positions, the cache holds " +
                            std::to_string(s.options.context_length));
  }
  const int64_t row_bytes = s.config.kv_dim() * static_cast<int64_t>(sizeof(uint16_t));
  for (int64_t l = 0; l < layers && n > 0; ++l) {
    const size_t to = static_cast<size_t>(l * s.kv_layer_elements()), from = static_cast<size_t>(l * stash.capacity_ * s.config.kv_dim());
    PETREL_RETURN_IF_ERROR(cuda::copy_on_device(s.keys.as<uint16_t>() + to, stash.buffers_->keys.as<uint16_t>() + from,
                                                static_cast<size_t>(n * row_bytes), s.stream.get()));
    PETREL_RETURN_IF_ERROR(cuda::copy_on_device(s.values.as<uint16_t>() + to, stash.buffers_->values.as<uint16_t>() + from,
                                                static_cast<size_t>(n * row_bytes), s.stream.get()));
  }
  PETREL_RETURN_IF_ERROR(with_context(s.stream.synchronize(), "bringing a session's KV cache back from its stash"));
  s.position = n;
  return ok_status();
}

const CudaInitTimes& CudaModel::init_times() const { return state_->init_times; }

bool CudaModel::resident_step() const { return state_->resident.size() > 0; }
bool CudaModel::prefill_f16_weights() const {
  for (const DeviceLayer& l : state_->layers) {
    if (l.q_proj.f16.data) return true;
  }
  return false;
}

int64_t CudaModel::device_bytes() const {
  const State& s = *state_;
  int64_t bytes = s.weight_bytes + static_cast<int64_t>(s.keys.size() + s.values.size());
  for (const cuda::DeviceBuffer* b : {&s.x, &s.normed, &s.q, &s.k, &s.v, &s.attn, &s.proj, &s.gate, &s.up, &s.logits,
                                      &s.attention_workspace}) {
    bytes += static_cast<int64_t>(b->size());
  }
  return bytes + s.prefill.bytes();
}

Result<std::unique_ptr<CudaModel>> CudaModel::create(const LlamaModel& model, const CudaModelOptions& options) {
  if (!cuda::built_with_cuda()) {
    return unsupported("the CUDA backend is not built (configure with nvcc available and -DPETREL_CUDA=ON)");
  }
  if (options.warm_copies_stream < CudaModelOptions::kWarmOwnStream ||
      options.warm_copies_stream > CudaModelOptions::kWarmLegacyStream) {
    return invalid_argument("warm_copies_stream " + std::to_string(options.warm_copies_stream) +
                            " is none of 0 (own), 1 (own, kept), 2 (the model's), 3 (legacy default)");
  }
  PETREL_ASSIGN_OR_RETURN(std::vector<cuda::DeviceInfo> devices, cuda::list_devices());
  if (devices.empty()) return unsupported("no CUDA device: " + cuda::no_device_reason());
  if (options.device < 0 || options.device >= static_cast<int>(devices.size())) {
    return invalid_argument("CUDA device " + std::to_string(options.device) + " does not exist (" +
                            std::to_string(devices.size()) + " found)");
  }
  const LlamaConfig& c = model.config();
  if (options.context_length <= 0) {
    return invalid_argument("context length " + std::to_string(options.context_length) + " must be positive");
  }
  if (c.head_dim % 2 != 0 || c.head_dim > cuda::kMaxHeadDim) {
    return unsupported("the CUDA token generator needs an even head_dim of at most " +
                       std::to_string(cuda::kMaxHeadDim) + ", the model has " + std::to_string(c.head_dim));
  }
  PETREL_RETURN_IF_ERROR(cuda::set_device(options.device));
  bool make_f16 = false;  // options.prefill_f16_weights, resolved
  {
    PETREL_ASSIGN_OR_RETURN(cuda::MemoryInfo memory, cuda::memory_info());
    const cuda::DeviceInfo& d = devices[options.device];
    const GpuMemoryNeed base = gpu_memory_need(model, options.context_length, options.prefill_chunk, false);
    const GpuMemoryNeed with_f16 = gpu_memory_need(model, options.context_length, options.prefill_chunk, true);
    const int64_t f16_bytes = with_f16.total() - base.total();
    switch (options.prefill_f16_weights) {
      case PrefillF16Weights::kOff: make_f16 = false; break;
      case PrefillF16Weights::kOn: make_f16 = f16_bytes > 0; break;
      case PrefillF16Weights::kAuto: make_f16 = f16_bytes > 0 && 2 * f16_bytes <= memory.free_bytes - base.total(); break;
    }
    PETREL_RETURN_IF_ERROR(check_gpu_memory(make_f16 ? with_f16 : base, memory.free_bytes, memory.total_bytes,
                                            "CUDA device " + std::to_string(d.index) + " (" + d.name + ")"));
  }

  auto state = std::make_unique<State>();
  State& s = *state;
  auto phase_start = std::chrono::steady_clock::now();
  // Milliseconds since the previous call (or since here), for CudaInitTimes.
  auto phase_ms = [&phase_start] {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - phase_start).count();
    phase_start = now;
    return ms;
  };
  s.config = c;
  s.options = options;
  // As Session does: a longer context than the model was trained for is clamped to max_position_embeddings.
  s.options.context_length = std::min(options.context_length, c.max_position_embeddings);
  {
    const cuda::DeviceInfo& d = devices[options.device];
    auto group_wise = [](const LinearWeight& lin) {
      return lin.kind == LinearWeight::Kind::kGptq && lin.gptq.group_size != lin.gptq.cols;
    };
    bool grouped = false, down_grouped = false;  // any group-wise 4-bit layer weights (q/k/v or gate/up; down)
    for (const LlamaLayerWeights& l : model.weights().layers) {
      grouped = grouped || group_wise(l.q_proj) || group_wise(l.gate_proj);
      down_grouped = down_grouped || group_wise(l.down_proj);
    }
    s.options.decode_tma_qkv_stages =
        resolve_tma_stages(options.decode_tma_qkv_stages, d.peak_memory_bandwidth, d.compute_major, grouped);
    s.options.decode_tma_gate_up_stages =
        resolve_tma_stages(options.decode_tma_gate_up_stages, d.peak_memory_bandwidth, d.compute_major, grouped);
    s.options.decode_tma_down_stages =
        resolve_tma_down_stages(options.decode_tma_down_stages, d.peak_memory_bandwidth, d.compute_major, down_grouped);
  }
  PETREL_ASSIGN_OR_RETURN(s.stream, cuda::CudaStream::create());
  PETREL_ASSIGN_OR_RETURN(s.gemv_workspace, cuda::GemvWorkspace::create());
  for (int i = 0; i < 2; ++i) {
    PETREL_ASSIGN_OR_RETURN(s.side_streams[i], cuda::CudaStream::create());
    PETREL_ASSIGN_OR_RETURN(s.side_workspaces[i], cuda::GemvWorkspace::create());
    PETREL_ASSIGN_OR_RETURN(s.join_events[i], cuda::CudaEvent::create());
  }
  PETREL_ASSIGN_OR_RETURN(s.fork_event, cuda::CudaEvent::create());
  if (options.time_steps) {
    PETREL_ASSIGN_OR_RETURN(s.step_start, cuda::CudaEvent::create_timed());
    PETREL_ASSIGN_OR_RETURN(s.step_end, cuda::CudaEvent::create_timed());
  }

  // Weights, in their stored layouts and dtypes.
  PETREL_ASSIGN_OR_RETURN(cuda::HostUploader up,
                          cuda::HostUploader::create(size_t{32} << 20, 3, std::clamp<int>(std::thread::hardware_concurrency(), 1, 8)));
  const LlamaWeights& w = model.weights();
  PETREL_ASSIGN_OR_RETURN(s.embed.table, upload_linear(w.embed_tokens, "model.embed_tokens", up));
  s.weight_bytes += s.embed.table.bytes();
  s.layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LlamaLayerWeights& hw = w.layers[l];
    DeviceLayer& dw = s.layers[l];
    PETREL_ASSIGN_OR_RETURN(dw.input_norm, upload_norm(hw.input_norm, p + "input_layernorm", up));
    PETREL_ASSIGN_OR_RETURN(dw.post_attn_norm, upload_norm(hw.post_attn_norm, p + "post_attention_layernorm", up));
    PETREL_ASSIGN_OR_RETURN(dw.q_proj, upload_linear(hw.q_proj, p + "self_attn.q_proj", up));
    PETREL_ASSIGN_OR_RETURN(dw.k_proj, upload_linear(hw.k_proj, p + "self_attn.k_proj", up));
    PETREL_ASSIGN_OR_RETURN(dw.v_proj, upload_linear(hw.v_proj, p + "self_attn.v_proj", up));
    PETREL_ASSIGN_OR_RETURN(dw.o_proj, upload_linear(hw.o_proj, p + "self_attn.o_proj", up));
    PETREL_ASSIGN_OR_RETURN(dw.gate_proj, upload_linear(hw.gate_proj, p + "mlp.gate_proj", up));
    PETREL_ASSIGN_OR_RETURN(dw.up_proj, upload_linear(hw.up_proj, p + "mlp.up_proj", up));
    PETREL_ASSIGN_OR_RETURN(dw.down_proj, upload_linear(hw.down_proj, p + "mlp.down_proj", up));
    s.weight_bytes += static_cast<int64_t>(dw.input_norm.storage.size() + dw.post_attn_norm.storage.size());
    for (const DeviceLinear* lin : {&dw.q_proj, &dw.k_proj, &dw.v_proj, &dw.o_proj, &dw.gate_proj, &dw.up_proj, &dw.down_proj}) {
      s.weight_bytes += lin->bytes();
    }
  }
  PETREL_ASSIGN_OR_RETURN(s.final_norm, upload_norm(w.final_norm, "model.norm", up));
  s.weight_bytes += static_cast<int64_t>(s.final_norm.storage.size());
  if (w.head_is_embedding()) {
    // transformers ties lm_head to the embedding: one copy on the device too
    s.lm_head.gptq = s.embed.table.gptq;
    if (s.embed.table.gptq) {
      s.lm_head.quantized = cuda::DeviceGptqWeights::borrow(s.embed.table.quantized.view());
    } else {
      s.lm_head.dense = s.embed.table.dense;
    }
  } else {
    PETREL_ASSIGN_OR_RETURN(s.lm_head, upload_linear(w.lm_head, "lm_head", up));
    s.weight_bytes += s.lm_head.bytes();
  }
  const std::vector<float> inv_freq = rope_inverse_frequencies(c.rope, c.head_dim);
  PETREL_ASSIGN_OR_RETURN(s.inv_freq, upload_bytes(inv_freq.data(), inv_freq.size() * 4, "RoPE inverse frequencies", up));
  PETREL_RETURN_IF_ERROR(with_context(up.finish(), "uploading the weights"));
  s.init_times.upload_ms = phase_ms();
  if (make_f16) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      DeviceLayer& dw = s.layers[l];
      for (DeviceLinear* lin : {&dw.q_proj, &dw.k_proj, &dw.v_proj, &dw.o_proj, &dw.gate_proj, &dw.up_proj, &dw.down_proj}) {
        if (!lin->gptq) continue;
        const cuda::DeviceGptqMatrix& q = lin->quantized.view();
        PETREL_ASSIGN_OR_RETURN(lin->f16_storage, cuda::DeviceBuffer::allocate(static_cast<size_t>(2 * q.rows * q.cols)));
        PETREL_RETURN_IF_ERROR(cuda::dequantize_gptq(q, lin->f16_storage.data(), s.stream.get()));
        lin->f16 = cuda::DeviceDenseMatrix{DType::kF16, q.rows, q.cols, lin->f16_storage.data()};
        s.weight_bytes += static_cast<int64_t>(lin->f16_storage.size());
      }
    }
    PETREL_RETURN_IF_ERROR(with_context(s.stream.synchronize(), "dequantizing the fp16 prefill weights"));
  }
  s.init_times.f16_copies_ms = phase_ms();

  // KV cache and activations.
  const size_t kv_bytes = static_cast<size_t>(c.num_hidden_layers * s.kv_layer_elements()) * 2;
  PETREL_ASSIGN_OR_RETURN(s.keys, cuda::DeviceBuffer::allocate(kv_bytes));
  PETREL_ASSIGN_OR_RETURN(s.values, cuda::DeviceBuffer::allocate(kv_bytes));
  auto floats = [](int64_t n) { return cuda::DeviceBuffer::allocate(static_cast<size_t>(n) * 4); };
  PETREL_ASSIGN_OR_RETURN(s.step_input, cuda::DeviceBuffer::allocate(2 * sizeof(int32_t)));
  PETREL_ASSIGN_OR_RETURN(s.x, floats(c.hidden_size));
  PETREL_ASSIGN_OR_RETURN(s.normed, floats(c.hidden_size));
  PETREL_ASSIGN_OR_RETURN(s.q, floats(c.q_dim()));
  PETREL_ASSIGN_OR_RETURN(s.k, floats(c.kv_dim()));
  PETREL_ASSIGN_OR_RETURN(s.v, floats(c.kv_dim()));
  PETREL_ASSIGN_OR_RETURN(s.attn, floats(c.q_dim()));
  PETREL_ASSIGN_OR_RETURN(s.proj, floats(c.hidden_size));
  PETREL_ASSIGN_OR_RETURN(s.gate, floats(c.intermediate_size));
  PETREL_ASSIGN_OR_RETURN(s.up, floats(c.intermediate_size));
  PETREL_ASSIGN_OR_RETURN(s.logits, floats(c.vocab_size));
  PETREL_ASSIGN_OR_RETURN(s.attention_workspace, floats(cuda::decode_attention_workspace_floats(s.attention_shape())));
  s.fused = options.fused_step && s.fused_step_applies();
  s.overlap = s.fused && options.overlap_kernels && devices[options.device].compute_major >= 9;
  if (s.fused) {
    PETREL_ASSIGN_OR_RETURN(s.attention_counters, cuda::DeviceBuffer::allocate(static_cast<size_t>(c.num_key_value_heads) * 4));
    PETREL_RETURN_IF_ERROR(s.attention_counters.fill_bytes(0));
  }
  if (s.overlap && options.resident_step) {
    // Where the chains do not fit (shapes, an older GPU), the five-launch step runs (resident_step() says which).
    cuda::ResidentGemvOptions resident_options;
    resident_options.min_unit_steps = options.resident_min_unit_steps;
    resident_options.tiled_copy = options.resident_tiled_copy;
    auto resident = cuda::ResidentGemvChains::create(s.resident_chains(), s.gemv_workspace.partial_capacity(), resident_options);
    if (resident.ok()) s.resident = std::move(*resident);
  }
  PETREL_ASSIGN_OR_RETURN(s.host_logits, cuda::PinnedBuffer::allocate(static_cast<size_t>(c.vocab_size) * 4));
  s.logits_mapped = options.logits_to_mapped_host && s.host_logits.device_data() != nullptr;
  PETREL_ASSIGN_OR_RETURN(s.host_input, cuda::PinnedBuffer::allocate(2 * sizeof(int32_t)));
  PETREL_ASSIGN_OR_RETURN(s.top_device, cuda::DeviceBuffer::allocate(kTopResultBytes + cuda::kTopKWorkspaceBytes));
  PETREL_ASSIGN_OR_RETURN(s.top_host, cuda::PinnedBuffer::allocate(sizeof(cuda::TopKResult)));
  PETREL_ASSIGN_OR_RETURN(s.allowed_host, cuda::PinnedBuffer::allocate(static_cast<size_t>((c.vocab_size + 31) / 32) * 4));
  PETREL_ASSIGN_OR_RETURN(s.allowed_device, cuda::DeviceBuffer::allocate(s.allowed_host.size()));
  if (options.prefill_chunk > 1) {
    State::Prefill& p = s.prefill;
    p.chunk = std::min(options.prefill_chunk, s.options.context_length);
    PETREL_ASSIGN_OR_RETURN(p.gemm, cuda::GemmWorkspace::create(kGemmScratchBytes));
    PETREL_ASSIGN_OR_RETURN(p.gemv, cuda::GemvWorkspace::create(kPrefillGemvPartials));
    p.batch = options.batch_prefill && s.batch_prefill_applies();
    PETREL_ASSIGN_OR_RETURN(p.tokens, cuda::DeviceBuffer::allocate(static_cast<size_t>(p.chunk) * 4));
    PETREL_ASSIGN_OR_RETURN(p.x, floats(p.chunk * c.hidden_size));
    PETREL_ASSIGN_OR_RETURN(p.normed, floats(p.chunk * c.hidden_size));
    PETREL_ASSIGN_OR_RETURN(p.proj, floats(p.chunk * c.hidden_size));
    PETREL_ASSIGN_OR_RETURN(p.q, floats(p.chunk * c.q_dim()));
    PETREL_ASSIGN_OR_RETURN(p.attn, floats(p.chunk * c.q_dim()));
    PETREL_ASSIGN_OR_RETURN(p.k, floats(p.chunk * c.kv_dim()));
    PETREL_ASSIGN_OR_RETURN(p.v, floats(p.chunk * c.kv_dim()));
    PETREL_ASSIGN_OR_RETURN(p.gate, floats(p.chunk * c.intermediate_size));
    PETREL_ASSIGN_OR_RETURN(p.up, floats(p.chunk * c.intermediate_size));
    PETREL_ASSIGN_OR_RETURN(p.attention_workspace,
                            cuda::DeviceBuffer::allocate(static_cast<size_t>(prefill_attention_bytes(c, p.chunk, s.options.context_length))));
  }
  PETREL_RETURN_IF_ERROR(cuda::synchronize());
  s.init_times.buffers_ms = phase_ms();
  auto gpu = std::unique_ptr<CudaModel>(new CudaModel(std::move(state)));
  if (options.warm_up) PETREL_RETURN_IF_ERROR(with_context(gpu->warm_up(), "warming up the CUDA model"));
  gpu->state_->init_times.warm_up_ms = phase_ms();
  PETREL_RETURN_IF_ERROR(with_context(warm_copies(options.warm_copies, options.warm_copies_stream, gpu->state_->stream.get(),
                                                     &gpu->state_->warm_stream),
                                         "the warm copies"));
  gpu->state_->init_times.warm_copies_ms = phase_ms();
  return gpu;
}

// The first launch of each kernel loads its module (CUDA's lazy loading: ~0.1-1 ms each), cuBLAS loads and
// picks kernels at its first products, and the decode graph is captured at the first step: together ~50 ms
// on the H200 that a first query would otherwise pay in its time to first token. Token 0, then forgotten.
Status CudaModel::warm_up() {
  State& s = *state_;
  std::vector<float> logits;
  if (s.prefill.chunk > 1) {
    // One prompt per kernel family: the batch GEMV's 1 to 4 n-tiles of 8 tokens (8, 16, 24, 32: a 29-token
    // chat turn runs the 4-tile kernels, which a first query would otherwise load in its time to first token),
    // the GEMM's token tiles 8 to 64 with 4 or 8 warps up to 160 tokens, dequantize + cuBLAS beyond; as long
    // as the chunk and the context allow.
    for (int64_t n : {8, 16, 24, 32, 48, 96, 160, 512}) {
      const int64_t m = std::min({n, s.prefill.chunk, s.options.context_length});
      if (m < 2) break;
      const std::vector<int32_t> zeros(static_cast<size_t>(m), 0);
      PETREL_RETURN_IF_ERROR(forward(zeros, LogitsMode::kLast, &logits));
      reset();
      if (m < n) break;
    }
  }
  PETREL_RETURN_IF_ERROR(decode(0, &logits));
  if (max_top_k(s.config) > 0) {  // and the top-k kernel's first launch
    TopLogits top;
    reset();
    PETREL_RETURN_IF_ERROR(decode_top(0, 1, &top));
  }
  reset();
  return ok_status();
}

// The checks of one decode step, its input and its launch (the step graph), without waiting for it.
Status CudaModel::start_decode(int32_t token, StepOutput output, int top_k) {
  State& s = *state_;
  const LlamaConfig& c = s.config;
  if (token < 0 || token >= c.vocab_size) {
    return invalid_argument("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size) + ")");
  }
  if (s.position >= s.options.context_length) {
    return out_of_range("Context Size was exceeded: " + std::to_string(s.position) + " positions used + 1 new token > context length " +
                        std::to_string(s.options.context_length));
  }
  // Every step waits for the one before it (each call synchronizes), so host_input is free to overwrite; the
  // step's graph copies it to the device first.
  int32_t* input = s.host_input.as<int32_t>();
  input[0] = token;
  input[1] = static_cast<int32_t>(s.position);
  if (!s.options.time_steps) return s.run_step(output, top_k);
  PETREL_RETURN_IF_ERROR(s.step_start.record(s.stream.get()));
  PETREL_RETURN_IF_ERROR(s.run_step(output, top_k));
  return s.step_end.record(s.stream.get());
}

double CudaModel::last_step_device_ms() const { return state_->step_device_ms; }

// After a decode step's synchronization: its GPU time (options.time_steps), and the position moved on.
Status CudaModel::finish_decode() {
  State& s = *state_;
  if (s.options.time_steps) {
    PETREL_ASSIGN_OR_RETURN(s.step_device_ms, cuda::CudaEvent::elapsed_ms(s.step_start, s.step_end));
  }
  ++s.position;
  return ok_status();
}

Status CudaModel::decode(int32_t token, std::vector<float>* logits) {
  if (logits) {
    PETREL_ASSIGN_OR_RETURN(std::span<const float> view, decode_logits(token));
    logits->assign(view.begin(), view.end());
    return ok_status();
  }
  PETREL_RETURN_IF_ERROR(start_decode(token, StepOutput::kNormed));
  PETREL_RETURN_IF_ERROR(with_context(state_->stream.synchronize(), "the CUDA decode step"));
  return finish_decode();
}

Result<std::span<const float>> CudaModel::decode_logits(int32_t token) {
  State& s = *state_;
  PETREL_RETURN_IF_ERROR(start_decode(token, StepOutput::kLogits));
  PETREL_RETURN_IF_ERROR(with_context(s.stream.synchronize(), "the CUDA decode step"));
  PETREL_RETURN_IF_ERROR(finish_decode());
  return std::span<const float>(s.host_logits.as<const float>(), static_cast<size_t>(s.config.vocab_size));
}

bool CudaModel::constraint_mask_on_device() const { return state_->options.constraint_mask_on_device; }
const CudaModelOptions& CudaModel::options() const { return state_->options; }

int resolve_tma_stages(int requested, int64_t peak_memory_bandwidth, int compute_major, bool grouped_weights) {
  if (requested != CudaModelOptions::kTmaAuto) return requested;
  if (compute_major < 9) return 0;  // no tensor copies
  return grouped_weights || peak_memory_bandwidth >= CudaModelOptions::kTmaAutoMinBandwidth ? 1 : 0;
}

int resolve_tma_down_stages(int requested, int64_t peak_memory_bandwidth, int compute_major, bool grouped_weights) {
  if (requested != CudaModelOptions::kTmaAuto) return requested;
  if (compute_major < 9) return 0;  // no tensor copies
  return grouped_weights && peak_memory_bandwidth >= CudaModelOptions::kTmaAutoMinBandwidth ? 1 : 0;
}

int CudaModel::max_top_k(const LlamaConfig& config) {
  return config.vocab_size <= cuda::kMaxDeviceTopKValues ? cuda::kMaxDeviceTopK : 0;
}

Status CudaModel::check_top_request(int k, const TopLogits* top) const {
  if (!top) return invalid_argument("top-k logits wanted but no output");
  const int most = max_top_k(state_->config);
  if (k < 1 || k > most || k > state_->config.vocab_size) {
    return invalid_argument("top-k logits: k " + std::to_string(k) + " outside 1 .. " + std::to_string(most) +
                            " for a vocabulary of " + std::to_string(state_->config.vocab_size));
  }
  return ok_status();
}

Status CudaModel::decode_top(int32_t token, int k, TopLogits* top) {
  PETREL_RETURN_IF_ERROR(check_top_request(k, top));
  // The graph's k largest, in order (value descending, id ascending), begin with the k wanted.
  const int graph_k = state_->top_graph_k();
  PETREL_RETURN_IF_ERROR(start_decode(token, StepOutput::kTop, graph_k));
  PETREL_RETURN_IF_ERROR(state_->read_top(graph_k, top));
  if (top->all.empty()) {
    top->values.resize(static_cast<size_t>(k));
    top->ids.resize(static_cast<size_t>(k));
  }
  return finish_decode();
}

Status CudaModel::decode_top_masked(int32_t token, int k, const std::function<void(std::span<uint32_t>)>& write_mask,
                                    TopLogits* top) {
  PETREL_RETURN_IF_ERROR(check_top_request(k, top));
  State& s = *state_;
  const int graph_k = s.top_graph_k();
  PETREL_RETURN_IF_ERROR(start_decode(token, StepOutput::kNormed));
  // The previous step's graphs have completed (every call synchronizes): the mask's host buffer is free.
  write_mask(std::span<uint32_t>(s.allowed_host.as<uint32_t>(), s.allowed_host.size() / 4));
  PETREL_RETURN_IF_ERROR(s.run_masked_head(graph_k));
  PETREL_RETURN_IF_ERROR(s.read_top(graph_k, top));
  if (top->all.empty()) {
    top->values.resize(static_cast<size_t>(k));
    top->ids.resize(static_cast<size_t>(k));
  }
  return finish_decode();
}

Status CudaModel::forward(std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>* logits) {
  if (mode != LogitsMode::kNone && !logits) return invalid_argument("forward: logits wanted but no output vector");
  return run_forward(tokens, mode, logits, 0, nullptr);
}

Status CudaModel::forward_top(std::span<const int32_t> tokens, int k, TopLogits* top) {
  PETREL_RETURN_IF_ERROR(check_top_request(k, top));
  return run_forward(tokens, LogitsMode::kNone, nullptr, k, top);
}

Status CudaModel::run_forward(std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>* logits, int top_k,
                              TopLogits* top) {
  const State& s = *state_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return invalid_argument("forward: no tokens");
  if (n > s.options.context_length - s.position) {
    return out_of_range("Context Size was exceeded: " + std::to_string(s.position) + " positions used + " +
                        std::to_string(n) + " new tokens > context length " + std::to_string(s.options.context_length));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= s.config.vocab_size) {
      return invalid_argument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(s.config.vocab_size) + ")");
    }
  }
  if (logits) logits->clear();
  if (n > 1 && s.prefill.chunk > 1) {
    State& m = *state_;
    int64_t done = 0;
    while (done < n) {
      const int64_t take = m.prefill_tokens_at(m.position, n - done);
      const bool last = done + take == n;
      std::vector<float>* out = mode == LogitsMode::kAll || (mode == LogitsMode::kLast && last) ? logits : nullptr;
      const int chunk_top = last ? top_k : 0;
      if (take == 1) {
        // A lone token (a prompt one longer than a multiple of the chunk) goes through the decode step.
        std::vector<float> step;
        if (chunk_top > 0) {
          PETREL_RETURN_IF_ERROR(decode_top(tokens[done], chunk_top, top));
        } else {
          PETREL_RETURN_IF_ERROR(decode(tokens[done], out ? &step : nullptr));
        }
        if (out) out->insert(out->end(), step.begin(), step.end());
      } else {
        PETREL_RETURN_IF_ERROR(m.prefill_chunk(tokens.data() + done, take, mode == LogitsMode::kAll, out, chunk_top, top));
      }
      done += take;
    }
    return ok_status();
  }
  std::vector<float> step;
  for (int64_t i = 0; i < n; ++i) {
    if (top_k > 0 && i == n - 1) return decode_top(tokens[i], top_k, top);
    const bool want = mode == LogitsMode::kAll || (mode == LogitsMode::kLast && i == n - 1);
    PETREL_RETURN_IF_ERROR(decode(tokens[i], want ? &step : nullptr));
    if (want) logits->insert(logits->end(), step.begin(), step.end());
  }
  return ok_status();
}

}  // namespace petrel
