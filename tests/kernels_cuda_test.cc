// kernels/cuda against kernels/ref, on random and awkward shapes. The tests that need a GPU skip without one
// (CI builds the CUDA code and runs these on a machine with no GPU); the rest run everywhere.
#if PETREL_HAVE_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemv_dense.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/model/rope.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::random_floats;
using testing::relative_l2;

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


// ---- The token generator's other kernels (norm.cu, elementwise.cu, gemv_dense.cu, rope.cu, attention.cu).

// float32 values stored as `dtype` (rounded), and their exact float32 widening.
struct StoredFloats {
  DType dtype;
  std::vector<uint8_t> bytes;
  std::vector<float> widened;
};

StoredFloats store_as(const std::vector<float>& values, DType dtype) {
  StoredFloats s{dtype, std::vector<uint8_t>(values.size() * dtype_size(dtype)), std::vector<float>(values.size())};
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(s.bytes.data() + 4 * i, &values[i], 4);
      s.widened[i] = values[i];
    } else {
      const uint16_t bits = dtype == DType::kF16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      std::memcpy(s.bytes.data() + 2 * i, &bits, 2);
      s.widened[i] = dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
  }
  return s;
}

// A device copy of host data; ASSERTs through the returned optional's emptiness are left to the caller.
cuda::DeviceBuffer to_device(const void* data, size_t bytes, size_t extra_front = 0) {
  auto buffer = cuda::DeviceBuffer::allocate(bytes + extra_front + 16);
  EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
  if (!buffer.ok()) return {};
  EXPECT_TRUE(buffer->fill_bytes(0xFF).ok());
  EXPECT_TRUE(buffer->upload(data, bytes, extra_front).ok());
  return std::move(*buffer);
}

std::vector<float> download_floats(const cuda::DeviceBuffer& buffer, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(cuda::synchronize().ok());
  EXPECT_TRUE(buffer.download(out.data(), n * 4).ok());
  return out;
}

constexpr DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(KernelsCuda, RmsNormWithFusedResidualMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(21);
  double worst = 0;
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 4096}, {3, 96}, {2, 1}, {5, 1000}, {1, 257}, {4, 8192}}) {
    for (DType dtype : kFloatTypes) {
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(dim) + " " + std::string(dtype_name(dtype)) +
                     (with_residual ? " residual" : ""));
        std::vector<float> x = random_floats(rng, rows * dim), residual = random_floats(rng, rows * dim);
        const StoredFloats weight = store_as(random_floats(rng, dim), dtype);
        std::vector<float> want_x = x;
        if (with_residual) ref::add_in_place(want_x.data(), residual.data(), rows * dim);
        std::vector<float> want(rows * dim);
        ref::rms_norm(want_x.data(), rows, dim, ref::DenseMatrix{dtype, 1, dim, weight.bytes.data()}, 1e-5f, want.data());

        cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4), r_dev = to_device(residual.data(), x.size() * 4);
        cuda::DeviceBuffer w_dev = to_device(weight.bytes.data(), weight.bytes.size());
        auto out_dev = cuda::DeviceBuffer::allocate(x.size() * 4);
        ASSERT_TRUE(out_dev.ok());
        ASSERT_TRUE(out_dev->fill_bytes(0xFF).ok());
        Status st = cuda::rms_norm(x_dev.as<float>(), with_residual ? r_dev.as<float>() : nullptr, rows, dim,
                                   cuda::DeviceVector{dtype, dim, w_dev.data()}, 1e-5f, out_dev->as<float>());
        ASSERT_TRUE(st.ok()) << st.to_string();
        const double error = relative_l2(download_floats(*out_dev, x.size()), want);
        EXPECT_LE(error, 1e-5);  // float32 sums of up to 8192 squares in another order
        worst = std::max(worst, error);
        EXPECT_LE(relative_l2(download_floats(x_dev, x.size()), want_x), 0.0) << "x must hold x + residual";
      }
    }
  }
  EXPECT_FALSE(cuda::rms_norm(nullptr, nullptr, 1, 8, cuda::DeviceVector{DType::kI32, 8, nullptr}, 1e-5f, nullptr).ok());
  std::printf("[ cuda rms_norm ] worst relative L2 %.3g\n", worst);
}

TEST(KernelsCuda, EmbeddingSiluMulAndAddMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(22);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{512, 64}, {7, 37}, {4096, 256}, {1, 1}}) {
    for (DType dtype : kFloatTypes) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " " + std::string(dtype_name(dtype)));
      const StoredFloats table = store_as(random_floats(rng, rows * cols), dtype);
      std::vector<int32_t> tokens = {0, static_cast<int32_t>(rows - 1), static_cast<int32_t>(rows / 2), 0};
      std::vector<float> want(tokens.size() * cols);
      ref::embedding_lookup(ref::DenseMatrix{dtype, rows, cols, table.bytes.data()}, tokens, want.data());
      cuda::DeviceBuffer table_dev = to_device(table.bytes.data(), table.bytes.size());
      cuda::DeviceBuffer tokens_dev = to_device(tokens.data(), tokens.size() * 4);
      auto out = cuda::DeviceBuffer::allocate(want.size() * 4);
      ASSERT_TRUE(out.ok() && out->fill_bytes(0xFF).ok());
      Status st = cuda::embedding_lookup(cuda::DeviceDenseMatrix{dtype, rows, cols, table_dev.data()},
                                         tokens_dev.as<int32_t>(), static_cast<int64_t>(tokens.size()), out->as<float>());
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(download_floats(*out, want.size()), want);
    }
  }
  for (int64_t n : {1, 1000, 4097, 14336}) {
    SCOPED_TRACE(n);
    std::vector<float> gate = random_floats(rng, n, 3.0f), up = random_floats(rng, n), y = random_floats(rng, n);
    if (n > 2) {
      gate[0] = -100.0f;  // exp overflows: silu -> -0
      gate[1] = 90.0f;
    }
    std::vector<float> want(n), want_sum = gate;
    ref::silu_mul(gate.data(), up.data(), n, want.data());
    ref::add_in_place(want_sum.data(), y.data(), n);
    cuda::DeviceBuffer g = to_device(gate.data(), n * 4), u = to_device(up.data(), n * 4), y_dev = to_device(y.data(), n * 4);
    auto out = cuda::DeviceBuffer::allocate(n * 4);
    ASSERT_TRUE(out.ok() && out->fill_bytes(0xFF).ok());
    ASSERT_TRUE(cuda::silu_mul(g.as<float>(), u.as<float>(), n, out->as<float>()).ok());
    EXPECT_LE(relative_l2(download_floats(*out, n), want), 1e-6);
    ASSERT_TRUE(cuda::add_in_place(g.as<float>(), y_dev.as<float>(), n).ok());
    EXPECT_EQ(download_floats(g, n), want_sum);
  }
}

TEST(KernelsCuda, DenseGemvMatchesReferenceInEveryDtype) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(23);
  double worst = 0;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {320, 96}, {4100, 4096}, {512, 128}, {9, 4098}}) {
    for (DType dtype : kFloatTypes) {
      // Offset 0: the 16-byte vector path where the shape allows it; 2 bytes: the element path.
      for (size_t offset : {size_t{0}, size_t{2}}) {
        if (offset != 0 && dtype == DType::kF32) continue;
        SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " " + std::string(dtype_name(dtype)) +
                     " offset " + std::to_string(offset));
        const StoredFloats w = store_as(random_floats(rng, rows * cols, 0.05f), dtype);
        const std::vector<float> x = random_floats(rng, cols);
        std::vector<float> want(rows);
        ref::matmul(x.data(), 1, ref::DenseMatrix{dtype, rows, cols, w.bytes.data()}, want.data());
        cuda::DeviceBuffer w_dev = to_device(w.bytes.data(), w.bytes.size(), offset);
        cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4);
        auto y = cuda::DeviceBuffer::allocate(rows * 4);
        ASSERT_TRUE(y.ok() && y->fill_bytes(0xFF).ok());
        Status st = cuda::gemv_dense(cuda::DeviceDenseMatrix{dtype, rows, cols, w_dev.as<char>() + offset},
                                     x_dev.as<float>(), y->as<float>());
        ASSERT_TRUE(st.ok()) << st.to_string();
        const double error = relative_l2(download_floats(*y, rows), want);
        EXPECT_LE(error, 1e-5);
        worst = std::max(worst, error);
      }
    }
  }
  std::printf("[ cuda gemv_dense ] worst relative L2 %.3g\n", worst);
}

TEST(KernelsCuda, RopeRotatesAndStoresKeysAndValuesAtThePosition) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(24);
  struct Case { int64_t n_heads, n_kv_heads, head_dim, position; };
  RopeConfig rope_config;
  rope_config.theta = 500000.0;
  for (const Case& c : {Case{8, 2, 32, 0}, Case{4, 1, 40, 37}, Case{32, 8, 128, 4095}, Case{6, 6, 16, 129},
                        Case{2, 1, 2, 5}, Case{3, 1, 256, 131071}}) {
    SCOPED_TRACE(std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads of " +
                 std::to_string(c.head_dim) + " at " + std::to_string(c.position));
    const int64_t kv_dim = c.n_kv_heads * c.head_dim, rows = c.position + 2;
    std::vector<float> q = random_floats(rng, c.n_heads * c.head_dim), k = random_floats(rng, kv_dim),
                       v = random_floats(rng, kv_dim);
    const std::vector<float> inv_freq = rope_inverse_frequencies(rope_config, c.head_dim);
    std::vector<float> cos(c.head_dim / 2), sin(c.head_dim / 2);
    rope_cos_sin(inv_freq, c.position, 1, cos.data(), sin.data());
    std::vector<float> want_q = q, want_k = k;
    ref::apply_rope(want_q.data(), 1, c.n_heads, c.head_dim, cos.data(), sin.data());
    ref::apply_rope(want_k.data(), 1, c.n_kv_heads, c.head_dim, cos.data(), sin.data());

    cuda::DeviceBuffer q_dev = to_device(q.data(), q.size() * 4), k_dev = to_device(k.data(), k.size() * 4),
                       v_dev = to_device(v.data(), v.size() * 4), f_dev = to_device(inv_freq.data(), inv_freq.size() * 4);
    const int32_t position = static_cast<int32_t>(c.position);
    cuda::DeviceBuffer pos_dev = to_device(&position, 4);
    auto keys = cuda::DeviceBuffer::allocate(rows * kv_dim * 2), values = cuda::DeviceBuffer::allocate(rows * kv_dim * 2);
    ASSERT_TRUE(keys.ok() && values.ok() && keys->fill_bytes(0xFF).ok() && values->fill_bytes(0xFF).ok());
    Status st = cuda::rope_store_kv(q_dev.as<float>(), k_dev.as<float>(), v_dev.as<float>(),
                                    cuda::RopeShape{c.n_heads, c.n_kv_heads, c.head_dim}, f_dev.as<float>(),
                                    pos_dev.as<int32_t>(), keys->as<uint16_t>(), values->as<uint16_t>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_LE(relative_l2(download_floats(q_dev, q.size()), want_q), 1e-6);
    std::vector<uint16_t> key_rows(rows * kv_dim), value_rows(rows * kv_dim);
    ASSERT_TRUE(keys->download(key_rows.data(), key_rows.size() * 2).ok());
    ASSERT_TRUE(values->download(value_rows.data(), value_rows.size() * 2).ok());
    int64_t differing_keys = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < kv_dim; ++i) {
        const uint16_t key = key_rows[r * kv_dim + i], value = value_rows[r * kv_dim + i];
        if (r != c.position) {
          ASSERT_EQ(key, 0xFFFF) << "row " << r << " was written";
          ASSERT_EQ(value, 0xFFFF) << "row " << r << " was written";
          continue;
        }
        EXPECT_EQ(value, f32_to_f16(v[i]));
        // The rotation may differ from the reference's in the last float32 bit (FMA contraction on the CPU),
        // which can move the fp16 rounding by one step.
        const int diff = std::abs(int(key) - int(f32_to_f16(want_k[i])));
        EXPECT_LE(diff, 1) << "key " << i;
        differing_keys += diff != 0;
      }
    }
    EXPECT_LE(differing_keys, kv_dim / 16 + 1);
  }
}

TEST(KernelsCuda, DecodeAttentionMatchesReferenceAcrossSplits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(25);
  struct Case { int64_t n_heads, n_kv_heads, head_dim, positions, context, split; };
  double worst = 0;
  for (const Case& c : {Case{8, 2, 32, 1, 16, 0}, Case{8, 2, 32, 300, 512, 0}, Case{32, 8, 128, 1000, 4096, 0},
                        Case{4, 1, 40, 77, 128, 16}, Case{6, 6, 16, 129, 256, 32}, Case{64, 1, 64, 50, 64, 0},
                        Case{2, 2, 256, 33, 33, 7}, Case{8, 2, 30, 5, 5, 1}, Case{32, 8, 128, 4096, 4096, 0}}) {
    SCOPED_TRACE(std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads of " +
                 std::to_string(c.head_dim) + ", " + std::to_string(c.positions) + " of " + std::to_string(c.context) +
                 " positions, split " + std::to_string(c.split));
    const int64_t kv_dim = c.n_kv_heads * c.head_dim;
    const std::vector<float> q = random_floats(rng, c.n_heads * c.head_dim, 0.5f);
    const StoredFloats keys = store_as(random_floats(rng, c.context * kv_dim), DType::kF16);
    const StoredFloats values = store_as(random_floats(rng, c.context * kv_dim), DType::kF16);
    std::vector<float> want(c.n_heads * c.head_dim);
    ref::attention(q.data(), keys.widened.data(), values.widened.data(), 1, c.positions - 1, c.n_heads, c.n_kv_heads,
                   c.head_dim, want.data());
    const cuda::DecodeAttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.context, c.split};
    const int32_t position = static_cast<int32_t>(c.positions - 1);
    cuda::DeviceBuffer q_dev = to_device(q.data(), q.size() * 4), k_dev = to_device(keys.bytes.data(), keys.bytes.size()),
                       v_dev = to_device(values.bytes.data(), values.bytes.size()), pos_dev = to_device(&position, 4);
    auto workspace = cuda::DeviceBuffer::allocate(cuda::decode_attention_workspace_floats(shape) * 4);
    auto out = cuda::DeviceBuffer::allocate(want.size() * 4);
    ASSERT_TRUE(workspace.ok() && out.ok() && workspace->fill_bytes(0xFF).ok() && out->fill_bytes(0xFF).ok());
    Status st = cuda::decode_attention(q_dev.as<float>(), k_dev.as<uint16_t>(), v_dev.as<uint16_t>(), pos_dev.as<int32_t>(),
                                       shape, workspace->as<float>(), out->as<float>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    const double error = relative_l2(download_floats(*out, want.size()), want);
    EXPECT_LE(error, 1e-5);
    worst = std::max(worst, error);
  }
  EXPECT_FALSE(cuda::decode_attention(nullptr, nullptr, nullptr, nullptr, cuda::DecodeAttentionShape{6, 4, 16, 8, 0},
                                      nullptr, nullptr).ok());
  std::printf("[ cuda attention ] worst relative L2 %.3g\n", worst);
}

}  // namespace
}  // namespace petrel

#endif  // PETREL_HAVE_CUDA
