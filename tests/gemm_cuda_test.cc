// kernels/cuda/gemm.h against kernels/ref: gemm_gptq (each algorithm) and gemm_dense (each dtype) row by row
// against ref::matmul on random data and awkward shapes. The tests that need a GPU skip without one; the plan
// and refusal tests are host-only and run everywhere (the plan is plain C++, gemm.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemm.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/quant/format.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::random_floats;
using testing::relative_l2;

// Against ref::matmul on exactly the inputs the kernel multiplies (x rounded to fp16; the weights exact or
// rounded to fp16 as the algorithm does, gemm.h): float32 sums in another order, and the tensor cores'
// float32 accumulation, which truncates (gemv_gptq.cu), over up to 4096 / 16 accumulations without the
// GEMV's periodic promotion.
constexpr double kToleranceSameInputs = 1e-4;
// Against ref::matmul on float32 x and exact weights: also the fp16 rounding of x (relative 2^-11 per
// element at most, ~3e-4 on the output for random data) and of grouped weights (2^-12, ~2e-4).
constexpr double kToleranceFp16 = 1e-3;
// bf16 keeps 8 bits: x rounded to bf16 costs relative 2^-9 per element, ~2.3e-3 on the output.
constexpr double kToleranceBf16 = 1e-2;

bool have_gpu() {
  auto devices = cuda::list_devices();
  return devices.ok() && !devices->empty();
}

const char* algorithm_name(cuda::GemmAlgorithm a) {
  switch (a) {
    case cuda::GemmAlgorithm::kAuto: return "auto";
    case cuda::GemmAlgorithm::kTensorCore: return "tensor core";
    case cuda::GemmAlgorithm::kDequantCublas: return "dequant + cuBLAS";
  }
  return "?";
}

// Random GPTQ v1 tensors: uniform codes and zeros, fp16 scales in [0.002, 0.02] (the values do not matter
// to the kernels, only the layout does).
quant::GptqTensors random_gptq(int64_t rows, int64_t cols, int bits, int64_t group, std::mt19937& rng) {
  quant::GptqTensors t;
  t.bits = bits;
  t.rows = rows;
  t.cols = cols;
  t.group_size = group < 0 ? cols : group;
  t.zero_offset = 1;
  const int64_t groups = cols / t.group_size;
  t.qweight.resize(cols * bits / 32 * rows);
  t.scales.resize(groups * rows);
  t.qzeros.resize(std::max<int64_t>(1, groups * rows * bits / 32));
  std::uniform_int_distribution<uint32_t> word;
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  for (int32_t& w : t.qweight) w = static_cast<int32_t>(word(rng));
  for (int32_t& w : t.qzeros) w = static_cast<int32_t>(word(rng));
  for (uint16_t& h : t.scales) h = f32_to_f16(scale(rng));
  return t;
}

cuda::DeviceGptqMatrix shape_only(int bits, int64_t rows, int64_t cols, int64_t group) {
  cuda::DeviceGptqMatrix m;
  m.bits = bits;
  m.rows = rows;
  m.cols = cols;
  m.group_size = group;
  return m;
}

cuda::DeviceBuffer device_copy(const void* data, size_t bytes) {
  auto buffer = cuda::DeviceBuffer::allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
  if (!buffer.ok()) return {};
  EXPECT_TRUE(buffer->upload(data, bytes).ok());
  return std::move(*buffer);
}

std::vector<float> rounded(const std::vector<float>& x, DType dtype) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = dtype == DType::kF16 ? f16_to_f32(f32_to_f16(x[i])) : bf16_to_f32(f32_to_bf16(x[i]));
  }
  return out;
}

// Poisons y, runs `call`, and returns y.
template <typename Call>
std::vector<float> run_poisoned(cuda::DeviceBuffer& y_dev, size_t n, Call call) {
  std::vector<float> got(n, 0.0f);
  EXPECT_TRUE(y_dev.fill_bytes(0xFF).ok());  // NaN everywhere: every output must be written
  const Status st = call();
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return std::vector<float>(n, NAN);
  const Status synced = cuda::synchronize();
  EXPECT_TRUE(synced.ok()) << synced.to_string();
  EXPECT_TRUE(y_dev.download(got.data(), n * 4).ok());
  return got;
}

// ---- Host-only: the plan and the refusals.

TEST(GemmCuda, RefusesUnsupportedMatricesWithAClearMessage) {
  Status st = cuda::gemm_gptq_supports(shape_only(3, 64, 256, 128));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gemm_gptq: "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("only 4- and 8-bit"), std::string::npos) << st.message();

  st = cuda::gemm_gptq_supports(shape_only(4, 12, 256, 128));  // qzeros would hold 1.5 words a group
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("multiple of 8"), std::string::npos) << st.message();
  EXPECT_TRUE(cuda::gemm_gptq_supports(shape_only(8, 12, 256, 128)).ok());
  EXPECT_TRUE(cuda::gemm_gptq_supports(shape_only(4, 16, 256, 256)).ok());
  EXPECT_FALSE(cuda::gemm_gptq_supports(shape_only(4, 16, 256, 16)).ok());   // steps would straddle groups
  EXPECT_FALSE(cuda::gemm_gptq_supports(shape_only(4, 16, 160, 128)).ok());  // group does not divide cols

  const cuda::DeviceGptqMatrix w = shape_only(4, 4096, 4096, 128);
  EXPECT_FALSE(cuda::plan_gemm_gptq(w, 0, 132, int64_t{256} << 20, 1 << 16).ok());  // m = 0
  cuda::GemmOptions odd_tile{cuda::GemmAlgorithm::kTensorCore, 24, 0, 0};
  EXPECT_FALSE(cuda::plan_gemm_gptq(w, 29, 132, int64_t{256} << 20, 1 << 16, odd_tile).ok());
  cuda::GemmOptions odd_warps{cuda::GemmAlgorithm::kTensorCore, 0, 6, 0};
  EXPECT_FALSE(cuda::plan_gemm_gptq(w, 29, 132, int64_t{256} << 20, 1 << 16, odd_warps).ok());
  // A workspace too small for even one tile of staged x, or one token and 64 rows of fp16 W.
  for (auto algorithm : {cuda::GemmAlgorithm::kTensorCore, cuda::GemmAlgorithm::kDequantCublas}) {
    auto plan = cuda::plan_gemm_gptq(w, 29, 132, 4096, 1 << 16, {algorithm});
    ASSERT_FALSE(plan.ok()) << algorithm_name(algorithm);
    EXPECT_NE(plan.status().message().find("workspace"), std::string::npos) << plan.status().message();
  }
  // A workspace that was never created: an error, not a crash (in either build).
  cuda::GemmWorkspace none;
  EXPECT_FALSE(cuda::gemm_gptq(w, nullptr, 4, nullptr, none).ok());
}

TEST(GemmCuda, PlansLlamaShapesInTheDefaultWorkspace) {
  // Llama-3.1-8B's layer linears on an H200 (132 SMs) with GemmWorkspace's default 256 MB: m = 512 fits in
  // one piece under both algorithms; small m gets enough blocks for every SM.
  const int64_t capacity = int64_t{256} << 20;
  struct Shape { int64_t rows, cols; };
  for (const Shape& s : {Shape{4096, 4096}, Shape{1024, 4096}, Shape{14336, 4096}, Shape{4096, 14336}}) {
    for (int64_t group : {int64_t{128}, s.cols}) {
      const cuda::DeviceGptqMatrix w = shape_only(4, s.rows, s.cols, group);
      const int64_t steps = s.cols / 8 / 4;
      for (int64_t m : {1, 29, 64, 512, 2048}) {
        SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + " group " + std::to_string(group) +
                     " m " + std::to_string(m));
        for (auto algorithm : {cuda::GemmAlgorithm::kAuto, cuda::GemmAlgorithm::kTensorCore,
                               cuda::GemmAlgorithm::kDequantCublas}) {
          auto plan = cuda::plan_gemm_gptq(w, m, 132, capacity, 1 << 16, {algorithm});
          ASSERT_TRUE(plan.ok()) << plan.status().to_string();
          EXPECT_NE(plan->algorithm, cuda::GemmAlgorithm::kAuto);
          EXPECT_LE(plan->scratch_bytes, capacity);
          if (m <= 512) {
            EXPECT_EQ(plan->m_chunk, m) << algorithm_name(algorithm);
          }
          if (plan->algorithm == cuda::GemmAlgorithm::kTensorCore) {
            EXPECT_EQ(plan->steps_per_split % cuda::GemmPlan::kChunkSteps, 0);
            EXPECT_GE(plan->steps_per_split * plan->k_splits, steps);
            EXPECT_LT(plan->steps_per_split * (plan->k_splits - 1), steps);  // no empty split
            EXPECT_EQ(plan->row_blocks, (s.rows + 32 * plan->warps - 1) / (32 * plan->warps));
            const int64_t blocks = plan->row_blocks * plan->token_tiles * plan->k_splits;
            if (m <= 64) {
              EXPECT_GE(blocks, 99) << "too few blocks for the SMs";  // 3 in 4 SMs busy at least
            }
            EXPECT_LE(plan->shared_bytes, 227 * 1024);
          } else {
            EXPECT_EQ(plan->slice_rows, s.rows);  // all of W dequantized at once
          }
        }
      }
    }
  }
}

TEST(GemmCuda, PlansAShortPromptsGateUpAsOneBlockAnSm) {
  // gate+up as one launch (28,672 rows) for a chat turn of 17..32 tokens: 3 stages (157 KB of shared memory, so
  // one block an SM) and no split-K; measured faster in the overlapped prompt than 2 stages with 1 or 2 splits
  // (gemm.cc). Longer chunks and smaller matrices keep the general rule.
  const int64_t capacity = int64_t{256} << 20;
  for (int64_t group : {int64_t{128}, int64_t{4096}}) {
    const cuda::DeviceGptqMatrix gate_up = shape_only(4, 28672, 4096, group);
    for (int64_t m : {17, 29, 32}) {
      SCOPED_TRACE("group " + std::to_string(group) + " m " + std::to_string(m));
      auto plan = cuda::plan_gemm_gptq(gate_up, m, 132, capacity, 1 << 16);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      EXPECT_EQ(plan->token_tile, 32);
      EXPECT_EQ(plan->warps, 8);
      EXPECT_EQ(plan->stages, 3);
      EXPECT_EQ(plan->k_splits, 1);
      EXPECT_EQ(plan->row_blocks, 112);
      EXPECT_GT(plan->shared_bytes, 228 * 1024 / 2) << "two blocks would fit on an SM";
    }
    auto longer = cuda::plan_gemm_gptq(gate_up, 64, 132, capacity, 1 << 16);
    ASSERT_TRUE(longer.ok());
    EXPECT_EQ(longer->stages, 2);
    auto qo = cuda::plan_gemm_gptq(shape_only(4, 4096, 4096, group), 29, 132, capacity, 1 << 16);
    ASSERT_TRUE(qo.ok());
    EXPECT_EQ(qo->stages, 2);
  }
  // An explicit stage count is kept.
  cuda::GemmOptions two;
  two.stages = 2;
  auto plan = cuda::plan_gemm_gptq(shape_only(4, 28672, 4096, 128), 29, 132, capacity, 1 << 16, two);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stages, 2);
}

// ---- On the GPU.

struct GptqCase {
  int bits;
  int64_t rows, cols, group;  // group -1: per-channel
  std::string name() const {
    return std::to_string(bits) + "-bit " + std::to_string(rows) + "x" + std::to_string(cols) +
           (group < 0 ? " per-channel" : " g" + std::to_string(group));
  }
};

std::vector<GptqCase> gptq_cases() {
  std::vector<GptqCase> cases;
  // 4-bit rows are multiples of 8 (qzeros); 8-bit takes any multiple of 4.
  for (int bits : {4, 8}) {
    const std::vector<int64_t> rows = bits == 4 ? std::vector<int64_t>{8, 24, 264, 1032} : std::vector<int64_t>{4, 12, 260, 1028};
    for (int64_t r : rows) {
      for (int64_t cols : {32, 160, 4096}) {
        for (int64_t group : {int64_t{-1}, int64_t{32}, int64_t{128}}) {
          if (group > 0 && (group >= cols || cols % group != 0)) continue;  // per-channel already, or refused
          cases.push_back({bits, r, cols, group});
        }
      }
    }
  }
  return cases;
}

struct UploadedGptq {
  quant::GptqTensors host;
  cuda::DeviceBuffer qweight, scales, qzeros;
  cuda::DeviceGptqMatrix view;
  std::vector<uint16_t> w16;  // fp16(scale * (code - zero)), [rows, cols]: the weights both algorithms round to
};

UploadedGptq upload(const GptqCase& c, std::mt19937& rng) {
  UploadedGptq u;
  u.host = random_gptq(c.rows, c.cols, c.bits, c.group, rng);
  u.qweight = device_copy(u.host.qweight.data(), u.host.qweight.size() * 4);
  u.scales = device_copy(u.host.scales.data(), u.host.scales.size() * 2);
  u.qzeros = device_copy(u.host.qzeros.data(), u.host.qzeros.size() * 4);
  u.view = shape_only(c.bits, c.rows, c.cols, u.host.group_size);
  u.view.zero_offset = u.host.zero_offset;
  u.view.qweight = u.qweight.as<const int32_t>();
  u.view.scales = u.scales.as<const uint16_t>();
  u.view.qzeros = u.qzeros.as<const int32_t>();
  const ref::GptqMatrix m = u.host.view();
  u.w16.resize(c.rows * c.cols);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t k = 0; k < c.cols; ++k) u.w16[r * c.cols + k] = f32_to_f16(m.at(r, k));
  }
  return u;
}

TEST(GemmCuda, GptqMatchesReferenceOnRandomAndAwkwardShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(41);
  auto workspace = cuda::GemmWorkspace::create();
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  const int64_t ms[] = {1, 3, 17, 64, 129, 300};
  double worst_same = 0, worst_fp32 = 0;
  int calls = 0;
  for (const GptqCase& c : gptq_cases()) {
    SCOPED_TRACE(c.name());
    UploadedGptq u = upload(c, rng);
    const ref::GptqMatrix m = u.host.view();
    const std::vector<float> x = random_floats(rng, 300 * c.cols);
    const std::vector<float> x16 = rounded(x, DType::kF16);
    auto x_dev = device_copy(x.data(), x.size() * 4);
    auto y_dev = cuda::DeviceBuffer::allocate(300 * c.rows * 4);
    ASSERT_TRUE(y_dev.ok());
    for (int64_t n : ms) {
      SCOPED_TRACE("m " + std::to_string(n));
      std::vector<float> want(n * c.rows), want_x16(n * c.rows), want_w16(n * c.rows);
      ref::matmul(x.data(), n, m, want.data());
      ref::matmul(x16.data(), n, m, want_x16.data());
      ref::matmul(x16.data(), n, ref::DenseMatrix{DType::kF16, c.rows, c.cols, u.w16.data()}, want_w16.data());
      for (auto algorithm : {cuda::GemmAlgorithm::kTensorCore, cuda::GemmAlgorithm::kDequantCublas,
                             cuda::GemmAlgorithm::kAuto}) {
        SCOPED_TRACE(algorithm_name(algorithm));
        auto plan = cuda::plan_gemm_gptq(u.view, n, workspace->multiprocessors(), workspace->capacity(),
                                         workspace->counter_capacity(), {algorithm});
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const std::vector<float> got = run_poisoned(*y_dev, n * c.rows, [&] {
          return cuda::gemm_gptq(u.view, x_dev.as<float>(), n, y_dev->as<float>(), *workspace, nullptr, {algorithm});
        });
        ++calls;
        // Per-channel weights stay exact in the fused kernel; everything else multiplies fp16-rounded weights.
        const bool exact_weights = plan->algorithm == cuda::GemmAlgorithm::kTensorCore && c.group < 0;
        const double same = relative_l2(got, exact_weights ? want_x16 : want_w16);
        const double fp32 = relative_l2(got, want);
        EXPECT_LE(same, kToleranceSameInputs);
        EXPECT_LE(fp32, kToleranceFp16);
        worst_same = std::max(worst_same, same);
        worst_fp32 = std::max(worst_fp32, fp32);
      }
    }
  }
  std::printf("[ cuda gemm_gptq ] %d calls; worst relative L2 %.3g against ref on the same fp16 inputs, %.3g against "
              "float32 x\n", calls, worst_same, worst_fp32);
}

TEST(GemmCuda, TensorCoreSplitsAndTilesAgreeAndAreReproducible) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(43);
  auto workspace = cuda::GemmWorkspace::create();
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  for (const GptqCase& c : {GptqCase{4, 1032, 4096, 128}, GptqCase{4, 264, 4096, -1}, GptqCase{8, 260, 4096, -1},
                            GptqCase{4, 24, 160, 32}}) {
    SCOPED_TRACE(c.name());
    UploadedGptq u = upload(c, rng);
    const std::vector<float> x = rounded(random_floats(rng, 129 * c.cols), DType::kF16);
    auto x_dev = device_copy(x.data(), x.size() * 4);
    auto y_dev = cuda::DeviceBuffer::allocate(129 * c.rows * 4);
    ASSERT_TRUE(y_dev.ok());
    for (int64_t n : {5, 17, 129}) {
      std::vector<float> want(n * c.rows);
      if (c.group < 0) {
        ref::matmul(x.data(), n, u.host.view(), want.data());
      } else {
        ref::matmul(x.data(), n, ref::DenseMatrix{DType::kF16, c.rows, c.cols, u.w16.data()}, want.data());
      }
      for (int tile : {8, 16, 32, 64}) {
        for (int warps : {4, 8}) {
          for (int splits : {0, 1, 3}) {
            for (int stages : {2, 3}) {
              SCOPED_TRACE("m " + std::to_string(n) + " tile " + std::to_string(tile) + " warps " +
                           std::to_string(warps) + " k_splits " + std::to_string(splits) + " stages " +
                           std::to_string(stages));
              const cuda::GemmOptions options{cuda::GemmAlgorithm::kTensorCore, tile, warps, splits, stages};
              std::vector<float> first;
              for (int run = 0; run < 2; ++run) {  // twice: the split-K counters reset, results are bitwise equal
                const std::vector<float> got = run_poisoned(*y_dev, n * c.rows, [&] {
                  return cuda::gemm_gptq(u.view, x_dev.as<float>(), n, y_dev->as<float>(), *workspace, nullptr, options);
                });
                EXPECT_LE(relative_l2(got, want), kToleranceSameInputs);
                if (run == 0) {
                  first = got;
                } else {
                  EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * 4), 0) << "not reproducible";
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(GemmCuda, SmallWorkspaceCutsTheProductIntoPieces) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(47);
  auto workspace = cuda::GemmWorkspace::create(int64_t{1} << 20);
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  const GptqCase c{4, 1032, 4096, 128};
  UploadedGptq u = upload(c, rng);
  const int64_t n = 300;
  const std::vector<float> x = random_floats(rng, n * c.cols), x16 = rounded(x, DType::kF16);
  auto x_dev = device_copy(x.data(), x.size() * 4);
  auto y_dev = cuda::DeviceBuffer::allocate(n * c.rows * 4);
  ASSERT_TRUE(y_dev.ok());
  std::vector<float> want(n * c.rows);
  ref::matmul(x16.data(), n, ref::DenseMatrix{DType::kF16, c.rows, c.cols, u.w16.data()}, want.data());
  for (auto algorithm : {cuda::GemmAlgorithm::kTensorCore, cuda::GemmAlgorithm::kDequantCublas}) {
    SCOPED_TRACE(algorithm_name(algorithm));
    auto plan = cuda::plan_gemm_gptq(u.view, n, workspace->multiprocessors(), workspace->capacity(),
                                     workspace->counter_capacity(), {algorithm});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_LT(plan->m_chunk, n) << "the test should cut m";
    if (algorithm == cuda::GemmAlgorithm::kDequantCublas) {
      EXPECT_LT(plan->slice_rows, c.rows) << "and W's rows";
    }
    const std::vector<float> got = run_poisoned(*y_dev, n * c.rows, [&] {
      return cuda::gemm_gptq(u.view, x_dev.as<float>(), n, y_dev->as<float>(), *workspace, nullptr, {algorithm});
    });
    EXPECT_LE(relative_l2(got, want), kToleranceSameInputs);
  }
  // Dense bf16 through the same small scratch: 4096-wide x in pieces of 128 tokens.
  std::vector<uint16_t> w(c.rows * c.cols);
  std::vector<float> w_widened(w.size());
  const std::vector<float> w_values = random_floats(rng, w.size(), 0.05f);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = f32_to_bf16(w_values[i]);
    w_widened[i] = bf16_to_f32(w[i]);
  }
  auto w_dev = device_copy(w.data(), w.size() * 2);
  const std::vector<float> xb = rounded(x, DType::kBF16);
  ref::matmul(xb.data(), n, ref::DenseMatrix{DType::kBF16, c.rows, c.cols, w.data()}, want.data());
  const cuda::DeviceDenseMatrix dense{DType::kBF16, c.rows, c.cols, w_dev.data()};
  const std::vector<float> got = run_poisoned(*y_dev, n * c.rows, [&] {
    return cuda::gemm_dense(dense, x_dev.as<float>(), n, y_dev->as<float>(), *workspace);
  });
  EXPECT_LE(relative_l2(got, want), kToleranceSameInputs);
}

// gemm_gptq_group against the separate kernels it replaces (cuda::rms_norm with its residual add or
// cuda::silu_mul, then gemm_gptq per member with the same options), which the tests above and
// kernels_cuda_test.cc check against kernels/ref: the same bits, and the residual stream updated alike.
TEST(GemmCuda, GroupWithFusedInputGivesTheSeparateKernelsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(59);
  auto workspace = cuda::GemmWorkspace::create();
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  struct Case {
    int bits;
    int64_t cols, group;
    std::vector<int64_t> rows;  // one per member
  };
  // 4096: Llama's hidden size (512 threads a row); 8320: past the norm's registers (1024 threads x 8), the
  // rest in its loop; 160: one warp; 8-bit.
  // Members in one launch (GemmOptions::one_launch) where all but the last have whole row blocks: 512 x 2,
  // 256 x 2, 512 + 256 + 256 (q/k/v-like); not 1032 + 264 or 24 + 24 (rows short of a block).
  const Case cases[] = {{4, 4096, -1, {1032, 264}}, {4, 4096, 128, {264}}, {4, 8320, 128, {24, 8}},
                        {4, 160, 32, {24, 24, 8}}, {8, 4096, -1, {260, 12}}, {4, 4096, -1, {512, 512}},
                        {4, 4096, 128, {256, 256}}, {4, 160, 32, {24, 24}}, {4, 4096, -1, {512, 256, 256}}};
  // kAuto would take dequantize + cuBLAS for the smaller matrices past 48 tokens, which the group refuses. The
  // tile, warps, splits and stages are fixed so that one launch (planned as one matrix of all) sums like each alone.
  cuda::GemmOptions fused{cuda::GemmAlgorithm::kTensorCore, 16, 4, 2, 2};
  // Element-wise equality of floats compares NaN unequal: every output is written (the buffers start as NaN).
  auto download = [](const cuda::DeviceBuffer& buffer, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(buffer.download(v.data(), n * 4).ok());
    return v;
  };
  int compared = 0;
  for (const Case& c : cases) {
    std::deque<UploadedGptq> mats;  // move-only members: a deque never relocates them
    for (int64_t r : c.rows) mats.push_back(upload(GptqCase{c.bits, r, c.cols, c.group}, rng));
    const int64_t max_m = 150;
    const std::vector<float> x = random_floats(rng, max_m * c.cols), residual = random_floats(rng, max_m * c.cols),
                             up = random_floats(rng, max_m * c.cols);
    std::vector<uint16_t> norm_bf16(c.cols);
    const std::vector<float> norm_f32 = random_floats(rng, c.cols, 0.1f);
    for (int64_t i = 0; i < c.cols; ++i) norm_bf16[i] = f32_to_bf16(1.0f + norm_f32[i]);
    auto norm_dev = device_copy(norm_bf16.data(), norm_bf16.size() * 2);
    auto residual_dev = device_copy(residual.data(), residual.size() * 4);
    auto up_dev = device_copy(up.data(), up.size() * 4);
    auto x_fused = device_copy(x.data(), x.size() * 4), x_separate = device_copy(x.data(), x.size() * 4);
    auto staged = cuda::DeviceBuffer::allocate(max_m * c.cols * 4);
    ASSERT_TRUE(staged.ok());
    std::deque<cuda::DeviceBuffer> y_fused, y_separate;
    std::vector<cuda::GemvGroupMember> members;
    for (size_t i = 0; i < mats.size(); ++i) {
      y_fused.push_back(cuda::DeviceBuffer::allocate(max_m * c.rows[i] * 4).value());
      y_separate.push_back(cuda::DeviceBuffer::allocate(max_m * c.rows[i] * 4).value());
      members.push_back({&mats[i].view, y_fused.back().as<float>()});
    }
    for (int64_t m : {1, 5, 29, 64, 150}) {
      for (cuda::GemvInput input : {cuda::GemvInput::kPlain, cuda::GemvInput::kRmsNorm, cuda::GemvInput::kSiluMul}) {
        for (bool with_residual : {false, true}) {
          if (with_residual && input != cuda::GemvInput::kRmsNorm) continue;
          SCOPED_TRACE(std::to_string(c.bits) + "-bit cols " + std::to_string(c.cols) + " m " + std::to_string(m) +
                       " input " + std::to_string(static_cast<int>(input)) + (with_residual ? " + residual" : ""));
          ASSERT_TRUE(cuda::gemm_gptq_group_applies(members, m, *workspace, fused));
          ASSERT_TRUE(x_fused.upload(x.data(), x.size() * 4).ok());
          ASSERT_TRUE(x_separate.upload(x.data(), x.size() * 4).ok());
          for (auto& y : y_fused) ASSERT_TRUE(y.fill_bytes(0xFF).ok());
          cuda::GemmInputFusion fusion;
          fusion.input = input;
          fusion.norm_weight = cuda::DeviceVector{DType::kBF16, c.cols, norm_dev.data()};
          fusion.norm_eps = 1e-5f;
          if (with_residual) {
            fusion.residual = residual_dev.as<float>();
            fusion.residual_sum = x_fused.as<float>();  // in place, as the prompt processor does
          }
          fusion.up = up_dev.as<float>();
          Status st = cuda::gemm_gptq_group(members, x_fused.as<float>(), m, *workspace, nullptr, fused, fusion);
          ASSERT_TRUE(st.ok()) << st.to_string();
          // The separate kernels.
          const float* input_dev = x_separate.as<float>();
          if (input == cuda::GemvInput::kRmsNorm) {
            st = cuda::rms_norm(x_separate.as<float>(), with_residual ? residual_dev.as<float>() : nullptr, m, c.cols,
                                fusion.norm_weight, fusion.norm_eps, staged->as<float>());
            input_dev = staged->as<float>();
          } else if (input == cuda::GemvInput::kSiluMul) {
            st = cuda::silu_mul(x_separate.as<float>(), up_dev.as<float>(), m * c.cols, staged->as<float>());
            input_dev = staged->as<float>();
          }
          ASSERT_TRUE(st.ok()) << st.to_string();
          for (size_t i = 0; i < mats.size(); ++i) {
            st = cuda::gemm_gptq(mats[i].view, input_dev, m, y_separate[i].as<float>(), *workspace, nullptr, fused);
            ASSERT_TRUE(st.ok()) << st.to_string();
          }
          ASSERT_TRUE(cuda::synchronize().ok());
          for (size_t i = 0; i < mats.size(); ++i) {
            EXPECT_EQ(download(y_fused[i], m * c.rows[i]), download(y_separate[i], m * c.rows[i])) << "member " << i;
            ++compared;
          }
          const std::vector<float> sum_fused = download(x_fused, m * c.cols);
          EXPECT_EQ(sum_fused, download(x_separate, m * c.cols)) << "residual stream";
          if (with_residual) {
            EXPECT_NE(sum_fused[0], x[0]) << "the residual was not added";
          }
          if (input == cuda::GemvInput::kPlain && mats.size() > 1) {
            // Planned (one launch: splits chosen for all members together): the same products up to sum order.
            cuda::GemmOptions planned;
            planned.algorithm = cuda::GemmAlgorithm::kTensorCore;
            st = cuda::gemm_gptq_group(members, x_fused.as<float>(), m, *workspace, nullptr, planned);
            ASSERT_TRUE(st.ok()) << st.to_string();
            ASSERT_TRUE(cuda::synchronize().ok());
            for (size_t i = 0; i < mats.size(); ++i) {
              EXPECT_LE(relative_l2(download(y_fused[i], m * c.rows[i]), download(y_separate[i], m * c.rows[i])), 1e-5)
                  << "planned, member " << i;
            }
          }
        }
      }
    }
  }
  std::printf("[ cuda gemm_gptq_group ] %d products bitwise equal to the separate kernels'\n", compared);

  // Refusals: members that read different inputs, a plan that is not the fused kernel, a bad fusion.
  UploadedGptq a = upload(GptqCase{4, 24, 4096, -1}, rng), b = upload(GptqCase{4, 24, 160, -1}, rng);
  auto x_dev = cuda::DeviceBuffer::allocate(8 * 4096 * 4), y_dev = cuda::DeviceBuffer::allocate(8 * 24 * 4 * 2);
  ASSERT_TRUE(x_dev.ok() && y_dev.ok());
  const cuda::GemvGroupMember mixed[] = {{&a.view, y_dev->as<float>()}, {&b.view, y_dev->as<float>() + 8 * 24}};
  EXPECT_EQ(cuda::gemm_gptq_group(mixed, x_dev->as<float>(), 8, *workspace).code(), ErrorCode::kInvalidArgument);
  const cuda::GemvGroupMember one[] = {{&a.view, y_dev->as<float>()}};
  cuda::GemmOptions cublas;
  cublas.algorithm = cuda::GemmAlgorithm::kDequantCublas;
  EXPECT_FALSE(cuda::gemm_gptq_group_applies(one, 8, *workspace, cublas));
  EXPECT_EQ(cuda::gemm_gptq_group(one, x_dev->as<float>(), 8, *workspace, nullptr, cublas).code(), ErrorCode::kUnsupported);
  EXPECT_EQ(cuda::gemm_gptq_group(std::span<const cuda::GemvGroupMember>(), x_dev->as<float>(), 8, *workspace).code(),
            ErrorCode::kInvalidArgument);
  cuda::GemmInputFusion bad_norm;
  bad_norm.input = cuda::GemvInput::kRmsNorm;
  bad_norm.norm_weight = cuda::DeviceVector{DType::kF32, 100, x_dev->data()};
  EXPECT_EQ(cuda::gemm_gptq_group(one, x_dev->as<float>(), 8, *workspace, nullptr, {}, bad_norm).code(),
            ErrorCode::kInvalidArgument);
  bad_norm.norm_weight.size = 4096;
  bad_norm.residual = x_dev->as<float>();  // without residual_sum
  EXPECT_EQ(cuda::gemm_gptq_group(one, x_dev->as<float>(), 8, *workspace, nullptr, {}, bad_norm).code(),
            ErrorCode::kInvalidArgument);
  cuda::GemmInputFusion no_up;
  no_up.input = cuda::GemvInput::kSiluMul;
  EXPECT_EQ(cuda::gemm_gptq_group(one, x_dev->as<float>(), 8, *workspace, nullptr, {}, no_up).code(),
            ErrorCode::kInvalidArgument);
}

TEST(GemmCuda, DenseMatchesReferenceForEachDtype) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(53);
  auto workspace = cuda::GemmWorkspace::create();
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  double worst[3] = {0, 0, 0};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (int64_t rows : {4, 12, 260, 1028}) {
    for (int64_t cols : {32, 160, 4096}) {
      const std::vector<float> values = random_floats(rng, rows * cols, 0.05f);
      const std::vector<float> x = random_floats(rng, 300 * cols);
      auto x_dev = device_copy(x.data(), x.size() * 4);
      auto y_dev = cuda::DeviceBuffer::allocate(300 * rows * 4);
      ASSERT_TRUE(y_dev.ok());
      for (int d = 0; d < 3; ++d) {
        const DType dtype = dtypes[d];
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
        std::vector<uint8_t> bytes(rows * cols * dtype_size(dtype));
        for (int64_t i = 0; i < rows * cols; ++i) {
          if (dtype == DType::kF32) std::memcpy(bytes.data() + 4 * i, &values[i], 4);
          else {
            const uint16_t h = dtype == DType::kF16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
            std::memcpy(bytes.data() + 2 * i, &h, 2);
          }
        }
        auto w_dev = device_copy(bytes.data(), bytes.size());
        const ref::DenseMatrix host{dtype, rows, cols, bytes.data()};
        const cuda::DeviceDenseMatrix dense{dtype, rows, cols, w_dev.data()};
        const std::vector<float> x_rounded = dtype == DType::kF32 ? x : rounded(x, dtype);
        for (int64_t n : {1, 3, 17, 64, 129, 300}) {
          SCOPED_TRACE("m " + std::to_string(n));
          std::vector<float> want(n * rows), want_rounded(n * rows);
          ref::matmul(x.data(), n, host, want.data());
          ref::matmul(x_rounded.data(), n, host, want_rounded.data());
          const std::vector<float> got = run_poisoned(*y_dev, n * rows, [&] {
            return cuda::gemm_dense(dense, x_dev.as<float>(), n, y_dev->as<float>(), *workspace);
          });
          const double same = relative_l2(got, want_rounded);
          EXPECT_LE(same, dtype == DType::kF32 ? 1e-5 : kToleranceSameInputs);
          EXPECT_LE(relative_l2(got, want), dtype == DType::kBF16 ? kToleranceBf16 : kToleranceFp16);
          worst[d] = std::max(worst[d], same);
        }
      }
    }
  }
  std::printf("[ cuda gemm_dense ] worst relative L2 against ref on the same rounded x: f32 %.3g, f16 %.3g, bf16 %.3g\n",
              worst[0], worst[1], worst[2]);
  // Refusals.
  cuda::DeviceDenseMatrix bad{DType::kI32, 4, 4, nullptr};
  EXPECT_FALSE(cuda::gemm_dense(bad, nullptr, 1, nullptr, *workspace).ok());
}

}  // namespace
}  // namespace petrel
