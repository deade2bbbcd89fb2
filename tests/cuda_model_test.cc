// The GPU token generator (model/cuda_model.h) against the CPU one (LlamaModel::forward one token at a time
// with an fp16 KV cache, the runtime's default) and against Hugging Face transformers' logits, on the shipped
// tiny-llama31 (float and quantized with petrel's RTN: 4-bit per-channel and group 128, 8-bit LM head) and
// the parity fixtures. Without a GPU (or without the CUDA backend) the comparisons skip and only the error
// for a missing GPU is checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "petrel/io/npy.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/quant/quantize_checkpoint.h"
#include "petrel/runtime/sampler.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::data_dir;

bool have_gpu() {
  auto devices = cuda::list_devices();
  return devices.ok() && !devices->empty();
}

// Tolerances, GPU against the CPU token generator (both with an fp16 KV cache). Float checkpoints: the same
// float32 formulas, sums in other orders. GPTQ checkpoints: the GPU GEMV also rounds activations to fp16 in
// the matrix unit, where the CPU kernel splits them into int16 parts (measured on an H200: relative L2
// 2.5e-4, max KL 2.2e-6 on tiny-llama31; float checkpoints 2.1e-5 and 6e-8).
constexpr double kFloatRelativeL2 = 1e-4;
constexpr double kGptqRelativeL2 = 2e-3;
constexpr double kFloatMaxKl = 1e-6;
constexpr double kGptqMaxKl = 1e-4;
// Two logits closer than this are a tie within those roundings: an argmax that picks the other one is not a
// disagreement (an H100 gave tiny-llama31's quantized-embedding test one such flip, a CPU margin of 1.2e-4;
// tiny-llama31's logits have an RMS of 2.5, so a relative L2 of 2.5e-4 is ~6e-4 a logit).
constexpr double kTieMargin = 5e-3;

struct Agreement {
  double relative_l2 = 0;
  double mean_kl = 0, max_kl = 0;  // KL(softmax(reference) || softmax(got)) per position, in nats
  int64_t argmax_mismatches = 0;
  int64_t decisive_mismatches = 0;             // those where the reference's top-1 leads by more than kTieMargin
  double smallest_mismatch_margin = INFINITY;  // the reference's top-1 minus the got argmax's logit, where they differ
};

std::vector<double> log_softmax(const float* x, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - m);
  const double log_sum = m + std::log(sum);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = double(x[i]) - log_sum;
  return out;
}

Agreement compare(const std::vector<float>& got, const float* want, int64_t positions, int64_t vocab) {
  Agreement a;
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < positions * vocab; ++i) {
    const double g = std::isfinite(got[i]) ? got[i] : 1e30;
    diff += (g - want[i]) * (g - want[i]);
    norm += double(want[i]) * want[i];
  }
  a.relative_l2 = std::sqrt(diff / norm);
  for (int64_t t = 0; t < positions; ++t) {
    const float* g = got.data() + t * vocab;
    const float* w = want + t * vocab;
    const std::vector<double> lg = log_softmax(g, vocab), lw = log_softmax(w, vocab);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) kl += std::exp(lw[i]) * (lw[i] - lg[i]);
    a.mean_kl += kl / positions;
    a.max_kl = std::max(a.max_kl, kl);
    const int32_t ga = argmax(std::span<const float>(g, vocab)), wa = argmax(std::span<const float>(w, vocab));
    if (ga != wa) {
      a.argmax_mismatches++;
      a.decisive_mismatches += double(w[wa]) - w[ga] > kTieMargin;
      a.smallest_mismatch_margin = std::min(a.smallest_mismatch_margin, double(w[wa]) - w[ga]);
    }
  }
  return a;
}

void print(const std::string& what, const Agreement& a) {
  std::printf("[ cuda model ] %-44s relative L2 %.2e, KL mean %.2e max %.2e, argmax mismatches %lld (%lld beyond a tie)\n",
              what.c_str(), a.relative_l2, a.mean_kl, a.max_kl, static_cast<long long>(a.argmax_mismatches),
              static_cast<long long>(a.decisive_mismatches));
}

// The CPU token generator: one token at a time, fp16 KV cache.
std::vector<float> cpu_logits(const LlamaModel& model, const std::vector<int32_t>& tokens) {
  auto cache = model.new_cache(static_cast<int64_t>(tokens.size()), KvType::kF16);
  EXPECT_TRUE(cache.ok());
  std::vector<float> all, step;
  for (size_t i = 0; i < tokens.size(); ++i) {
    Status s = model.forward(std::span<const int32_t>(&tokens[i], 1), *cache, LogitsMode::kLast, &step);
    EXPECT_TRUE(s.ok()) << s.to_string();
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

// The token generator's logits for every token (prefill_chunk 0: one decode step per token; the prompt
// processor has its own tests in prefill_cuda_test.cc).
std::vector<float> cuda_logits(const LlamaModel& model, const std::vector<int32_t>& tokens, CudaModelOptions options) {
  options.context_length = static_cast<int64_t>(tokens.size());
  options.prefill_chunk = 0;
  auto gpu = CudaModel::create(model, options);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (!gpu.ok()) return {};
  std::vector<float> logits;
  Status s = (*gpu)->forward(tokens, LogitsMode::kAll, &logits);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

TEST(CudaModel, WithoutAGpuCreateSaysWhy) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto gpu = CudaModel::create(**model);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), ErrorCode::kUnsupported);
  const std::string& message = gpu.status().message();
  EXPECT_TRUE(message.find("not built") != std::string::npos || message.find("no CUDA device") != std::string::npos)
      << message;
}

// The tensor-copy GEMVs' default (CudaModelOptions::kTmaAuto) follows the device's memory system: per channel one
// stage on an H200's ~4.9 TB/s, the register GEMV on an H100 SXM's ~3.35 TB/s and where the bandwidth is unknown;
// group-wise weights one stage on any device with tensor copies; down one stage for group-wise weights on an H200
// only; nothing before compute capability 9.0; an explicit setting is kept everywhere. No GPU needed.
TEST(CudaModel, TensorCopyGemvDefaultFollowsTheMemoryBandwidth) {
  constexpr int kAuto = CudaModelOptions::kTmaAuto;
  EXPECT_EQ(CudaModelOptions{}.decode_tma_qkv_stages, kAuto);
  EXPECT_EQ(CudaModelOptions{}.decode_tma_gate_up_stages, kAuto);
  EXPECT_EQ(CudaModelOptions{}.decode_tma_down_stages, kAuto);
  const int64_t h200 = int64_t{2} * 3'201'000'000 * (6144 / 8), h100 = int64_t{2} * 2'619'000'000 * (5120 / 8);
  EXPECT_EQ(resolve_tma_stages(kAuto, h200, 9, false), 1);
  EXPECT_EQ(resolve_tma_stages(kAuto, h200, 9, true), 1);  // group 128: on both (session 41)
  EXPECT_EQ(resolve_tma_stages(kAuto, h100, 9, true), 1);
  EXPECT_EQ(resolve_tma_stages(kAuto, 0, 9, true), 1);
  EXPECT_EQ(resolve_tma_stages(kAuto, h200, 8, true), 0);
  EXPECT_EQ(resolve_tma_stages(kAuto, h100, 9, false), 0);
  EXPECT_EQ(resolve_tma_stages(kAuto, h200, 8, false), 0);
  EXPECT_EQ(resolve_tma_stages(kAuto, 0, 9, false), 0);
  EXPECT_EQ(resolve_tma_stages(kAuto, CudaModelOptions::kTmaAutoMinBandwidth, 10, false), 1);
  for (const int stages : {0, 1, 3}) {
    for (const bool grouped : {false, true}) {
      EXPECT_EQ(resolve_tma_stages(stages, h200, 9, grouped), stages);
      EXPECT_EQ(resolve_tma_stages(stages, h100, 9, grouped), stages);
      EXPECT_EQ(resolve_tma_down_stages(stages, h200, 9, grouped), stages);
    }
  }
  // down: group-wise weights on an H200 only (session 43: +1.5% there, -0.5% on an H100; per channel it loses).
  EXPECT_EQ(resolve_tma_down_stages(kAuto, h200, 9, true), 1);
  EXPECT_EQ(resolve_tma_down_stages(kAuto, h200, 9, false), 0);
  EXPECT_EQ(resolve_tma_down_stages(kAuto, h100, 9, true), 0);
  EXPECT_EQ(resolve_tma_down_stages(kAuto, 0, 9, true), 0);
  EXPECT_EQ(resolve_tma_down_stages(kAuto, h200, 8, true), 0);
}

struct FloatCase {
  std::string name;       // fixture name under parity/
  std::string model_dir;  // relative to the test data dir
};

class CudaModelFloat : public ::testing::TestWithParam<FloatCase> {};

TEST_P(CudaModelFloat, AgreesWithCpuTokenGeneratorAndTransformers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  const FloatCase& c = GetParam();
  auto model = LlamaModel::load(data_dir() / c.model_dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::vector<int32_t> tokens = testing::read_ids(data_dir() / ("parity/" + c.name + ".tokens.txt"));
  ASSERT_FALSE(tokens.empty());
  const int64_t vocab = (*model)->config().vocab_size, n = static_cast<int64_t>(tokens.size());
  const std::vector<float> cpu = cpu_logits(**model, tokens);
  // A small attention split so that the sequence spans several blocks and the split-K combine is exercised.
  CudaModelOptions options;
  options.attention_split = 16;
  const std::vector<float> gpu = cuda_logits(**model, tokens, options);
  ASSERT_EQ(gpu.size(), cpu.size());
  const Agreement a = compare(gpu, cpu.data(), n, vocab);
  print(c.name + " vs CPU (fp16 KV)", a);
  EXPECT_LE(a.relative_l2, kFloatRelativeL2);
  EXPECT_LE(a.max_kl, kFloatMaxKl);
  EXPECT_EQ(a.decisive_mismatches, 0);

  auto expected = read_npy(data_dir() / ("parity/" + c.name + ".logits.npy"));
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  const Agreement hf = compare(gpu, expected->f32(), n, vocab);
  print(c.name + " vs transformers (f32)", hf);
  const Agreement cpu_hf = compare(cpu, expected->f32(), n, vocab);
  print(c.name + " CPU (fp16 KV) vs transformers", cpu_hf);
  // The fp16 KV cache is the only rounding the transformers run does not have: the GPU may not be further
  // from transformers than the CPU with the same cache, beyond the float-order noise above.
  EXPECT_LE(hf.relative_l2, cpu_hf.relative_l2 + kFloatRelativeL2);
  EXPECT_EQ(hf.argmax_mismatches, cpu_hf.argmax_mismatches);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CudaModelFloat,
                         ::testing::Values(FloatCase{"tiny-llama31", "models/tiny-llama31"},
                                           FloatCase{"gqa_llama3", "parity/gqa_llama3"},
                                           FloatCase{"tied_mha", "parity/tied_mha"},
                                           FloatCase{"headdim_1kv", "parity/headdim_1kv"}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

class CudaModelGptq : public ::testing::TestWithParam<int64_t> {};  // the group size, -1: per-channel

// The GPU token generator against the CPU's on the parity tokens, within the GPTQ tolerances; the GPU's logits.
std::vector<float> expect_gptq_agreement(const LlamaModel& model, const std::string& what) {
  const std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
  const std::vector<float> cpu = cpu_logits(model, tokens);
  const std::vector<float> gpu = cuda_logits(model, tokens, CudaModelOptions{});
  EXPECT_EQ(gpu.size(), cpu.size());
  if (gpu.size() != cpu.size()) return gpu;
  const Agreement a = compare(gpu, cpu.data(), static_cast<int64_t>(tokens.size()), model.config().vocab_size);
  print(what, a);
  EXPECT_LE(a.relative_l2, kGptqRelativeL2);
  EXPECT_LE(a.max_kl, kGptqMaxKl);
  EXPECT_EQ(a.decisive_mismatches, 0) << "smallest CPU top-1 margin among mismatches " << a.smallest_mismatch_margin;
  return gpu;
}

TEST_P(CudaModelGptq, QuantizedTinyLlamaAgreesWithCpuTokenGenerator) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  const int64_t group = GetParam();
  testing::TempDir dir("cuda_gptq_" + std::to_string(group < 0 ? 0 : group));
  auto model = testing::rtn_tiny_llama(dir / "q", group);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_TRUE((*model)->is_quantized());
  ASSERT_EQ((*model)->weights().lm_head.kind, LinearWeight::Kind::kGptq);
  ASSERT_EQ((*model)->weights().lm_head.gptq.bits, 8);
  const std::vector<float> gpu = expect_gptq_agreement(
      **model, "tiny-llama31 W4 " + std::string(group < 0 ? "per-channel" : "g" + std::to_string(group)) + " vs CPU");
  const std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
  const int64_t vocab = (*model)->config().vocab_size, n = static_cast<int64_t>(tokens.size());

  // With the split-K sums in a fixed order (not the default atomics, whose order varies), launching kernel by
  // kernel gives the same bits as the graph, on every run.
  CudaModelOptions ordered;
  ordered.decode_atomic_reduce = false;
  const std::vector<float> ordered_logits = cuda_logits(**model, tokens, ordered);
  EXPECT_EQ(cuda_logits(**model, tokens, ordered), ordered_logits);
  // The two orders differ by float32 rounding, which moves some activations' fp16 rounding by a step downstream
  // (2.0e-4 to 2.1e-4 measured on the H200, as the fused step's other sum orders).
  const Agreement orders = compare(ordered_logits, gpu.data(), n, vocab);
  EXPECT_LE(orders.relative_l2, 4e-4) << "atomic and ordered sums";
  EXPECT_EQ(orders.decisive_mismatches, 0);
  CudaModelOptions no_graph = ordered;
  no_graph.use_graph = false;
  const std::vector<float> direct = cuda_logits(**model, tokens, no_graph);
  EXPECT_EQ(direct, ordered_logits);

  // The LM head writing to device memory and the logits copied, instead of written straight into mapped host
  // memory: the same bits.
  CudaModelOptions copied = ordered;
  copied.logits_to_mapped_host = false;
  EXPECT_EQ(cuda_logits(**model, tokens, copied), ordered_logits);

  // decode_logits (a view of the host buffer) and decode_top (the LM head's top-k on the GPU, its own graph)
  // see the same steps.
  CudaModelOptions steps = ordered;
  steps.context_length = n;
  steps.prefill_chunk = 0;
  steps.time_steps = true;
  auto m = CudaModel::create(**model, steps);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  for (int64_t i = 0; i < n; ++i) {
    auto view = (*m)->decode_logits(tokens[static_cast<size_t>(i)]);
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    ASSERT_EQ(view->size(), static_cast<size_t>(vocab));
    EXPECT_TRUE(std::equal(view->begin(), view->end(), ordered_logits.begin() + i * vocab)) << "token " << i;
  }
  EXPECT_EQ((*m)->position(), n);
  EXPECT_GT((*m)->last_step_device_ms(), 0.0);
  EXPECT_LT((*m)->last_step_device_ms(), 1000.0);
  (*m)->truncate(n - 1);
  TopLogits top;
  ASSERT_TRUE((*m)->decode_top(tokens.back(), 3, &top).ok());
  const auto last = ordered_logits.begin() + (n - 1) * vocab;
  const auto best = std::max_element(last, last + vocab);
  ASSERT_EQ(top.ids.size(), 3u);
  EXPECT_EQ(top.ids[0], best - last);
  EXPECT_EQ(top.values[0], *best);
}

// A quantized embedding table (--embedding-bits 4, groups of 64) is dequantized on the host to the CPU's float32
// values and looked up like a float table: the same agreement as with the bf16 table.
TEST(CudaModel, QuantizedEmbeddingAgreesWithCpuTokenGenerator) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  testing::TempDir dir("cuda_gptq_embedding");
  auto model = testing::rtn_tiny_llama(dir / "q", 128, /*embedding_bits=*/4, /*embedding_group=*/64);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_EQ((*model)->weights().embed_tokens.kind, LinearWeight::Kind::kGptq);
  expect_gptq_agreement(**model, "tiny-llama31 W4 g128, 4-bit embedding vs CPU");
}

// The fused decode step (five launches per layer, overlapped) against the unfused one on the same checkpoint:
// the same formulas except the RMSNorm's sum of squares in another order, which can move an activation's fp16
// rounding by a step. Overlap and L2 prefetch change no arithmetic: bitwise the same logits.
TEST_P(CudaModelGptq, FusedStepAgreesWithTheUnfusedOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  const int64_t group = GetParam();
  testing::TempDir dir("cuda_fused_" + std::to_string(group < 0 ? 0 : group));
  auto model = testing::rtn_tiny_llama(dir / "q", group);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
  const int64_t vocab = (*model)->config().vocab_size, n = static_cast<int64_t>(tokens.size());
  CudaModelOptions unfused;
  unfused.fused_step = false;
  unfused.attention_split = 8;  // many splits: the fused kernel's last-block combine at every step
  const std::vector<float> reference = cuda_logits(**model, tokens, unfused);
  CudaModelOptions fused = unfused;
  fused.fused_step = true;
  fused.decode_atomic_reduce = false;  // sums in a fixed order: the bitwise comparisons below; atomics at the end
  fused.resident_step = false;   // the five-launch step; the resident one below
  fused.overlap_kernels = true;  // programmatic dependent launch and L2 prefetch (the defaults)
  fused.gemv_l2_prefetch_steps = 16;
  // The planner's splits for every product, as the resident step takes them (its bits are compared below); the
  // default splits are the same sums in another order, checked against the unfused step at the end.
  const CudaModelOptions::DecodeSplits default_splits = fused.decode_splits;
  fused.decode_splits = {0, 0, 0, 0};
  const std::vector<float> overlapped = cuda_logits(**model, tokens, fused);
  ASSERT_EQ(overlapped.size(), reference.size());
  const Agreement a = compare(overlapped, reference.data(), n, vocab);
  print("tiny-llama31 W4 " + std::string(group < 0 ? "per-channel" : "g" + std::to_string(group)) + " fused vs unfused", a);
  EXPECT_LE(a.relative_l2, 4e-4);  // 2.1e-4 measured on the H200 (KL mean 1.4e-7)
  EXPECT_EQ(a.decisive_mismatches, 0);
  CudaModelOptions serial = fused;
  serial.overlap_kernels = false;
  serial.gemv_l2_prefetch_steps = 0;
  EXPECT_EQ(cuda_logits(**model, tokens, serial), overlapped);
  serial.use_graph = false;
  EXPECT_EQ(cuda_logits(**model, tokens, serial), overlapped);
  CudaModelOptions cluster = fused;  // split-K sums through thread-block clusters: the same bits
  cluster.gemv_cluster_reduce = true;
  EXPECT_EQ(cuda_logits(**model, tokens, cluster), overlapped);
  CudaModelOptions cold = fused;  // attention without its warm pass before the wait: the same bits
  cold.decode_attention_warm = false;
  EXPECT_EQ(cuda_logits(**model, tokens, cold), overlapped);
  CudaModelOptions carved = fused;  // one shared-memory carveout for every launch (and none): the same bits
  carved.decode_shared_carveout = fused.decode_shared_carveout >= 0 ? -1 : 100;
  EXPECT_EQ(cuda_logits(**model, tokens, carved), overlapped);
  carved.decode_phase_carveouts = {100, -1, 100, 0, 40};  // and one per phase
  EXPECT_EQ(cuda_logits(**model, tokens, carved), overlapped);
  CudaModelOptions shallow = fused;  // two batches of weight loads in flight for the RMSNorm products: the same bits
  shallow.decode_deep_batches = {false, false};
  EXPECT_EQ(cuda_logits(**model, tokens, shallow), overlapped);
  CudaModelOptions late = fused;  // weight batches sent after each product's wait: the same bits
  late.decode_late_batches = {1, 2};
  EXPECT_EQ(cuda_logits(**model, tokens, late), overlapped);
  late.decode_late_batches = {2, 1};
  late.decode_deep_batches = {false, false};
  EXPECT_EQ(cuda_logits(**model, tokens, late), overlapped);
  late.decode_late_batches = {0, 0};  // and none
  late.decode_deep_batches = {true, true};
  EXPECT_EQ(cuda_logits(**model, tokens, late), overlapped);
  CudaModelOptions zeros = fused;  // group 128: every group's zeros loaded and decoded (the general build)
  zeros.decode_uniform_zeros = false;
  EXPECT_EQ(cuda_logits(**model, tokens, zeros), overlapped);
  // The resident step (Hopper and later): with the GEMV planner's input slices, the five-launch step's bits;
  // with its own (longer) slices, the same sums in another order.
  auto info = cuda::device_info(0);
  ASSERT_TRUE(info.ok());
  CudaModelOptions resident = fused;
  resident.resident_step = true;
  auto gpu = CudaModel::create(**model, resident);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_EQ((*gpu)->resident_step(), info->compute_major >= 9);
  const Agreement r = compare(cuda_logits(**model, tokens, resident), reference.data(), n, vocab);
  print("tiny-llama31 W4 " + std::string(group < 0 ? "per-channel" : "g" + std::to_string(group)) + " resident vs unfused", r);
  EXPECT_LE(r.relative_l2, 4e-4);
  EXPECT_EQ(r.decisive_mismatches, 0);
  // Streaming a tiled copy of the weights changes where the bytes come from, not the sums: the same bits
  // (tiny-llama31's slices are whole 16-word stages, so the tiled chains must apply wherever resident ones do).
  CudaModelOptions tiled = resident;
  tiled.resident_tiled_copy = true;
  bool tiled_applies = false;
  {
    auto tiled_gpu = CudaModel::create(**model, tiled);
    ASSERT_TRUE(tiled_gpu.ok()) << tiled_gpu.status().to_string();
    tiled_applies = (*tiled_gpu)->resident_step();
  }
  EXPECT_EQ(tiled_applies, info->compute_major >= 9);
  if (tiled_applies) {
    EXPECT_EQ(cuda_logits(**model, tokens, tiled), cuda_logits(**model, tokens, resident));
  }
  resident.resident_min_unit_steps = 0;
  EXPECT_EQ(cuda_logits(**model, tokens, resident), overlapped);
  // The same sums in other orders, against the unfused step: the default splits, then the default atomics.
  const std::string format = group < 0 ? "per-channel" : "g" + std::to_string(group);
  auto expect_close = [&](const CudaModelOptions& options, const std::string& what) {
    const Agreement d = compare(cuda_logits(**model, tokens, options), reference.data(), n, vocab);
    print("tiny-llama31 W4 " + format + " " + what + " vs unfused", d);
    EXPECT_LE(d.relative_l2, 4e-4) << what;
    EXPECT_EQ(d.decisive_mismatches, 0) << what;
  };
  CudaModelOptions split = fused;
  split.decode_splits = default_splits;
  expect_close(split, "default splits");
  CudaModelOptions atomic = split;
  atomic.decode_atomic_reduce = true;  // split-K sums by atomics (all but layer 0's q/k/v): an order varying by run
  atomic.decode_tma_qkv_stages = atomic.decode_tma_gate_up_stages = 0;  // the register GEMVs on every GPU
  expect_close(atomic, "atomic split-K");
  CudaModelOptions defaults = atomic;  // the tensor-copy GEMVs as the device decides (H200: one stage each; g128: any Hopper)
  defaults.decode_tma_qkv_stages = defaults.decode_tma_gate_up_stages = CudaModelOptions::kTmaAuto;
  expect_close(defaults, "atomic split-K, tensor copies as the device decides");
  CudaModelOptions tma = atomic;  // gate/up through the tensor-copy-fed GEMV (per channel, or gemv_tma's grouped build)
  tma.decode_tma_gate_up_stages = 2;
  expect_close(tma, "gate/up by tensor copies");
  tma.decode_tma_qkv_stages = 1;  // and q/k/v past layer 0
  tma.decode_tma_prewait = 0;
  expect_close(tma, "q/k/v and gate/up by tensor copies");
  tma.decode_tma_down_stages = 2;  // and down (SiLU * up input, the grid of slices)
  expect_close(tma, "q/k/v, gate/up and down by tensor copies");
  tma.decode_tma_o_stages = 1;  // and o (added into the residual)
  expect_close(tma, "every product by tensor copies");
}

INSTANTIATE_TEST_SUITE_P(Groups, CudaModelGptq, ::testing::Values(int64_t{-1}, int64_t{128}),
                         [](const auto& info) { return info.param < 0 ? std::string("PerChannel") : "G" + std::to_string(info.param); });

TEST(CudaModel, RejectsBadTokensAndAFullContextChangingNothing) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  CudaModelOptions options;
  options.context_length = 4;
  options.prefill_chunk = 0;  // forward() through the decode step, so that a replayed decode matches it bitwise
  auto gpu = CudaModel::create(**model, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  std::vector<float> logits;
  EXPECT_EQ((*gpu)->decode(512, &logits).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->decode(-1, &logits).code(), ErrorCode::kInvalidArgument);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  EXPECT_EQ((*gpu)->forward(five, LogitsMode::kLast, &logits).code(), ErrorCode::kOutOfRange);
  EXPECT_EQ((*gpu)->position(), 0);
  ASSERT_TRUE((*gpu)->forward(std::span<const int32_t>(five.data(), 4), LogitsMode::kLast, &logits).ok());
  EXPECT_EQ(logits.size(), 512u);
  EXPECT_EQ((*gpu)->position(), 4);
  EXPECT_EQ((*gpu)->decode(1, &logits).code(), ErrorCode::kOutOfRange);
  // Rewinding and replaying gives the same logits (the graph reads the position from device memory).
  std::vector<float> again;
  (*gpu)->truncate(3);
  ASSERT_TRUE((*gpu)->decode(4, &again).ok());
  EXPECT_EQ(again, logits);
  (*gpu)->reset();
  EXPECT_EQ((*gpu)->position(), 0);
  options.context_length = int64_t{1} << 20;  // clamped to max_position_embeddings, as Session does
  auto clamped = CudaModel::create(**model, options);
  ASSERT_TRUE(clamped.ok()) << clamped.status().to_string();
  EXPECT_EQ((*clamped)->context_length(), 128);
}

TEST(CudaModel, AidreamsGreedyGenerationMatchesTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::vector<int32_t> expected =
      testing::read_ids(data_dir() / "models/aidreams260k/aidreams260K_greedy_n128.expected_ids.txt");
  ASSERT_EQ(expected.size(), 128u);
  CudaModelOptions options;
  options.context_length = 128;  // the model's max_position_embeddings
  auto gpu = CudaModel::create(**model, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  std::vector<int32_t> generated;
  std::vector<float> logits;
  int32_t token = 1;  // BOS, as the llama2.c golden run
  for (int i = 0; i < 128; ++i) {
    ASSERT_TRUE((*gpu)->decode(token, &logits).ok());
    token = argmax(logits);
    generated.push_back(token);
  }
  EXPECT_EQ(generated, expected);
}

// stash_kv / unstash_kv (the copies a Session switch makes) give back every layer's key and value rows
// exactly, across a stash that grows (its layer pitch changes) and one set aside while another sequence ran.
TEST(CudaModel, StashedKvRowsComeBackExactly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  CudaModelOptions options;
  options.context_length = 32;
  auto gpu = CudaModel::create(**model, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  CudaModel& m = **gpu;
  const int64_t layers = m.config().num_hidden_layers, kv_dim = m.config().kv_dim();
  auto rows = [&](int64_t n) {  // every layer's keys, then values, of positions [0, n)
    std::vector<uint16_t> all(static_cast<size_t>(2 * layers * n * kv_dim));
    for (int64_t l = 0; l < layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        const auto at = static_cast<size_t>((2 * l + v) * n * kv_dim);
        EXPECT_TRUE(m.read_kv(l, v == 1, n, std::span<uint16_t>(all).subspan(at, static_cast<size_t>(n * kv_dim))).ok());
      }
    }
    return all;
  };
  auto run = [&](std::initializer_list<int32_t> tokens) {
    for (const int32_t t : tokens) ASSERT_TRUE(m.decode(t, nullptr).ok());
  };
  CudaKvStash first, second;
  run({1, 42, 7, 300, 5});
  const std::vector<uint16_t> five = rows(5);
  ASSERT_TRUE(m.stash_kv(first).ok());
  EXPECT_EQ(first.position(), 5);
  m.reset();
  run({1, 9, 8, 7, 6, 5, 4, 3, 2});
  const std::vector<uint16_t> nine = rows(9);
  ASSERT_TRUE(m.stash_kv(second).ok());
  ASSERT_TRUE(m.unstash_kv(first).ok());
  EXPECT_EQ(m.position(), 5);
  EXPECT_EQ(rows(5), five);
  // The first sequence goes on past its stash's room: the stash grows (another pitch) and still round-trips.
  run({11, 12, 13, 14, 15, 16, 17});
  const std::vector<uint16_t> twelve = rows(12);
  const int64_t small_bytes = first.device_bytes();
  ASSERT_TRUE(m.stash_kv(first).ok());
  EXPECT_GT(first.device_bytes(), small_bytes);
  ASSERT_TRUE(m.unstash_kv(second).ok());
  EXPECT_EQ(m.position(), 9);
  EXPECT_EQ(rows(9), nine);
  ASSERT_TRUE(m.unstash_kv(first).ok());
  EXPECT_EQ(m.position(), 12);
  EXPECT_EQ(rows(12), twelve);
}

// CudaModelOptions::warm_copies (device-to-device copies at the end of create(), session 46) touch nothing of the
// model's: the same steps give the same logits bitwise with none.
TEST(CudaModel, WarmCopiesChangeNoLogits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::vector<std::vector<float>> runs;
  // None, the default count on each stream warm_copies_stream names, and many.
  const std::pair<int, int> cases[] = {{0, 0},
                                       {CudaModelOptions{}.warm_copies, CudaModelOptions::kWarmOwnStream},
                                       {CudaModelOptions{}.warm_copies, CudaModelOptions::kWarmKeptStream},
                                       {CudaModelOptions{}.warm_copies, CudaModelOptions::kWarmModelStream},
                                       {CudaModelOptions{}.warm_copies, CudaModelOptions::kWarmLegacyStream},
                                       {200, CudaModelOptions{}.warm_copies_stream}};
  for (const auto& [copies, stream] : cases) {
    CudaModelOptions options;
    options.context_length = 16;
    options.warm_copies = copies;
    options.warm_copies_stream = stream;
    auto gpu = CudaModel::create(**model, options);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    // Timed apart from the warm-up (CudaInitTimes::warm_copies_ms; 0 if create() left it unset).
    if (copies > 0) {
      EXPECT_GT((*gpu)->init_times().warm_copies_ms, 0.0) << "case " << runs.size();
    }
    std::vector<float> all, logits;
    for (const int32_t token : {1, 42, 7, 300, 5}) {
      ASSERT_TRUE((*gpu)->decode(token, &logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_GT(CudaModelOptions{}.warm_copies, 0);
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]) << "case " << i;
}

// An out-of-range warm_copies_stream is refused before anything touches a GPU (so this runs without one).
TEST(CudaModel, UnknownWarmCopiesStreamIsAClearError) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "the CUDA backend is not built";
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (const int bad : {-1, 4}) {
    CudaModelOptions options;
    options.warm_copies_stream = bad;
    auto gpu = CudaModel::create(**model, options);
    ASSERT_FALSE(gpu.ok());
    EXPECT_NE(gpu.status().to_string().find("warm_copies_stream " + std::to_string(bad)), std::string::npos)
        << gpu.status().to_string();
  }
}

// decode_top / forward_top (the k largest logits chosen on the GPU) against the full logits of the same
// steps, sorted on the host: the prompt processor's last row, a lone token, and a decode step.
TEST(CudaModel, TopLogitsAreTheLargestOfTheFullLogits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto gpu = CudaModel::create(**model, CudaModelOptions{});
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  CudaModel& m = **gpu;
  auto expect_top_of = [](const std::vector<float>& logits, int k, const TopLogits& top) {
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    ASSERT_TRUE(top.all.empty());
    ASSERT_EQ(top.ids.size(), static_cast<size_t>(k));
    ASSERT_EQ(top.values.size(), static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(top.ids[i], order[i]) << "rank " << i;
      EXPECT_EQ(top.values[i], logits[order[i]]) << "rank " << i;
    }
  };
  const std::vector<int32_t> prompt = {1, 20, 30, 40, 50, 60, 70, 80, 90};
  std::vector<float> logits;
  TopLogits top;
  for (int k : {1, 40, CudaModel::max_top_k(m.config())}) {
    SCOPED_TRACE("k " + std::to_string(k));
    m.reset();
    ASSERT_TRUE(m.forward(prompt, LogitsMode::kLast, &logits).ok());
    m.reset();
    ASSERT_TRUE(m.forward_top(prompt, k, &top).ok());
    EXPECT_EQ(m.position(), 9);
    expect_top_of(logits, k, top);
    ASSERT_TRUE(m.decode(7, &logits).ok());
    m.truncate(9);
    ASSERT_TRUE(m.decode_top(7, k, &top).ok());
    EXPECT_EQ(m.position(), 10);
    expect_top_of(logits, k, top);
    m.reset();
    ASSERT_TRUE(m.forward(std::span<const int32_t>(prompt.data(), 1), LogitsMode::kLast, &logits).ok());
    m.reset();
    ASSERT_TRUE(m.forward_top(std::span<const int32_t>(prompt.data(), 1), k, &top).ok());
    expect_top_of(logits, k, top);
  }
  // Refusals change nothing.
  const int64_t at = m.position();
  EXPECT_EQ(m.decode_top(1, 0, &top).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.decode_top(1, CudaModel::max_top_k(m.config()) + 1, &top).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.decode_top(1, 1, nullptr).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.forward_top(prompt, 0, &top).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.position(), at);
}

// decode_top_masked (a constraint's mask applied on the GPU between the LM head and the top-k) against the same
// step's full logits masked on the host: the same ids and values, disallowed tokens at -infinity (or, where the
// kernel cannot choose among too many -infinity ties, every masked logit).
TEST(CudaModel, MaskedTopLogitsAreTheLargestOfTheMaskedLogits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto gpu = CudaModel::create(**model, CudaModelOptions{});
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  CudaModel& m = **gpu;
  const int64_t vocab = m.config().vocab_size;
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = {1, 20, 30, 40};
  std::vector<float> logits;
  TopLogits top;
  for (int64_t allowed_count : {int64_t{3}, int64_t{50}, vocab / 2}) {
    for (int k : {1, 8, 40}) {
      SCOPED_TRACE("allowed " + std::to_string(allowed_count) + ", k " + std::to_string(k));
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<uint32_t> bits(static_cast<size_t>((vocab + 31) / 32), 0);
      for (int64_t i = 0; i < allowed_count; ++i) bits[ids[i] / 32] |= 1u << (ids[i] % 32);
      m.reset();
      ASSERT_TRUE(m.forward(prompt, LogitsMode::kNone, nullptr).ok());
      ASSERT_TRUE(m.decode(7, &logits).ok());
      m.truncate(4);
      int calls = 0;
      ASSERT_TRUE(m.decode_top_masked(7, k, [&](std::span<uint32_t> out) {
                     ASSERT_EQ(out.size(), bits.size());
                     std::copy(bits.begin(), bits.end(), out.begin());
                     ++calls;
                   }, &top).ok());
      EXPECT_EQ(calls, 1);
      EXPECT_EQ(m.position(), 5);
      std::vector<float> masked = logits;
      for (int64_t i = 0; i < vocab; ++i) {
        if (!((bits[i / 32] >> (i % 32)) & 1u)) masked[i] = -std::numeric_limits<float>::infinity();
      }
      if (!top.all.empty()) {
        EXPECT_EQ(top.all, masked);
        continue;
      }
      std::vector<int32_t> order(masked.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return masked[a] > masked[b]; });
      ASSERT_EQ(top.ids.size(), static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(top.ids[i], order[i]) << "rank " << i;
        EXPECT_EQ(top.values[i], masked[order[i]]) << "rank " << i;
      }
    }
  }
}

// `petrel bench --backend cuda`: pp and tg on the GPU where there is one, a clear error where there is none.
TEST(CudaModel, BenchBackendCudaRunsTgOrSaysWhyNot) {
  const std::string model = (data_dir() / "models/tiny-llama31").string();
  const std::string bench = testing::cli() + " bench " + model + " -p 8 -n 4 -r 1 -o json --backend ";
  auto bad = testing::run_command(bench + "tpu");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--backend must be cpu or cuda"), std::string::npos) << bad.output;
  auto r = testing::run_command(bench + "cuda", /*with_stderr=*/have_gpu() ? false : true);
  if (!have_gpu()) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(r.output.find("not built") != std::string::npos || r.output.find("no CUDA device") != std::string::npos)
        << r.output;
    return;
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"backend\": \"cuda\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"test\": \"pp8\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"test\": \"tg4\""), std::string::npos) << r.output;
}

}  // namespace
}  // namespace petrel
