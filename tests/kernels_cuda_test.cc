// kernels/cuda against kernels/ref, on random and awkward shapes. The tests that need a GPU skip without one
// (CI builds the CUDA code and runs these on a machine with no GPU); the rest run everywhere.
#if PETREL_HAVE_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"

namespace petrel {
namespace {

// Relative L2 error allowed against ref::matmul on the same input the kernel multiplies (x itself for the
// CUDA-core kernel, x rounded to fp16 for the tensor-core one): float32 sums in another order; the tensor
// cores' float32 accumulation also truncates (gemv_gptq.cu keeps those sums short).
constexpr double kTolerance = 1e-5;
// Against ref::matmul on float32 x, the tensor-core kernel also carries the fp16 rounding of x
// (relative 2^-11 per element at most, about 3e-4 on the output for random data).
constexpr double kToleranceFp16Input = 1e-3;

bool have_gpu() {
  auto devices = cuda::list_devices();
  return devices.ok() && !devices->empty();
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // an unwritten (NaN-poisoned) or broken output
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// GPTQ v1 tensors rewritten as gptq_v2 (stored zero = real zero, zero_offset 0).
void to_gptq_v2(quant::GptqTensors& t) {
  const int per_word = 32 / t.bits;
  const uint32_t mask = (1u << t.bits) - 1;
  for (int32_t& word : t.qzeros) {
    uint32_t out = 0;
    for (int k = 0; k < per_word; ++k) {
      const uint32_t real = ((static_cast<uint32_t>(word) >> (t.bits * k)) & mask) + 1;
      out |= (real & mask) << (t.bits * k);
    }
    word = static_cast<int32_t>(out);
  }
  t.zero_offset = 0;
}

struct GemvCase {
  int64_t rows, cols, group;  // group -1: per-channel
  bool symmetric;
  int bits;
  bool v2 = false;
  std::string name() const {
    return std::to_string(bits) + "-bit " + std::to_string(rows) + "x" + std::to_string(cols) +
           (group < 0 ? " per-channel" : " g" + std::to_string(group)) + (symmetric ? " sym" : " asym") +
           (v2 ? " v2" : "");
  }
};

TEST(KernelsCuda, ListsDevicesWithoutError) {
  auto devices = cuda::list_devices();
  ASSERT_TRUE(devices.ok()) << devices.status().to_string();
  for (const cuda::DeviceInfo& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0);
    EXPECT_GT(d.multiprocessors, 0);
  }
  if (devices->empty()) {
    EXPECT_FALSE(cuda::no_device_reason().empty());
  }
}

TEST(KernelsCuda, GemvRefusesWhatItDoesNotHandle) {
  cuda::DeviceGptqMatrix m;
  m.bits = 4;
  m.rows = 64;
  m.cols = 256;
  m.group_size = 128;
  EXPECT_TRUE(cuda::gemv_gptq_supports(m).ok());
  m.group_size = 256;  // per-channel
  EXPECT_TRUE(cuda::gemv_gptq_supports(m).ok());
  m.group_size = 16;  // steps of 4 words would straddle groups
  EXPECT_FALSE(cuda::gemv_gptq_supports(m).ok());
  m.group_size = 128;
  m.bits = 3;
  EXPECT_FALSE(cuda::gemv_gptq_supports(m).ok());
  m.bits = 8;
  m.rows = 66;  // not a multiple of 4
  EXPECT_FALSE(cuda::gemv_gptq_supports(m).ok());
  m.rows = 68;
  EXPECT_TRUE(cuda::gemv_gptq_supports(m).ok());
  m.cols = 250;
  m.group_size = 250;
  EXPECT_FALSE(cuda::gemv_gptq_supports(m).ok());
}

TEST(KernelsCuda, PlanSplitsSmallMatricesAndBoundsSharedMemory) {
  // The splits measured fastest on an H200 (132 SMs) for Llama-3.1-8B's shapes (see gemv_gptq.cu).
  struct Expected { int64_t rows, cols; int bits, k_splits; };
  for (const Expected& e : {Expected{4096, 4096, 4, 16}, Expected{1024, 4096, 4, 16}, Expected{14336, 4096, 4, 4},
                            Expected{4096, 14336, 4, 16}, Expected{128256, 4096, 8, 1}}) {
    cuda::DeviceGptqMatrix m;
    m.bits = e.bits;
    m.rows = e.rows;
    m.cols = e.cols;
    m.group_size = 128;
    auto plan = cuda::plan_gemv_gptq(m, 132, 1 << 20);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->k_splits, e.k_splits) << e.rows << "x" << e.cols;
    EXPECT_EQ(plan->row_blocks, (e.rows + 127) / 128);
  }
  cuda::DeviceGptqMatrix m;
  m.bits = 4;
  m.rows = 128256;
  m.cols = 65536;  // 8192 words: 128 KB of fp16 x, more than one block's shared memory
  m.group_size = m.cols;
  auto plan = cuda::plan_gemv_gptq(m, 132, int64_t{1} << 22);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_LE(plan->shared_bytes, 48 * 1024);
  EXPECT_GE(plan->k_splits, 3);
  plan = cuda::plan_gemv_gptq(m, 132, 1 << 18);  // too little workspace for the splits it must make
  EXPECT_FALSE(plan.ok());
}

TEST(KernelsCuda, GemvMatchesReferenceOnRandomAndAwkwardShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const GemvCase cases[] = {
      {4096, 4096, -1, true, 4},      {4096, 4096, 128, false, 4},  {200, 4096, 128, false, 4},
      {72, 14336, 128, true, 4},      {520, 14336, -1, false, 4},   {136, 8, -1, false, 4},
      {8, 64, 32, false, 4},          {1000, 64, 64, true, 4},      {264, 4096, 32, false, 4, true},
      {1032, 1024, 64, true, 4, true}, {4, 4, -1, true, 8},         {52, 256, -1, true, 8},
      {36, 128, 64, false, 8},        {1028, 4096, -1, true, 8},    {132, 14336, 32, false, 8, true},
      {4100, 4096, 128, true, 8},
  };
  auto workspace = cuda::GemvWorkspace::create();
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  double worst[2] = {0, 0}, worst_fp32_input = 0;
  for (const GemvCase& c : cases) {
    SCOPED_TRACE(c.name());
    std::vector<float> w(c.rows * c.cols), x(c.cols), x16(c.cols);
    for (float& v : w) v = 0.05f * normal(rng);
    for (float& v : x) v = normal(rng);
    for (int64_t i = 0; i < c.cols; ++i) x16[i] = f16_to_f32(f32_to_f16(x[i]));
    quant::QuantScheme scheme{c.bits, c.group, c.symmetric, false};
    auto packed = quant::pack_gptq(quant::quantize_rtn(w.data(), c.rows, c.cols, scheme));
    ASSERT_TRUE(packed.ok()) << packed.status().to_string();
    if (c.v2) to_gptq_v2(*packed);
    const ref::GptqMatrix m = packed->view();
    std::vector<float> want(c.rows), want16(c.rows);
    ref::matmul(x.data(), 1, m, want.data());
    ref::matmul(x16.data(), 1, m, want16.data());

    auto weights = cuda::DeviceGptqWeights::upload(m);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    auto x_dev = cuda::DeviceBuffer::allocate(c.cols * 4);
    auto y_dev = cuda::DeviceBuffer::allocate(c.rows * 4);
    ASSERT_TRUE(x_dev.ok() && y_dev.ok());
    ASSERT_TRUE(x_dev->upload(x.data(), c.cols * 4).ok());

    const int steps = static_cast<int>((c.cols * c.bits / 32 + 3) / 4);
    for (cuda::GemvAlgorithm algorithm : {cuda::GemvAlgorithm::kTensorCore, cuda::GemvAlgorithm::kCudaCore}) {
      const bool tensor_core = algorithm == cuda::GemvAlgorithm::kTensorCore;
      // The planned split, no split, and an odd split (uneven last slice); each run twice to check that the
      // split-K counters reset and that results are bitwise reproducible.
      for (int k_splits : {0, 1, std::min(steps, 3)}) {
        SCOPED_TRACE(std::string(tensor_core ? "tensor core" : "cuda core") + " k_splits " + std::to_string(k_splits));
        std::vector<float> first;
        for (int run = 0; run < 2; ++run) {
          ASSERT_TRUE(y_dev->fill_bytes(0xFF).ok());  // NaN everywhere: every output must be written
          cuda::GemvOptions options{algorithm, k_splits};
          Status st = cuda::gemv_gptq(weights->view(), x_dev->as<float>(), y_dev->as<float>(), *workspace, nullptr, options);
          ASSERT_TRUE(st.ok()) << st.to_string();
          ASSERT_TRUE(cuda::synchronize().ok());
          std::vector<float> got(c.rows);
          ASSERT_TRUE(y_dev->download(got.data(), c.rows * 4).ok());
          const double error = relative_l2(got, tensor_core ? want16 : want);
          EXPECT_LE(error, kTolerance);
          worst[tensor_core ? 0 : 1] = std::max(worst[tensor_core ? 0 : 1], error);
          if (tensor_core) {
            const double error32 = relative_l2(got, want);
            EXPECT_LE(error32, kToleranceFp16Input);
            worst_fp32_input = std::max(worst_fp32_input, error32);
          }
          if (run == 0) first = got;
          else EXPECT_EQ(got, first) << "not reproducible";
        }
      }
    }
  }
  std::printf("[ cuda gemv ] worst relative L2: tensor core %.3g (x rounded to fp16; %.3g against float32 x), "
              "cuda core %.3g\n", worst[0], worst_fp32_input, worst[1]);
}

TEST(KernelsCuda, DeviceBufferRoundTripsAndRejectsOutOfRange) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto buffer = cuda::DeviceBuffer::allocate(1024);
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  std::vector<uint8_t> in(1024), out(1024);
  for (int i = 0; i < 1024; ++i) in[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(buffer->upload(in.data(), in.size()).ok());
  ASSERT_TRUE(buffer->download(out.data(), out.size()).ok());
  EXPECT_EQ(in, out);
  EXPECT_FALSE(buffer->upload(in.data(), 16, 1020).ok());
  cuda::DeviceBuffer moved = std::move(*buffer);
  EXPECT_EQ(moved.size(), 1024u);
  EXPECT_EQ(buffer->data(), nullptr);
}

}  // namespace
}  // namespace petrel

#endif  // PETREL_HAVE_CUDA
