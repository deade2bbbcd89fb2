#include "petrel/quant/quantize_checkpoint.h"

#include <cblas.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <memory>

#include <nlohmann/json.hpp>

#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors.h"
#include "petrel/io/safetensors_writer.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/model/rope.h"
#include "petrel/quant/gptq_cuda.h"
#include "petrel/util/file.h"
#include "petrel/util/progress.h"

namespace petrel::quant {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const char* method_name(QuantMethod method) { return method == QuantMethod::kRtn ? "rtn" : "gptq"; }

bool more_bits_layer(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

const char* device_name(QuantDevice device) {
  switch (device) {
    case QuantDevice::kAuto: return "auto";
    case QuantDevice::kCpu: return "cpu";
    case QuantDevice::kCuda: return "cuda";
  }
  return "?";
}

namespace {

const char* kLinearNames[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                              "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// "model.layers.3.mlp.down_proj" as a regex that matches only itself (GPTQModel's `dynamic` keys are regexes).
std::string exact_regex(const std::string& name) {
  std::string out;
  for (char ch : name) {
    if (ch == '.') out += "\\.";
    else out += ch;
  }
  return out;
}

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(v.num_elements());
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) out[i] = v.element(i);
  return out;
}

// y[n, out] = x[n, in] * w[out, in]^T
void gemm_xwt(const float* x, int64_t n, const std::vector<float>& w, int64_t out, int64_t in, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out), static_cast<int>(in),
              1.0f, x, static_cast<int>(in), w.data(), static_cast<int>(in), 0.0f, y, static_cast<int>(out));
}

void dequantize_into(const QuantizedMatrix& q, std::vector<float>& w) {
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) w[r * q.cols + c] = q.dequantized(r, c);
}

void add_gptq_specs(std::vector<TensorSpec>& specs, const std::string& name, int64_t out, int64_t in,
                    const QuantScheme& scheme) {
  const int64_t groups = in / scheme.effective_group_size(in);
  specs.push_back({name + ".qweight", DType::kI32, {in * scheme.bits / 32, out}});
  specs.push_back({name + ".qzeros", DType::kI32, {groups, out * scheme.bits / 32}});
  specs.push_back({name + ".scales", DType::kF16, {groups, out}});
  specs.push_back({name + ".g_idx", DType::kI32, {in}});
}

Status write_gptq(ShardedSafetensorsWriter& writer, const std::string& name, const GptqTensors& t) {
  PETREL_RETURN_IF_ERROR(writer.write_tensor(name + ".qweight", t.qweight.data(), t.qweight.size() * 4));
  PETREL_RETURN_IF_ERROR(writer.write_tensor(name + ".qzeros", t.qzeros.data(), t.qzeros.size() * 4));
  PETREL_RETURN_IF_ERROR(writer.write_tensor(name + ".scales", t.scales.data(), t.scales.size() * 2));
  return writer.write_tensor(name + ".g_idx", t.g_idx.data(), t.g_idx.size() * 4);
}

// RTN in slices of rows so that a 128k-row LM head never needs its whole float copy.
Result<GptqTensors> rtn_streaming(const TensorView& v, const QuantScheme& scheme) {
  const int64_t rows = v.shape[0], cols = v.shape[1];
  PETREL_ASSIGN_OR_RETURN(GptqTensors t, allocate_gptq(rows, cols, scheme));
  const int64_t per_word = 32 / scheme.bits;
  const int64_t slice_rows = std::max<int64_t>(per_word, (int64_t{1} << 24) / cols / per_word * per_word);
  std::vector<float> slice;
  for (int64_t r0 = 0; r0 < rows; r0 += slice_rows) {
    const int64_t n = std::min(slice_rows, rows - r0);
    slice.resize(n * cols);
    for (int64_t i = 0; i < n * cols; ++i) slice[i] = v.element(r0 * cols + i);
    PETREL_RETURN_IF_ERROR(pack_rows(quantize_rtn(slice.data(), n, cols, scheme), r0, t));
  }
  return t;
}

// Copies a tensor unchanged (norms, the embedding).
Status copy_tensor(ShardedSafetensorsWriter& writer, const SafetensorsCheckpoint& ckpt, const std::string& name) {
  PETREL_ASSIGN_OR_RETURN(TensorView v, ckpt.tensor(name));
  PETREL_RETURN_IF_ERROR(writer.write_tensor(name, v.data, v.num_bytes));
  ckpt.release(v);
  return ok_status();
}

// Calibration state of GPTQ: the residual stream of every sample entering the current layer.
struct Calibration {
  int64_t n_samples = 0, seq_len = 0, hidden = 0;
  std::vector<float> x;  // [n_samples, seq_len, hidden]
  float* sample(int64_t s) { return x.data() + s * seq_len * hidden; }
};

// The float weights of one decoder layer, replaced by their dequantized values as GPTQ proceeds.
struct FloatLayer {
  std::vector<float> input_norm, post_norm;
  std::vector<float> w[7];  // in kLinearNames order
};

ref::DenseMatrix norm_matrix(const std::vector<float>& v) {
  return ref::DenseMatrix{DType::kF32, 1, static_cast<int64_t>(v.size()), v.data()};
}

}  // namespace

Status quantize_checkpoint(const fs::path& source, const fs::path& out, const QuantizeOptions& options,
                           QuantizeReport* report) {
  const auto start = std::chrono::steady_clock::now();
  PETREL_ASSIGN_OR_RETURN(LlamaConfig c, load_llama_config(source));
  if (c.quantization) return invalid_argument(source.string() + ": already quantized (quantization_config is set)");
  PETREL_ASSIGN_OR_RETURN(std::string config_text, read_text_file(source / "config.json"));
  ojson config_json = ojson::parse(config_text, nullptr, false);
  PETREL_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(source));
  std::error_code ec;
  if (fs::exists(out, ec) && !options.overwrite) return invalid_argument(out.string() + ": already exists (pass --force to replace it)");
  if (fs::equivalent(source, out, ec)) return invalid_argument("the output directory is the source checkpoint");

  const int64_t h = c.hidden_size, ffn = c.intermediate_size;
  const int64_t out_features[7] = {c.q_dim(), c.kv_dim(), c.kv_dim(), h, ffn, ffn, h};
  const int64_t in_features[7] = {h, h, h, c.q_dim(), h, h, ffn};
  for (int i = 0; i < 7; ++i) {
    PETREL_RETURN_IF_ERROR(validate_scheme(options.scheme, in_features[i], kLinearNames[i]));
  }
  if (options.quantize_lm_head) PETREL_RETURN_IF_ERROR(validate_scheme(options.lm_head_scheme, h, "lm_head"));
  // Each decoder linear's scheme: the layers' default, or more bits where asked (more_bits_modules).
  bool more_bits_of[7] = {};
  for (const std::string& m : options.more_bits_modules) {
    bool known = false;
    for (int i = 0; i < 7; ++i) {
      const std::string full = kLinearNames[i];
      if (full.substr(full.find('.') + 1) == m) more_bits_of[i] = known = true;
    }
    if (!known) return invalid_argument("--more-bits: '" + m + "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  }
  QuantScheme more_scheme = options.scheme;
  more_scheme.bits = options.more_bits;
  auto scheme_for = [&](int64_t layer, int i) -> const QuantScheme& {
    return more_bits_of[i] && more_bits_layer(layer, c.num_hidden_layers) ? more_scheme : options.scheme;
  };
  if (!options.more_bits_modules.empty()) {
    if (options.more_bits <= options.scheme.bits) {
      return invalid_argument("--more-bits needs more bits than the layers' " + std::to_string(options.scheme.bits));
    }
    for (int i = 0; i < 7; ++i) PETREL_RETURN_IF_ERROR(validate_scheme(more_scheme, in_features[i], kLinearNames[i]));
  }
  if (options.quantize_embedding) {
    PETREL_RETURN_IF_ERROR(validate_scheme(options.embedding_scheme, h, "model.embed_tokens"));
    if (c.vocab_size % (32 / options.embedding_scheme.bits) != 0) {
      return invalid_argument("model.embed_tokens: the vocabulary (" + std::to_string(c.vocab_size) +
                              ") is not a multiple of " + std::to_string(32 / options.embedding_scheme.bits) +
                              ", which GPTQ's zero-point packing needs");
    }
    if (c.tie_word_embeddings && !options.quantize_lm_head) {
      return invalid_argument("quantizing the embedding of a tied model needs a quantized LM head too (the float "
                              "head would be the quantized table); leave --embedding-bits at 16 or quantize the head");
    }
  }
  const bool gptq = options.method == QuantMethod::kGptq;
  if (options.device == QuantDevice::kCuda && !cuda_gptq_available()) {
    return unsupported("quantize on CUDA: " + cuda_gptq_unavailable_reason() + " (use --device cpu)");
  }
  const bool use_cuda = gptq && (options.device == QuantDevice::kCuda ||
                                 (options.device == QuantDevice::kAuto && cuda_gptq_available()));

  // The output tensor list, in the order it is produced.
  std::vector<TensorSpec> specs;
  PETREL_ASSIGN_OR_RETURN(TensorView embed, ckpt.tensor("model.embed_tokens.weight", {c.vocab_size, h}));
  if (options.quantize_embedding) {
    add_gptq_specs(specs, "model.embed_tokens", c.vocab_size, h, options.embedding_scheme);
  } else {
    specs.push_back({"model.embed_tokens.weight", embed.dtype, embed.shape});
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
      PETREL_ASSIGN_OR_RETURN(TensorView v, ckpt.tensor(p + norm, {h}));
      specs.push_back({p + norm, v.dtype, v.shape});
    }
    for (int i = 0; i < 7; ++i) {
      PETREL_ASSIGN_OR_RETURN(TensorView v, ckpt.tensor(p + kLinearNames[i] + ".weight", {out_features[i], in_features[i]}));
      (void)v;
      add_gptq_specs(specs, p + kLinearNames[i], out_features[i], in_features[i], scheme_for(l, i));
    }
  }
  PETREL_ASSIGN_OR_RETURN(TensorView final_norm, ckpt.tensor("model.norm.weight", {h}));
  specs.push_back({"model.norm.weight", final_norm.dtype, final_norm.shape});
  const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  PETREL_ASSIGN_OR_RETURN(TensorView head, ckpt.tensor(head_name, {c.vocab_size, h}));
  if (options.quantize_lm_head) {
    add_gptq_specs(specs, "lm_head", c.vocab_size, h, options.lm_head_scheme);
  } else if (!c.tie_word_embeddings) {
    specs.push_back({"lm_head.weight", head.dtype, head.shape});
  }

  // The embedding, quantized first when asked, so that GPTQ calibrates on the table the model will use.
  GptqTensors embed_q;
  if (options.quantize_embedding) {
    PETREL_ASSIGN_OR_RETURN(embed_q, rtn_streaming(embed, options.embedding_scheme));
  }
  const ref::DenseMatrix embed_float{embed.dtype, c.vocab_size, h, embed.data};
  const ref::GptqMatrix embed_codes = options.quantize_embedding ? embed_q.view() : ref::GptqMatrix{};
  auto embed_rows = [&](std::span<const int32_t> tokens, float* x) {
    if (options.quantize_embedding) ref::embedding_lookup(embed_codes, tokens, x);
    else ref::embedding_lookup(embed_float, tokens, x);
  };

  // Calibration (GPTQ): token windows, embedded (in host memory, or in device memory on CUDA).
  Calibration calib;
  std::unique_ptr<CudaCalibration> gpu;
  std::vector<float> rope_cos, rope_sin;
  if (gptq) {
    PETREL_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(source));
    PETREL_ASSIGN_OR_RETURN(auto samples, load_calibration_samples(tokenizer, options.calibration));
    calib.n_samples = static_cast<int64_t>(samples.size());
    calib.seq_len = options.calibration.seq_len;
    calib.hidden = h;
    for (const auto& sample : samples) {
      for (int32_t id : sample) {
        if (id < 0 || id >= c.vocab_size) return invalid_data("calibration token " + std::to_string(id) + " is outside the model's vocabulary");
      }
    }
    const auto inv_freq = rope_inverse_frequencies(c.rope, c.head_dim);
    rope_cos.resize(calib.seq_len * c.head_dim / 2);
    rope_sin.resize(rope_cos.size());
    rope_cos_sin(inv_freq, 0, calib.seq_len, rope_cos.data(), rope_sin.data());
    if (use_cuda) {
      PETREL_ASSIGN_OR_RETURN(gpu, CudaCalibration::create(c, samples, embed_rows, rope_cos, rope_sin));
    } else {
      calib.x.resize(calib.n_samples * calib.seq_len * h);
      for (int64_t s = 0; s < calib.n_samples; ++s) embed_rows(samples[s], calib.sample(s));
    }
  }

  PETREL_ASSIGN_OR_RETURN(auto staging, StagingDirectory::create(out));
  const fs::path tmp = staging->path();
  PETREL_ASSIGN_OR_RETURN(auto writer, ShardedSafetensorsWriter::create(tmp, specs, options.max_shard_bytes));

  const int64_t n_layers = options.max_layers >= 0 ? std::min(options.max_layers, c.num_hidden_layers) : c.num_hidden_layers;
  // Progress in units of "linear layers done": 7 per decoder layer plus the LM head.
  ProgressBar progress(std::string("quantize ") + method_name(options.method), 7.0 * n_layers + 1, options.show_progress);
  if (options.quantize_embedding) {
    PETREL_RETURN_IF_ERROR(write_gptq(*writer, "model.embed_tokens", embed_q));
    embed_q = GptqTensors{};  // calibration has embedded its windows
  } else {
    PETREL_RETURN_IF_ERROR(copy_tensor(*writer, ckpt, "model.embed_tokens.weight"));
  }

  const int64_t T = calib.seq_len;
  std::vector<float> normed, q, k, v, attn, proj, gate, up;
  std::vector<float> x2;  // residual after attention, all samples
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    PETREL_RETURN_IF_ERROR(copy_tensor(*writer, ckpt, p + "input_layernorm.weight"));
    PETREL_RETURN_IF_ERROR(copy_tensor(*writer, ckpt, p + "post_attention_layernorm.weight"));
    auto note = [&](int i) { return "layer " + std::to_string(l + 1) + "/" + std::to_string(n_layers) + " " + kLinearNames[i]; };
    if (!gptq) {
      for (int i = 0; i < 7; ++i) {
        progress.update(7.0 * l + i, note(i));
        PETREL_ASSIGN_OR_RETURN(TensorView w, ckpt.tensor(p + kLinearNames[i] + ".weight"));
        PETREL_ASSIGN_OR_RETURN(GptqTensors t, rtn_streaming(w, scheme_for(l, i)));
        ckpt.release(w);
        PETREL_RETURN_IF_ERROR(write_gptq(*writer, p + kLinearNames[i], t));
      }
      continue;
    }
    if (gpu) {  // GPTQ on CUDA: the same flow as below, with the activations in device memory.
      std::array<TensorView, 7> weights;
      for (int i = 0; i < 7; ++i) {
        PETREL_ASSIGN_OR_RETURN(weights[i], ckpt.tensor(p + kLinearNames[i] + ".weight"));
      }
      PETREL_ASSIGN_OR_RETURN(TensorView in_norm, ckpt.tensor(p + "input_layernorm.weight"));
      PETREL_ASSIGN_OR_RETURN(TensorView post_norm, ckpt.tensor(p + "post_attention_layernorm.weight"));
      std::array<QuantScheme, 7> schemes;
      for (int i = 0; i < 7; ++i) schemes[static_cast<size_t>(i)] = scheme_for(l, i);
      PETREL_RETURN_IF_ERROR(gpu->quantize_layer(
          weights, in_norm, post_norm, schemes, options.gptq, p, kLinearNames,
          [&](int i) { progress.update(7.0 * l + i, note(i)); },
          [&](int i, const QuantizedMatrix& q) -> Status {
            PETREL_ASSIGN_OR_RETURN(GptqTensors t, pack_gptq(q));
            return write_gptq(*writer, p + kLinearNames[i], t);
          }));
      for (const TensorView& w : weights) ckpt.release(w);
      continue;
    }

    // GPTQ, true sequential within the layer.
    FloatLayer layer;
    for (int i = 0; i < 7; ++i) {
      PETREL_ASSIGN_OR_RETURN(TensorView w, ckpt.tensor(p + kLinearNames[i] + ".weight"));
      layer.w[i] = to_f32(w);
      ckpt.release(w);
    }
    PETREL_ASSIGN_OR_RETURN(TensorView in_norm, ckpt.tensor(p + "input_layernorm.weight"));
    PETREL_ASSIGN_OR_RETURN(TensorView post_norm, ckpt.tensor(p + "post_attention_layernorm.weight"));
    layer.input_norm = to_f32(in_norm);
    layer.post_norm = to_f32(post_norm);
    const float eps = static_cast<float>(c.rms_norm_eps);
    normed.resize(T * h);
    q.resize(T * c.q_dim());
    k.resize(T * c.kv_dim());
    v.resize(T * c.kv_dim());
    attn.resize(T * c.q_dim());
    proj.resize(T * h);
    gate.resize(T * ffn);
    up.resize(T * ffn);
    x2.resize(calib.x.size());

    auto quantize_group = [&](std::initializer_list<int> linears, HessianAccumulator& acc) -> Status {
      const std::vector<double> hessian = acc.to_matrix();
      for (int i : linears) {
        progress.update(7.0 * l + i, note(i));
        auto result = quantize_gptq(layer.w[i], out_features[i], in_features[i], hessian, scheme_for(l, i), options.gptq);
        if (!result.ok()) return result.status().with_context(p + kLinearNames[i]);
        PETREL_ASSIGN_OR_RETURN(GptqTensors t, pack_gptq(*result));
        PETREL_RETURN_IF_ERROR(write_gptq(*writer, p + kLinearNames[i], t));
        dequantize_into(*result, layer.w[i]);
      }
      return ok_status();
    };
    auto attention_of = [&](float* x) {  // normed, q/k/v, rope, attention -> attn [T, q_dim]
      ref::rms_norm(x, T, h, norm_matrix(layer.input_norm), eps, normed.data());
      gemm_xwt(normed.data(), T, layer.w[0], c.q_dim(), h, q.data());
      gemm_xwt(normed.data(), T, layer.w[1], c.kv_dim(), h, k.data());
      gemm_xwt(normed.data(), T, layer.w[2], c.kv_dim(), h, v.data());
      ref::apply_rope(q.data(), T, c.num_attention_heads, c.head_dim, rope_cos.data(), rope_sin.data());
      ref::apply_rope(k.data(), T, c.num_key_value_heads, c.head_dim, rope_cos.data(), rope_sin.data());
      ref::attention(q.data(), k.data(), v.data(), T, 0, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     attn.data());
    };
    auto mlp_input_of = [&](const float* x_after_attn) {  // normed2 -> gate/up -> silu(gate) * up in gate
      ref::rms_norm(x_after_attn, T, h, norm_matrix(layer.post_norm), eps, normed.data());
      gemm_xwt(normed.data(), T, layer.w[4], ffn, h, gate.data());
      gemm_xwt(normed.data(), T, layer.w[5], ffn, h, up.data());
      ref::silu_mul(gate.data(), up.data(), T * ffn, gate.data());
    };

    {  // 1. q, k, v from the normed layer input.
      HessianAccumulator acc(h);
      for (int64_t s = 0; s < calib.n_samples; ++s) {
        ref::rms_norm(calib.sample(s), T, h, norm_matrix(layer.input_norm), eps, normed.data());
        acc.add(normed.data(), T);
      }
      PETREL_RETURN_IF_ERROR(quantize_group({0, 1, 2}, acc));
    }
    {  // 2. o from the attention output of the quantized q, k, v.
      HessianAccumulator acc(c.q_dim());
      for (int64_t s = 0; s < calib.n_samples; ++s) {
        attention_of(calib.sample(s));
        acc.add(attn.data(), T);
      }
      PETREL_RETURN_IF_ERROR(quantize_group({3}, acc));
    }
    {  // 3. gate, up from the normed residual after the quantized attention block (kept in x2).
      HessianAccumulator acc(h);
      for (int64_t s = 0; s < calib.n_samples; ++s) {
        attention_of(calib.sample(s));
        gemm_xwt(attn.data(), T, layer.w[3], h, c.q_dim(), proj.data());
        float* x2s = x2.data() + s * T * h;
        const float* xs = calib.sample(s);
        for (int64_t i = 0; i < T * h; ++i) x2s[i] = xs[i] + proj[i];
        ref::rms_norm(x2s, T, h, norm_matrix(layer.post_norm), eps, normed.data());
        acc.add(normed.data(), T);
      }
      PETREL_RETURN_IF_ERROR(quantize_group({4, 5}, acc));
    }
    {  // 4. down from silu(gate) * up of the quantized gate and up.
      HessianAccumulator acc(ffn);
      for (int64_t s = 0; s < calib.n_samples; ++s) {
        mlp_input_of(x2.data() + s * T * h);
        acc.add(gate.data(), T);
      }
      PETREL_RETURN_IF_ERROR(quantize_group({6}, acc));
    }
    // 5. The quantized layer's output is the next layer's input.
    for (int64_t s = 0; s < calib.n_samples; ++s) {
      const float* x2s = x2.data() + s * T * h;
      mlp_input_of(x2s);
      gemm_xwt(gate.data(), T, layer.w[6], h, ffn, proj.data());
      float* xs = calib.sample(s);
      for (int64_t i = 0; i < T * h; ++i) xs[i] = x2s[i] + proj[i];
    }
  }
  if (report) {
    report->device = use_cuda ? QuantDevice::kCuda : QuantDevice::kCpu;
    report->layers_done = n_layers;
    report->calibration_tokens = calib.n_samples * calib.seq_len;
  }
  if (n_layers < c.num_hidden_layers) {  // a timing run: nothing is written
    progress.finish(std::to_string(n_layers) + " layers (timing run, no output written)");
    if (report) {
      report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report->seconds_per_layer = report->seconds / std::max<int64_t>(n_layers, 1);
    }
    return ok_status();
  }

  PETREL_RETURN_IF_ERROR(copy_tensor(*writer, ckpt, "model.norm.weight"));
  progress.update(7.0 * n_layers, "lm_head");
  if (options.quantize_lm_head) {
    GptqTensors t;
    if (gpu) {
      auto result = gpu->quantize_head(final_norm, head, options.lm_head_scheme, options.gptq);
      if (!result.ok()) return result.status().with_context("lm_head");
      gpu.reset();
      PETREL_ASSIGN_OR_RETURN(t, pack_gptq(*result));
    } else if (gptq) {
      HessianAccumulator acc(h);
      std::vector<float> norm = to_f32(final_norm);
      normed.resize(T * h);
      for (int64_t s = 0; s < calib.n_samples; ++s) {
        ref::rms_norm(calib.sample(s), T, h, norm_matrix(norm), static_cast<float>(c.rms_norm_eps), normed.data());
        acc.add(normed.data(), T);
      }
      calib.x.clear();
      calib.x.shrink_to_fit();
      auto result = quantize_gptq(to_f32(head), c.vocab_size, h, acc.to_matrix(), options.lm_head_scheme, options.gptq);
      if (!result.ok()) return result.status().with_context("lm_head");
      PETREL_ASSIGN_OR_RETURN(t, pack_gptq(*result));
    } else {
      PETREL_ASSIGN_OR_RETURN(t, rtn_streaming(head, options.lm_head_scheme));
    }
    ckpt.release(head);
    PETREL_RETURN_IF_ERROR(write_gptq(*writer, "lm_head", t));
  } else if (!c.tie_word_embeddings) {
    PETREL_RETURN_IF_ERROR(copy_tensor(*writer, ckpt, "lm_head.weight"));
  }
  PETREL_RETURN_IF_ERROR(writer->finish());

  // config.json: the source's, with quantization_config (and an untied head when the head is quantized).
  ojson qc;
  qc["quant_method"] = "gptq";
  qc["bits"] = options.scheme.bits;
  qc["group_size"] = options.scheme.group_size <= 0 ? -1 : options.scheme.group_size;
  qc["desc_act"] = false;
  qc["sym"] = options.scheme.symmetric;
  qc["checkpoint_format"] = "gptq";
  qc["lm_head"] = options.quantize_lm_head;
  // GPTQModel / vLLM per-module overrides: the LM head (and petrel's quantized embedding) have their own bits
  // and group size.
  auto override_of = [](const QuantScheme& s) {
    return ojson{{"bits", s.bits}, {"group_size", s.group_size <= 0 ? -1 : s.group_size}, {"sym", s.symmetric}};
  };
  if (options.quantize_lm_head) qc["dynamic"]["+:lm_head"] = override_of(options.lm_head_scheme);
  if (options.quantize_embedding) qc["dynamic"]["+:model.embed_tokens"] = override_of(options.embedding_scheme);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int i = 0; i < 7; ++i) {
      if (&scheme_for(l, i) == &more_scheme) {
        qc["dynamic"]["+:" + exact_regex("model.layers." + std::to_string(l) + "." + kLinearNames[i])] = override_of(more_scheme);
      }
    }
  }
  ojson recipe;
  recipe["method"] = method_name(options.method);
  recipe["scheme"] = options.scheme.to_string();
  recipe["clip_search"] = options.scheme.clip_search;
  recipe["lm_head"] = options.quantize_lm_head ? options.lm_head_scheme.to_string() : "unquantized";
  if (!options.more_bits_modules.empty()) {
    recipe["more_bits"] = {{"modules", options.more_bits_modules}, {"scheme", more_scheme.to_string()},
                           {"layers", "llama.cpp use_more_bits: first and last eighth, every third between"}};
  }
  recipe["embedding"] = options.quantize_embedding ? options.embedding_scheme.to_string() + " rtn"
                                                   : std::string(dtype_name(embed.dtype));
  if (gptq) {
    std::vector<std::string> files;
    for (const auto& f : options.calibration.files) files.push_back(f.filename().string());
    recipe["calibration"] = {{"files", files}, {"fraction", options.calibration.fraction},
                             {"num_samples", options.calibration.num_samples},
                             {"seq_len", options.calibration.seq_len}, {"seed", options.calibration.seed}};
    recipe["damp_percent"] = options.gptq.damp_percent;
    recipe["block_size"] = options.gptq.block_size;
    recipe["device"] = use_cuda ? "cuda" : "cpu";
  }
  recipe["source"] = fs::absolute(source).lexically_normal().string();
  recipe["petrel_version"] = PETREL_VERSION;
  qc["petrel"] = recipe;
  config_json["quantization_config"] = qc;
  if (options.quantize_lm_head && c.tie_word_embeddings) config_json["tie_word_embeddings"] = false;
  PETREL_RETURN_IF_ERROR(write_file_atomic(tmp / "config.json", config_json.dump(2) + "\n"));
  for (const char* file : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                           "special_tokens_map.json"}) {
    if (fs::exists(source / file, ec)) {
      fs::copy_file(source / file, tmp / file, fs::copy_options::overwrite_existing, ec);
      if (ec) return io_error("cannot copy " + (source / file).string() + ": " + ec.message());
    }
  }
  PETREL_RETURN_IF_ERROR(staging->commit());
  progress.finish(out.string());
  if (report) {
    report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report->seconds_per_layer = report->seconds / std::max<int64_t>(n_layers, 1);
    for (const auto& e : fs::directory_iterator(out, ec))
      if (e.is_regular_file()) report->output_bytes += e.file_size();
  }
  return ok_status();
}

}  // namespace petrel::quant
