// The GPU prompt processor's own kernels against kernels/ref: RoPE + KV store for many tokens
// (cuda::rope_store_kv_rows) and causal prefill attention over the fp16 cache (cuda::prefill_attention).
// GPU tests skip without a GPU; the argument checks run everywhere the CUDA backend is built.
#if PETREL_HAVE_CUDA

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/blas.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/model/rope.h"
#include "petrel/quant/quantize_checkpoint.h"
#include "petrel/runtime/sampler.h"
#include "petrel/util/dtype.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::random_floats;
using testing::relative_l2;

bool have_gpu() {
  auto devices = cuda::list_devices();
  return devices.ok() && !devices->empty();
}

cuda::DeviceBuffer upload(const void* data, size_t bytes) {
  auto buffer = cuda::DeviceBuffer::allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
  EXPECT_TRUE(buffer->upload(data, bytes).ok());
  return std::move(buffer).value();
}

std::vector<float> download(const cuda::DeviceBuffer& buffer, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(buffer.download(out.data(), n * 4).ok());
  return out;
}

std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_f16(x[i]);
  return out;
}

std::vector<float> from_f16(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f16_to_f32(x[i]);
  return out;
}

TEST(PrefillCuda, RopeRowsRotatesAndStoresEveryToken) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(31);
  struct Case { int64_t n_heads, n_kv_heads, head_dim, start, n; };
  RopeConfig rope_config;
  rope_config.theta = 500000.0;
  for (const Case& c : {Case{8, 2, 32, 0, 1}, Case{32, 8, 128, 0, 130}, Case{4, 1, 40, 37, 17}, Case{6, 6, 16, 4000, 95}}) {
    SCOPED_TRACE(std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads of " +
                 std::to_string(c.head_dim) + ", " + std::to_string(c.n) + " tokens at " + std::to_string(c.start));
    const int64_t kv_dim = c.n_kv_heads * c.head_dim, rows = c.start + c.n + 1;
    std::vector<float> q = random_floats(rng, c.n * c.n_heads * c.head_dim), k = random_floats(rng, c.n * kv_dim),
                       v = random_floats(rng, c.n * kv_dim);
    const std::vector<float> inv_freq = rope_inverse_frequencies(rope_config, c.head_dim);
    std::vector<float> cos(c.n * c.head_dim / 2), sin(cos.size());
    rope_cos_sin(inv_freq, c.start, c.n, cos.data(), sin.data());
    std::vector<float> want_q = q, want_k = k;
    ref::apply_rope(want_q.data(), c.n, c.n_heads, c.head_dim, cos.data(), sin.data());
    ref::apply_rope(want_k.data(), c.n, c.n_kv_heads, c.head_dim, cos.data(), sin.data());

    cuda::DeviceBuffer q_dev = upload(q.data(), q.size() * 4), k_dev = upload(k.data(), k.size() * 4),
                       v_dev = upload(v.data(), v.size() * 4), f_dev = upload(inv_freq.data(), inv_freq.size() * 4);
    auto keys = cuda::DeviceBuffer::allocate(rows * kv_dim * 2), values = cuda::DeviceBuffer::allocate(rows * kv_dim * 2);
    ASSERT_TRUE(keys.ok() && values.ok() && keys->fill_bytes(0xFF).ok() && values->fill_bytes(0xFF).ok());
    Status st = cuda::rope_store_kv_rows(q_dev.as<float>(), k_dev.as<float>(), v_dev.as<float>(), c.n, c.start,
                                         cuda::RopeShape{c.n_heads, c.n_kv_heads, c.head_dim}, f_dev.as<float>(),
                                         keys->as<uint16_t>(), values->as<uint16_t>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_LE(relative_l2(download(q_dev, q.size()), want_q), 1e-6);
    std::vector<uint16_t> key_rows(rows * kv_dim), value_rows(rows * kv_dim);
    ASSERT_TRUE(keys->download(key_rows.data(), key_rows.size() * 2).ok());
    ASSERT_TRUE(values->download(value_rows.data(), value_rows.size() * 2).ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < kv_dim; ++i) {
        const uint16_t key = key_rows[r * kv_dim + i], value = value_rows[r * kv_dim + i];
        if (r < c.start || r >= c.start + c.n) {
          ASSERT_EQ(key, 0xFFFF) << "row " << r << " was written";
          ASSERT_EQ(value, 0xFFFF) << "row " << r << " was written";
          continue;
        }
        const int64_t t = r - c.start;
        ASSERT_EQ(value, f32_to_f16(v[t * kv_dim + i]));
        // One fp16 step at most: the CPU reference may contract the rotation into an FMA.
        ASSERT_LE(std::abs(int(key) - int(f32_to_f16(want_k[t * kv_dim + i]))), 1) << "row " << r << " key " << i;
      }
    }
  }
  EXPECT_FALSE(cuda::rope_store_kv_rows(nullptr, nullptr, nullptr, 0, 0, cuda::RopeShape{8, 2, 32}, nullptr, nullptr,
                                        nullptr).ok());
}

// Against ref::attention on the same fp16 keys and values; q and the probabilities are rounded to fp16 on the
// GPU (relative 2^-11 each), so the bound is a few 1e-4 on random data.
constexpr double kPrefillAttentionTolerance = 2e-3;
// prefill_attention_short keeps q and the probabilities in float32: only the sums' order differs.
constexpr double kShortPrefillAttentionTolerance = 1e-5;

TEST(PrefillCuda, AttentionMatchesReferenceOverTheCache) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(32);
  auto blas = cuda::BlasHandle::create();
  ASSERT_TRUE(blas.ok()) << blas.status().to_string();
  struct Case { int64_t n_heads, n_kv_heads, head_dim, start, n; };
  double worst = 0, worst_short = 0;
  for (const Case& c : {Case{8, 2, 32, 0, 1}, Case{8, 2, 32, 0, 5}, Case{32, 8, 128, 0, 130}, Case{32, 8, 128, 70, 64},
                        Case{4, 1, 40, 3, 17}, Case{6, 6, 16, 1000, 33}, Case{2, 1, 256, 9, 7},
                        Case{8, 2, 30, 40, 29}, Case{64, 1, 64, 0, 70}}) {
    SCOPED_TRACE(std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads of " +
                 std::to_string(c.head_dim) + ", " + std::to_string(c.n) + " tokens at " + std::to_string(c.start));
    const int64_t kv_dim = c.n_kv_heads * c.head_dim, positions = c.start + c.n;
    const std::vector<float> q = random_floats(rng, c.n * c.n_heads * c.head_dim, 0.5f);
    const std::vector<uint16_t> keys = to_f16(random_floats(rng, positions * kv_dim));
    const std::vector<uint16_t> values = to_f16(random_floats(rng, positions * kv_dim));
    std::vector<float> want(q.size());
    ref::attention(q.data(), from_f16(keys).data(), from_f16(values).data(), c.n, c.start, c.n_heads, c.n_kv_heads,
                   c.head_dim, want.data());
    const cuda::PrefillAttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};
    const int64_t workspace_bytes = cuda::prefill_attention_workspace_bytes(shape, c.n, positions);
    cuda::DeviceBuffer q_dev = upload(q.data(), q.size() * 4), k_dev = upload(keys.data(), keys.size() * 2),
                       v_dev = upload(values.data(), values.size() * 2);
    auto workspace = cuda::DeviceBuffer::allocate(workspace_bytes);
    auto out = cuda::DeviceBuffer::allocate(want.size() * 4);
    ASSERT_TRUE(workspace.ok() && out.ok() && workspace->fill_bytes(0xFF).ok() && out->fill_bytes(0xFF).ok());
    Status st = cuda::prefill_attention(q_dev.as<float>(), k_dev.as<uint16_t>(), v_dev.as<uint16_t>(), c.start, c.n, shape,
                                        *blas, workspace->data(), workspace_bytes, out->as<float>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    const double error = relative_l2(download(*out, want.size()), want);
    EXPECT_LE(error, kPrefillAttentionTolerance);
    worst = std::max(worst, error);
    // Too small a workspace is refused, naming the need.
    Status small = cuda::prefill_attention(q_dev.as<float>(), k_dev.as<uint16_t>(), v_dev.as<uint16_t>(), c.start, c.n,
                                           shape, *blas, workspace->data(), workspace_bytes - 1, out->as<float>());
    EXPECT_EQ(small.code(), ErrorCode::kOutOfRange);
    // The one-launch kernel for short prompts: the same contract, q kept in float32.
    ASSERT_TRUE(out->fill_bytes(0xFF).ok());
    st = cuda::prefill_attention_short(q_dev.as<float>(), k_dev.as<uint16_t>(), v_dev.as<uint16_t>(), c.start, c.n, shape,
                                       out->as<float>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    const double short_error = relative_l2(download(*out, want.size()), want);
    EXPECT_LE(short_error, kShortPrefillAttentionTolerance) << "prefill_attention_short";
    worst_short = std::max(worst_short, short_error);
  }
  std::printf("[ cuda prefill attention ] worst relative L2 %.3g (cuBLAS), %.3g (short)\n", worst, worst_short);
  EXPECT_TRUE(cuda::prefill_attention_short_preferred(0, 29));
  EXPECT_FALSE(cuda::prefill_attention_short_preferred(0, 512));
  EXPECT_EQ(cuda::prefill_attention_short(nullptr, nullptr, nullptr, 0, 4, cuda::PrefillAttentionShape{6, 4, 16}, nullptr)
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST(PrefillCuda, AttentionRefusesBadShapes) {
  cuda::BlasHandle none;
  EXPECT_EQ(cuda::prefill_attention(nullptr, nullptr, nullptr, 0, 4, cuda::PrefillAttentionShape{6, 4, 16}, none, nullptr,
                                    0, nullptr)
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(cuda::prefill_attention(nullptr, nullptr, nullptr, 0, 0, cuda::PrefillAttentionShape{8, 2, 32}, none, nullptr,
                                    0, nullptr)
                .code(),
            ErrorCode::kInvalidArgument);
}

// ---- CudaModel's prompt processor against the CPU model ----

using testing::data_dir;

struct Agreement {
  double relative_l2 = 0;
  int64_t argmax_mismatches = 0;
};

Agreement agree(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  Agreement a;
  a.relative_l2 = relative_l2(got, want);
  for (size_t t = 0; t * vocab < want.size() && t * vocab < got.size(); ++t) {
    const std::span<const float> g(got.data() + t * vocab, vocab), w(want.data() + t * vocab, vocab);
    a.argmax_mismatches += argmax(g) != argmax(w);
  }
  return a;
}

// The CPU prompt processor (chunks of 128, fp16 KV cache): every position's logits.
std::vector<float> cpu_prompt_logits(const LlamaModel& model, const std::vector<int32_t>& tokens) {
  auto cache = model.new_cache(static_cast<int64_t>(tokens.size()), KvType::kF16);
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits;
  Status s = model.process_prompt(tokens, *cache, 128, LogitsMode::kAll, &logits);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

// Tolerances of the GPU prompt processor against the CPU's (both with an fp16 KV cache): the products round
// activations to fp16 (GPTQ and f16/bf16 weights; float32 weights stay float32) and attention rounds q and
// the probabilities to fp16. bf16 weights (gqa_llama3) round the activations to bf16 (8 bits of mantissa):
// 3.5e-3 measured on the H200, hence 5e-3.
constexpr double kPrefillRelativeL2 = 5e-3;
// kLast's row through the token generator's LM head (float32 activations) against kAll's through the LM head
// GEMM (activations rounded to the weights' 16-bit dtype): 1.9e-3 measured for bf16 weights.
constexpr double kLastVersusAllRelativeL2 = 3e-3;

// qkv_gemm: CudaModelOptions::prefill_qkv_gemm (q/k/v as one GEMM launch with the input RMSNorm fused in).
void expect_prefill_agrees(const LlamaModel& model, const std::vector<int32_t>& tokens, const std::string& what,
                           bool qkv_gemm = false) {
  const int64_t vocab = model.config().vocab_size;
  const std::vector<float> cpu = cpu_prompt_logits(model, tokens);
  // Chunks of 16: several chunks, each after the first attending to cache rows it did not write.
  for (int64_t chunk : {int64_t{16}, int64_t{512}}) {
    CudaModelOptions options;
    options.context_length = static_cast<int64_t>(tokens.size()) + 8;
    options.prefill_chunk = chunk;
    options.prefill_qkv_gemm = qkv_gemm;
    auto gpu = CudaModel::create(model, options);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    std::vector<float> all;
    Status s = (*gpu)->forward(tokens, LogitsMode::kAll, &all);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(all.size(), cpu.size());
    EXPECT_EQ((*gpu)->position(), static_cast<int64_t>(tokens.size()));
    const Agreement a = agree(all, cpu, vocab);
    std::printf("[ cuda prefill ] %-36s chunk %3lld: relative L2 %.2e, argmax mismatches %lld of %zu\n", what.c_str(),
                static_cast<long long>(chunk), a.relative_l2, static_cast<long long>(a.argmax_mismatches), tokens.size());
    EXPECT_LE(a.relative_l2, kPrefillRelativeL2);
    EXPECT_LE(a.argmax_mismatches, static_cast<int64_t>(tokens.size()) / 50);

    // kLast gives the last row (through the token generator's LM head), and
    // the token generator continues from the cache the prompt processor wrote.
    (*gpu)->reset();
    const size_t half = tokens.size() / 2;
    std::vector<float> last;
    ASSERT_TRUE((*gpu)->forward(std::span<const int32_t>(tokens.data(), half), LogitsMode::kLast, &last).ok());
    ASSERT_EQ(last.size(), static_cast<size_t>(vocab));
    EXPECT_LE(relative_l2(last, std::vector<float>(all.begin() + (half - 1) * vocab, all.begin() + half * vocab)), kLastVersusAllRelativeL2);
    std::vector<float> step, decoded;
    for (size_t i = half; i < tokens.size(); ++i) {
      ASSERT_TRUE((*gpu)->decode(tokens[i], &step).ok());
      decoded.insert(decoded.end(), step.begin(), step.end());
    }
    const Agreement d = agree(decoded, std::vector<float>(cpu.begin() + half * vocab, cpu.end()), vocab);
    EXPECT_LE(d.relative_l2, kPrefillRelativeL2);
    EXPECT_LE(d.argmax_mismatches, static_cast<int64_t>(tokens.size()) / 50);
  }
}

TEST(PrefillCuda, FloatModelsAgreeWithTheCpuPromptProcessor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  for (const char* name : {"tiny-llama31", "gqa_llama3", "tied_mha", "headdim_1kv"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(name) == "tiny-llama31" ? "models/tiny-llama31" : std::string("parity/") + name;
    auto model = LlamaModel::load(data_dir() / dir);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    expect_prefill_agrees(**model, testing::read_ids(data_dir() / ("parity/" + std::string(name) + ".tokens.txt")), name);
  }
}

TEST(PrefillCuda, QuantizedTinyLlamaAgreesWithTheCpuPromptProcessor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  for (int64_t group : {int64_t{-1}, int64_t{128}}) {
    testing::TempDir dir("cuda_prefill_" + std::to_string(group < 0 ? 0 : group));
    auto model = testing::rtn_tiny_llama(dir / "q", group);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    // A longer prompt than the parity fixture: the corpus's tokens, ids < vocab.
    std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
    while (tokens.size() < 300) tokens.push_back(static_cast<int32_t>((tokens.size() * 7919) % (*model)->config().vocab_size));
    expect_prefill_agrees(**model, tokens, std::string("tiny-llama31 W4 ") + (group < 0 ? "per-channel" : "g128"));
    expect_prefill_agrees(**model, tokens, std::string("tiny-llama31 W4 ") + (group < 0 ? "per-channel" : "g128") + " qkv gemm",
                          true);

    // The fp16 weight cache: the long chunks read dequantized copies instead of dequantizing per call; the
    // same fp16 weights go into the same cuBLAS products, so the logits agree to summation order.
    std::vector<float> plain, cached;
    for (bool f16 : {false, true}) {
      CudaModelOptions options;
      options.context_length = static_cast<int64_t>(tokens.size());
      options.prefill_f16_weights = f16 ? PrefillF16Weights::kOn : PrefillF16Weights::kOff;
      auto gpu = CudaModel::create(**model, options);
      ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
      ASSERT_TRUE((*gpu)->forward(tokens, LogitsMode::kAll, f16 ? &cached : &plain).ok());
      EXPECT_EQ((*gpu)->prefill_f16_weights(), f16);
    }
    ASSERT_EQ(plain.size(), cached.size());
    EXPECT_LE(relative_l2(cached, plain), 1e-5);
  }
}

}  // namespace
}  // namespace petrel

#endif  // PETREL_HAVE_CUDA
