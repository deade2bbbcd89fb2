#include "petrel/quant/gptq_cuda.h"

#include <algorithm>

#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gptq.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/ref/ops.h"

namespace petrel::quant {

namespace {

// Calibration tokens per forward chunk: the GEMMs are large enough to run near cuBLAS's peak (m = 32768 is the
// default 128 x 256 calibration in one chunk) while the chunk's activations stay a few GB (Llama-3.1-8B's
// gate and up: 2 x 32768 x 14336 floats = 3.8 GB).
constexpr int64_t kChunkTokens = 32768;
// Device staging for weights uploaded in their stored dtype, before widening.
constexpr size_t kStagingBytes = size_t{64} << 20;

Result<cuda::DeviceBuffer> allocate(size_t bytes, const std::string& what) {
  auto buffer = cuda::DeviceBuffer::allocate(bytes);
  if (!buffer.ok()) return buffer.status().with_context(what);
  return buffer;
}

cuda::GptqGrid grid_of(const QuantScheme& scheme) {
  return cuda::GptqGrid{scheme.bits, scheme.group_size, scheme.symmetric, scheme.clip_search};
}

Result<CudaGptqInverse> inverse_from_f64(CudaGptqContext& context, cuda::DeviceBuffer& h, int64_t cols,
                                         const GptqOptions& options, const std::string& what) {
  CudaGptqInverse inverse;
  inverse.cols = cols;
  PETREL_ASSIGN_OR_RETURN(inverse.u, allocate(static_cast<size_t>(cols) * cols * sizeof(float), what + ": GPTQ inverse"));
  PETREL_ASSIGN_OR_RETURN(inverse.dead, allocate(static_cast<size_t>(cols), what + ": GPTQ dead-input mask"));
  PETREL_ASSIGN_OR_RETURN(cuda::GptqInverseReport r,
                          cuda::gptq_inverse_factor(h.as<double>(), cols, options.damp_percent, inverse.u.as<float>(),
                                                    inverse.dead.as<uint8_t>(), context.solver(), nullptr, what));
  inverse.report.damp_used = r.damp_used;
  inverse.report.dead_columns = r.dead_columns;
  return inverse;
}

// Uploads a tensor in its stored dtype through `staging` and widens it into out[num_elements] (float32).
Status upload_widened(const TensorView& v, cuda::DeviceBuffer& staging, float* out) {
  const size_t element = dtype_size(v.dtype);
  const size_t slice = staging.size() / element * element;
  const auto* bytes = static_cast<const uint8_t*>(v.data);
  for (size_t offset = 0; offset < v.num_bytes; offset += slice) {
    const size_t n = std::min(slice, v.num_bytes - offset);
    PETREL_RETURN_IF_ERROR(staging.upload(bytes + offset, n).with_context(v.name));
    PETREL_RETURN_IF_ERROR(cuda::widen_to_f32(staging.data(), v.dtype, static_cast<int64_t>(n / element),
                                              out + offset / element).with_context(v.name));
  }
  return ok_status();
}

// A norm weight uploaded as stored (the kernels widen it).
Result<cuda::DeviceBuffer> upload_vector(const TensorView& v) {
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer buffer, allocate(v.num_bytes, v.name));
  PETREL_RETURN_IF_ERROR(buffer.upload(v.data, v.num_bytes).with_context(v.name));
  return buffer;
}

}  // namespace

bool cuda_gptq_available() {
  auto devices = cuda::list_devices();
  return devices.ok() && !devices->empty();
}

std::string cuda_gptq_unavailable_reason() {
  if (!cuda::built_with_cuda()) return "this petrel was built without the CUDA backend";
  auto devices = cuda::list_devices();
  if (!devices.ok()) return devices.status().message();
  return devices->empty() ? "no CUDA device (" + cuda::no_device_reason() + ")" : "";
}

Result<CudaGptqContext> CudaGptqContext::create() {
  CudaGptqContext context;
  PETREL_ASSIGN_OR_RETURN(context.blas_, cuda::BlasHandle::create());
  PETREL_ASSIGN_OR_RETURN(context.solver_, cuda::SolverHandle::create());
  return context;
}

Result<CudaHessian> CudaHessian::create(int64_t dim) {
  CudaHessian h;
  h.dim_ = dim;
  PETREL_ASSIGN_OR_RETURN(h.upper_, allocate(static_cast<size_t>(dim) * dim * sizeof(float),
                                             "Hessian [" + std::to_string(dim) + ", " + std::to_string(dim) + "]"));
  PETREL_RETURN_IF_ERROR(h.upper_.fill_bytes(0));
  return h;
}

Status CudaHessian::add(CudaGptqContext& context, const float* x, int64_t n_rows) {
  if (n_rows <= 0) return ok_status();
  PETREL_RETURN_IF_ERROR(cuda::gptq_hessian_add(x, n_rows, dim_, upper_.as<float>(), context.blas(), nullptr));
  rows_seen_ += n_rows;
  return ok_status();
}

Result<std::vector<double>> CudaHessian::to_matrix() const {
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer full, allocate(static_cast<size_t>(dim_) * dim_ * sizeof(double), "Hessian"));
  PETREL_RETURN_IF_ERROR(cuda::gptq_hessian_to_f64(upper(), dim_, full.as<double>(), nullptr));
  std::vector<double> h(dim_ * dim_);
  PETREL_RETURN_IF_ERROR(full.download(h.data(), h.size() * sizeof(double)));
  return h;
}

Result<CudaGptqInverse> gptq_inverse_cuda(CudaGptqContext& context, const CudaHessian& hessian,
                                          const GptqOptions& options, const std::string& what) {
  const int64_t cols = hessian.dim();
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer h, allocate(static_cast<size_t>(cols) * cols * sizeof(double), what + ": Hessian"));
  PETREL_RETURN_IF_ERROR(cuda::gptq_hessian_to_f64(hessian.upper(), cols, h.as<double>(), nullptr));
  return inverse_from_f64(context, h, cols, options, what);
}

Result<CudaGptqInverse> gptq_inverse_cuda(CudaGptqContext& context, const std::vector<double>& h, int64_t cols,
                                          const GptqOptions& options, const std::string& what) {
  if (static_cast<int64_t>(h.size()) != cols * cols) {
    return invalid_argument(what + ": Hessian of " + std::to_string(h.size()) + " values for " + std::to_string(cols) + " columns");
  }
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer device_h, allocate(h.size() * sizeof(double), what + ": Hessian"));
  PETREL_RETURN_IF_ERROR(device_h.upload(h.data(), h.size() * sizeof(double)));
  return inverse_from_f64(context, device_h, cols, options, what);
}

Result<QuantizedMatrix> quantize_gptq_device(CudaGptqContext& context, float* w, int64_t rows, int64_t cols,
                                             const CudaGptqInverse& inverse, const QuantScheme& scheme,
                                             const GptqOptions& options, const std::string& what) {
  PETREL_RETURN_IF_ERROR(validate_scheme(scheme, cols, what));
  if (inverse.cols != cols) {
    return internal_error(what + ": GPTQ inverse of " + std::to_string(inverse.cols) + " columns for a matrix of " +
                          std::to_string(cols));
  }
  QuantizedMatrix q;
  q.scheme = scheme;
  q.rows = rows;
  q.cols = cols;
  q.group_size = scheme.effective_group_size(cols);
  const int64_t groups = q.n_groups();
  const int64_t block = std::min<int64_t>(std::max<int64_t>(1, options.block_size), cuda::kGptqMaxBlock);
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer codes, allocate(static_cast<size_t>(rows) * cols, what + ": GPTQ codes"));
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer scales, allocate(static_cast<size_t>(groups) * rows * 2, what + ": GPTQ scales"));
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer zeros, allocate(static_cast<size_t>(groups) * rows, what + ": GPTQ zeros"));
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer workspace,
                          allocate(cuda::gptq_workspace_floats(rows, block) * sizeof(float), what + ": GPTQ errors"));
  PETREL_RETURN_IF_ERROR(cuda::gptq_quantize(w, rows, cols, inverse.u.as<float>(), inverse.dead.as<uint8_t>(),
                                             grid_of(scheme), block,
                                             {codes.as<uint8_t>(), scales.as<uint16_t>(), zeros.as<uint8_t>()},
                                             workspace.as<float>(), context.blas(), nullptr, what));
  q.codes.resize(rows * cols);
  q.scales.resize(groups * rows);
  q.zeros.resize(groups * rows);
  PETREL_RETURN_IF_ERROR(codes.download(q.codes.data(), q.codes.size()).with_context(what));
  PETREL_RETURN_IF_ERROR(scales.download(q.scales.data(), q.scales.size() * 2).with_context(what));
  PETREL_RETURN_IF_ERROR(zeros.download(q.zeros.data(), q.zeros.size()).with_context(what));
  return q;
}

Result<QuantizedMatrix> quantize_gptq_cuda(const std::vector<float>& w, int64_t rows, int64_t cols,
                                           const std::vector<double>& h, const QuantScheme& scheme,
                                           const GptqOptions& options, GptqReport* report) {
  if (static_cast<int64_t>(w.size()) != rows * cols || static_cast<int64_t>(h.size()) != cols * cols) {
    return invalid_argument("gptq: weight or Hessian size does not match [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  }
  PETREL_RETURN_IF_ERROR(validate_scheme(scheme, cols, "gptq"));
  PETREL_ASSIGN_OR_RETURN(CudaGptqContext context, CudaGptqContext::create());
  PETREL_ASSIGN_OR_RETURN(CudaGptqInverse inverse, gptq_inverse_cuda(context, h, cols, options, "gptq"));
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer device_w, allocate(w.size() * sizeof(float), "gptq: weights"));
  PETREL_RETURN_IF_ERROR(device_w.upload(w.data(), w.size() * sizeof(float)));
  PETREL_ASSIGN_OR_RETURN(QuantizedMatrix q, quantize_gptq_device(context, device_w.as<float>(), rows, cols, inverse,
                                                                   scheme, options, "gptq"));
  if (report) *report = inverse.report;
  return q;
}

// ---- The calibration flow ----

struct CudaCalibration::Impl {
  LlamaConfig c;
  int64_t n_samples = 0, seq_len = 0, chunk_samples = 0;
  float eps = 0;
  CudaGptqContext context;
  cuda::DeviceBuffer x, x2;   // [n_samples * seq_len, hidden]: the layer input, the residual after attention
  cuda::DeviceBuffer normed;  // [chunk tokens, hidden]
  cuda::DeviceBuffer q, k, v, attn;  // [chunk tokens, q_dim or kv_dim]
  cuda::DeviceBuffer gate, up;       // [chunk tokens, ffn]
  cuda::DeviceBuffer scores;         // sequence_attention's workspace
  cuda::DeviceBuffer rope_cos, rope_sin;  // [seq_len, head_dim / 2]
  cuda::DeviceBuffer staging;
  std::array<cuda::DeviceBuffer, kLinears> w;  // the layer's float32 weights, dequantized as GPTQ proceeds
  int64_t out_features[kLinears] = {}, in_features[kLinears] = {};

  int64_t hidden() const { return c.hidden_size; }
  float* x_at(int64_t sample) const { return x.as<float>() + sample * seq_len * hidden(); }
  float* x2_at(int64_t sample) const { return x2.as<float>() + sample * seq_len * hidden(); }

  // Runs f(first_sample, samples_in_chunk, tokens_in_chunk) over the calibration in chunks.
  template <typename F>
  Status for_each_chunk(F&& f) {
    for (int64_t s0 = 0; s0 < n_samples; s0 += chunk_samples) {
      const int64_t n = std::min(chunk_samples, n_samples - s0);
      PETREL_RETURN_IF_ERROR(f(s0, n, n * seq_len));
    }
    return ok_status();
  }

  Status linear(int i, const float* in, int64_t tokens, float* out) {
    return cuda::linear_f32(in, tokens, w[i].as<float>(), out_features[i], in_features[i], out, context.blas(), nullptr);
  }

  // normed input -> q, k, v -> RoPE -> causal attention -> attn [tokens, q_dim]
  Status attention_of(float* xs, int64_t samples, int64_t tokens, const cuda::DeviceVector& input_norm) {
    PETREL_RETURN_IF_ERROR(cuda::rms_norm(xs, nullptr, tokens, hidden(), input_norm, eps, normed.as<float>()));
    PETREL_RETURN_IF_ERROR(linear(0, normed.as<float>(), tokens, q.as<float>()));
    PETREL_RETURN_IF_ERROR(linear(1, normed.as<float>(), tokens, k.as<float>()));
    PETREL_RETURN_IF_ERROR(linear(2, normed.as<float>(), tokens, v.as<float>()));
    PETREL_RETURN_IF_ERROR(cuda::rope_sequences(q.as<float>(), tokens, seq_len, c.num_attention_heads, c.head_dim,
                                                rope_cos.as<float>(), rope_sin.as<float>()));
    PETREL_RETURN_IF_ERROR(cuda::rope_sequences(k.as<float>(), tokens, seq_len, c.num_key_value_heads, c.head_dim,
                                                rope_cos.as<float>(), rope_sin.as<float>()));
    return cuda::sequence_attention(q.as<float>(), k.as<float>(), v.as<float>(), samples, seq_len,
                                    {c.num_attention_heads, c.num_key_value_heads, c.head_dim}, scores.as<float>(),
                                    attn.as<float>(), context.blas());
  }

  // normed residual -> gate, up -> silu(gate) * up in gate [tokens, ffn]
  Status mlp_input_of(float* x2s, int64_t tokens, const cuda::DeviceVector& post_norm) {
    PETREL_RETURN_IF_ERROR(cuda::rms_norm(x2s, nullptr, tokens, hidden(), post_norm, eps, normed.as<float>()));
    PETREL_RETURN_IF_ERROR(linear(4, normed.as<float>(), tokens, gate.as<float>()));
    PETREL_RETURN_IF_ERROR(linear(5, normed.as<float>(), tokens, up.as<float>()));
    return cuda::silu_mul(gate.as<float>(), up.as<float>(), tokens * c.intermediate_size, gate.as<float>());
  }
};

CudaCalibration::CudaCalibration(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaCalibration::~CudaCalibration() = default;

Result<std::unique_ptr<CudaCalibration>> CudaCalibration::create(const LlamaConfig& config,
                                                                 const std::vector<std::vector<int32_t>>& samples,
                                                                 const EmbedRows& embed,
                                                                 const std::vector<float>& rope_cos,
                                                                 const std::vector<float>& rope_sin) {
  if (samples.empty()) return invalid_argument("GPTQ calibration on CUDA: no calibration samples");
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.c = config;
  m.n_samples = static_cast<int64_t>(samples.size());
  m.seq_len = static_cast<int64_t>(samples[0].size());
  for (const auto& s : samples) {
    if (static_cast<int64_t>(s.size()) != m.seq_len) return invalid_argument("GPTQ calibration on CUDA: windows of unequal length");
  }
  m.chunk_samples = std::clamp<int64_t>(kChunkTokens / m.seq_len, 1, m.n_samples);
  m.eps = static_cast<float>(config.rms_norm_eps);
  const int64_t h = config.hidden_size, ffn = config.intermediate_size, q_dim = config.q_dim(), kv_dim = config.kv_dim();
  const int64_t tokens = m.n_samples * m.seq_len, chunk = m.chunk_samples * m.seq_len;
  const int64_t out_features[kLinears] = {q_dim, kv_dim, kv_dim, h, ffn, ffn, h};
  const int64_t in_features[kLinears] = {h, h, h, q_dim, h, h, ffn};
  PETREL_ASSIGN_OR_RETURN(m.context, CudaGptqContext::create());
  const std::string what = "GPTQ calibration on CUDA";
  auto floats = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
  PETREL_ASSIGN_OR_RETURN(m.x, allocate(floats(tokens * h), what + ": activations"));
  PETREL_ASSIGN_OR_RETURN(m.x2, allocate(floats(tokens * h), what + ": activations"));
  PETREL_ASSIGN_OR_RETURN(m.normed, allocate(floats(chunk * h), what));
  PETREL_ASSIGN_OR_RETURN(m.q, allocate(floats(chunk * q_dim), what));
  PETREL_ASSIGN_OR_RETURN(m.k, allocate(floats(chunk * kv_dim), what));
  PETREL_ASSIGN_OR_RETURN(m.v, allocate(floats(chunk * kv_dim), what));
  PETREL_ASSIGN_OR_RETURN(m.attn, allocate(floats(chunk * q_dim), what));
  PETREL_ASSIGN_OR_RETURN(m.gate, allocate(floats(chunk * ffn), what));
  PETREL_ASSIGN_OR_RETURN(m.up, allocate(floats(chunk * ffn), what));
  PETREL_ASSIGN_OR_RETURN(m.scores, allocate(floats(cuda::sequence_attention_workspace_floats(m.chunk_samples, m.seq_len)), what));
  PETREL_ASSIGN_OR_RETURN(m.rope_cos, allocate(floats(rope_cos.size()), what));
  PETREL_ASSIGN_OR_RETURN(m.rope_sin, allocate(floats(rope_sin.size()), what));
  PETREL_RETURN_IF_ERROR(m.rope_cos.upload(rope_cos.data(), floats(rope_cos.size())));
  PETREL_RETURN_IF_ERROR(m.rope_sin.upload(rope_sin.data(), floats(rope_sin.size())));
  PETREL_ASSIGN_OR_RETURN(m.staging, allocate(kStagingBytes, what + ": staging"));
  for (int i = 0; i < kLinears; ++i) {
    m.out_features[i] = out_features[i];
    m.in_features[i] = in_features[i];
    PETREL_ASSIGN_OR_RETURN(m.w[i], allocate(floats(out_features[i] * in_features[i]), what + ": layer weights"));
  }
  // The embedded windows, one at a time through host memory.
  std::vector<float> window(m.seq_len * h);
  for (int64_t s = 0; s < m.n_samples; ++s) {
    embed(samples[s], window.data());
    PETREL_RETURN_IF_ERROR(m.x.upload(window.data(), floats(window.size()), floats(s * m.seq_len * h)));
  }
  return std::unique_ptr<CudaCalibration>(new CudaCalibration(std::move(impl)));
}

Status CudaCalibration::quantize_layer(const std::array<TensorView, kLinears>& weights, const TensorView& input_norm,
                                       const TensorView& post_norm, const std::array<QuantScheme, kLinears>& schemes,
                                       const GptqOptions& options, const std::string& prefix,
                                       const char* const* names, const OnStart& on_start, const OnResult& on_result) {
  Impl& m = *impl_;
  if (!m.w[0].data()) return internal_error("CudaCalibration::quantize_layer after quantize_head");
  for (int i = 0; i < kLinears; ++i) {
    const TensorView& t = weights[i];
    if (t.num_elements() != m.out_features[i] * m.in_features[i]) {
      return invalid_data(prefix + names[i] + ".weight: " + std::to_string(t.num_elements()) + " elements, expected [" +
                          std::to_string(m.out_features[i]) + ", " + std::to_string(m.in_features[i]) + "]");
    }
    PETREL_RETURN_IF_ERROR(upload_widened(t, m.staging, m.w[i].as<float>()));
  }
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer in_norm_buffer, upload_vector(input_norm));
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer post_norm_buffer, upload_vector(post_norm));
  const cuda::DeviceVector in_norm{input_norm.dtype, m.hidden(), in_norm_buffer.data()};
  const cuda::DeviceVector post{post_norm.dtype, m.hidden(), post_norm_buffer.data()};

  // Quantizes `linears` (sharing one input) from the Hessian `h`, in order.
  auto quantize_group = [&](std::initializer_list<int> linears, CudaHessian& hessian) -> Status {
    const std::string input_name = prefix + names[*linears.begin()] + " input";
    PETREL_ASSIGN_OR_RETURN(CudaGptqInverse inverse, gptq_inverse_cuda(m.context, hessian, options, input_name));
    hessian = CudaHessian();  // free it before the codes are allocated
    for (int i : linears) {
      on_start(i);
      PETREL_ASSIGN_OR_RETURN(QuantizedMatrix q, quantize_gptq_device(m.context, m.w[i].as<float>(), m.out_features[i],
                                                                       m.in_features[i], inverse, schemes[i], options,
                                                                       prefix + names[i]));
      PETREL_RETURN_IF_ERROR(on_result(i, q));
    }
    return ok_status();
  };
  const int64_t h = m.hidden();
  {  // 1. q, k, v from the normed layer input.
    PETREL_ASSIGN_OR_RETURN(CudaHessian acc, CudaHessian::create(h));
    PETREL_RETURN_IF_ERROR(m.for_each_chunk([&](int64_t s0, int64_t, int64_t tokens) -> Status {
      PETREL_RETURN_IF_ERROR(cuda::rms_norm(m.x_at(s0), nullptr, tokens, h, in_norm, m.eps, m.normed.as<float>()));
      return acc.add(m.context, m.normed.as<float>(), tokens);
    }));
    PETREL_RETURN_IF_ERROR(quantize_group({0, 1, 2}, acc));
  }
  {  // 2. o from the attention output of the quantized q, k, v.
    PETREL_ASSIGN_OR_RETURN(CudaHessian acc, CudaHessian::create(m.c.q_dim()));
    PETREL_RETURN_IF_ERROR(m.for_each_chunk([&](int64_t s0, int64_t samples, int64_t tokens) -> Status {
      PETREL_RETURN_IF_ERROR(m.attention_of(m.x_at(s0), samples, tokens, in_norm));
      return acc.add(m.context, m.attn.as<float>(), tokens);
    }));
    PETREL_RETURN_IF_ERROR(quantize_group({3}, acc));
  }
  {  // 3. gate, up from the normed residual after the quantized attention block (kept in x2).
    PETREL_ASSIGN_OR_RETURN(CudaHessian acc, CudaHessian::create(h));
    PETREL_RETURN_IF_ERROR(m.for_each_chunk([&](int64_t s0, int64_t samples, int64_t tokens) -> Status {
      PETREL_RETURN_IF_ERROR(m.attention_of(m.x_at(s0), samples, tokens, in_norm));
      PETREL_RETURN_IF_ERROR(m.linear(3, m.attn.as<float>(), tokens, m.x2_at(s0)));
      // x2 = o_proj(attn) + x, then its norm (the add fused into the norm kernel).
      PETREL_RETURN_IF_ERROR(cuda::rms_norm(m.x2_at(s0), m.x_at(s0), tokens, h, post, m.eps, m.normed.as<float>()));
      return acc.add(m.context, m.normed.as<float>(), tokens);
    }));
    PETREL_RETURN_IF_ERROR(quantize_group({4, 5}, acc));
  }
  {  // 4. down from silu(gate) * up of the quantized gate and up.
    PETREL_ASSIGN_OR_RETURN(CudaHessian acc, CudaHessian::create(m.c.intermediate_size));
    PETREL_RETURN_IF_ERROR(m.for_each_chunk([&](int64_t s0, int64_t, int64_t tokens) -> Status {
      PETREL_RETURN_IF_ERROR(m.mlp_input_of(m.x2_at(s0), tokens, post));
      return acc.add(m.context, m.gate.as<float>(), tokens);
    }));
    PETREL_RETURN_IF_ERROR(quantize_group({6}, acc));
  }
  // 5. The quantized layer's output (x2 + down(...)) is the next layer's input.
  return m.for_each_chunk([&](int64_t s0, int64_t, int64_t tokens) -> Status {
    PETREL_RETURN_IF_ERROR(m.mlp_input_of(m.x2_at(s0), tokens, post));
    PETREL_RETURN_IF_ERROR(m.linear(6, m.gate.as<float>(), tokens, m.x_at(s0)));
    return cuda::add_in_place(m.x_at(s0), m.x2_at(s0), tokens * h);
  });
}

Result<QuantizedMatrix> CudaCalibration::quantize_head(const TensorView& final_norm, const TensorView& head,
                                                       const QuantScheme& scheme, const GptqOptions& options) {
  Impl& m = *impl_;
  const int64_t h = m.hidden();
  for (auto& w : m.w) w = cuda::DeviceBuffer();
  for (cuda::DeviceBuffer* b : {&m.x2, &m.q, &m.k, &m.v, &m.attn, &m.gate, &m.up, &m.scores}) *b = cuda::DeviceBuffer();
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer norm_buffer, upload_vector(final_norm));
  const cuda::DeviceVector norm{final_norm.dtype, h, norm_buffer.data()};
  PETREL_ASSIGN_OR_RETURN(CudaHessian acc, CudaHessian::create(h));
  PETREL_RETURN_IF_ERROR(m.for_each_chunk([&](int64_t s0, int64_t, int64_t tokens) -> Status {
    PETREL_RETURN_IF_ERROR(cuda::rms_norm(m.x_at(s0), nullptr, tokens, h, norm, m.eps, m.normed.as<float>()));
    return acc.add(m.context, m.normed.as<float>(), tokens);
  }));
  PETREL_ASSIGN_OR_RETURN(CudaGptqInverse inverse, gptq_inverse_cuda(m.context, acc, options, "lm_head input"));
  acc = CudaHessian();
  m.x = cuda::DeviceBuffer();
  m.normed = cuda::DeviceBuffer();
  const int64_t rows = head.num_elements() / h;
  PETREL_ASSIGN_OR_RETURN(cuda::DeviceBuffer w, allocate(static_cast<size_t>(rows) * h * sizeof(float), "lm_head: weights"));
  PETREL_RETURN_IF_ERROR(upload_widened(head, m.staging, w.as<float>()));
  return quantize_gptq_device(m.context, w.as<float>(), rows, h, inverse, scheme, options, "lm_head");
}

}  // namespace petrel::quant
