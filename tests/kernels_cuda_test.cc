// kernels/cuda against kernels/ref, on random and awkward shapes. The tests that need a GPU skip without one
// (CI builds the CUDA code and runs these on a machine with no GPU); the rest run everywhere.
#if PETREL_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemv_dense.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/gemv_tma.h"
#include "petrel/kernels/cuda/timeline.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/cuda/resident_gemv.h"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/kernels/cuda/stream.h"
#include "petrel/kernels/cuda/top_k.h"
#include "petrel/kernels/cuda/uploader.h"
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
  // Batch plans: staged x within the raised limit, token rows 64 bytes apart modulo 128, the row tiles asked
  // for, the partials within the workspace.
  cuda::DeviceGptqMatrix gate = m;
  gate.rows = 14336;
  gate.cols = 4096;
  gate.group_size = 128;
  const cuda::GemvGroupMember gate_up[] = {{&gate, nullptr}, {&gate, nullptr}};
  for (int64_t tokens : {1, 8, 29, 32}) {
    for (int row_tiles : {0, 1, 4}) {
      cuda::GemvOptions options;
      options.row_tiles = row_tiles;
      auto batch = cuda::plan_gemv_gptq_batch(gate_up, tokens, 132, int64_t{4} << 20, options);
      ASSERT_TRUE(batch.ok()) << batch.status().to_string();
      EXPECT_LE(batch->shared_bytes, cuda::GemvPlan::kMaxBatchSharedBytes);
      EXPECT_EQ(batch->x_stride_bytes % 128, 64);
      EXPECT_EQ(batch->row_tiles_total, 224);
      if (row_tiles > 0) {
        EXPECT_EQ(batch->row_tiles, row_tiles);
      }
      EXPECT_EQ(batch->row_blocks, (224 + batch->row_tiles - 1) / batch->row_tiles);
      EXPECT_LE(int64_t{batch->k_splits} * 224 * 128 * tokens, std::max<int64_t>(int64_t{4} << 20, 224 * 128 * tokens));
    }
  }
  cuda::DeviceGptqMatrix wide = gate;
  wide.cols = 65536;  // 2048 steps: the slice of 32 tokens' x must be split to fit shared memory
  const cuda::GemvGroupMember one_wide[] = {{&wide, nullptr}};
  auto batch = cuda::plan_gemv_gptq_batch(one_wide, 32, 132, int64_t{1} << 28);
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  EXPECT_LE(batch->shared_bytes, cuda::GemvPlan::kMaxBatchSharedBytes);
  EXPECT_FALSE(cuda::plan_gemv_gptq_batch(one_wide, 32, 132, 1 << 20).ok());  // no room for its partials
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
        if (tensor_core) {  // split-K sums reduced in a thread-block cluster: the same bits
          ASSERT_TRUE(y_dev->fill_bytes(0xFF).ok());
          cuda::GemvOptions options{algorithm, k_splits};
          options.cluster_reduce = true;
          Status st = cuda::gemv_gptq(weights->view(), x_dev->as<float>(), y_dev->as<float>(), *workspace, nullptr, options);
          ASSERT_TRUE(st.ok()) << st.to_string();
          std::vector<float> got(c.rows);
          ASSERT_TRUE(y_dev->download(got.data(), c.rows * 4).ok());
          EXPECT_EQ(got, first) << "cluster reduction";
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

// A failed allocation returns its error and leaves none behind for the next launch's check (cudaGetLastError)
// to misreport: CudaModel's warm copies go on past one (session 46).
TEST(KernelsCuda, FailedAllocationLeavesNoErrorForLaterLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto huge = cuda::DeviceBuffer::allocate(size_t{1} << 52);
  EXPECT_FALSE(huge.ok());
  auto buffer = cuda::DeviceBuffer::allocate(64 * sizeof(float));
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  float* x = static_cast<float*>(buffer->data());
  ASSERT_TRUE(buffer->fill_bytes(0).ok());
  EXPECT_TRUE(cuda::add_in_place(x, x, 64).ok());
  EXPECT_TRUE(cuda::synchronize().ok());
}

// The staged uploader: copies larger than a chunk (split over slots, the ring wrapping several times, the
// host copy split over threads) and small ones sharing a chunk land byte for byte.
TEST(KernelsCuda, HostUploaderCopiesLargeAndSmallPiecesExactly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  constexpr size_t kChunk = size_t{8} << 20;
  auto up = cuda::HostUploader::create(kChunk, 2, 3);
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  std::mt19937 rng(7);
  std::vector<size_t> sizes = {5 * kChunk + 12345, 1, 3, 4096, kChunk - 2, kChunk, 777, 2 * kChunk + 1};
  std::vector<std::vector<uint8_t>> host;
  std::vector<cuda::DeviceBuffer> device;
  for (size_t n : sizes) {
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    auto buffer = cuda::DeviceBuffer::allocate(n);
    ASSERT_TRUE(buffer.ok());
    ASSERT_TRUE(up->copy(buffer->data(), bytes.data(), n).ok());
    std::fill(bytes.begin(), bytes.begin() + std::min<size_t>(n, 64), 0);  // the source may change at once...
    for (size_t i = 0; i < std::min<size_t>(n, 64); ++i) bytes[i] = static_cast<uint8_t>(rng());
    host.push_back(std::move(bytes));
    device.push_back(std::move(buffer).value());
  }
  ASSERT_TRUE(up->finish().ok());
  EXPECT_EQ(up->bytes_copied(), static_cast<int64_t>(std::accumulate(sizes.begin(), sizes.end(), size_t{0})));
  std::mt19937 replay(7);
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<uint8_t> expected(sizes[k]), out(sizes[k]);
    for (auto& b : expected) b = static_cast<uint8_t>(replay());
    for (size_t i = 0; i < std::min<size_t>(sizes[k], 64); ++i) replay();  // ...without changing what was sent
    ASSERT_TRUE(device[k].download(out.data(), out.size()).ok());
    EXPECT_TRUE(out == expected) << "copy " << k << " of " << sizes[k] << " bytes";
  }
  EXPECT_FALSE(up->copy(nullptr, host[0].data(), 16).ok());
  // Rows with a stride (a CPU bundle's padded qweight) land packed, across chunk boundaries and threads.
  for (const auto& [row_bytes, stride, rows] : {std::tuple<size_t, size_t, size_t>{16384, 16640, 1500}, {12, 20, 5}, {4096, 4096, 3}, {7, 7, 1}}) {
    std::vector<uint8_t> padded(stride * (rows - 1) + row_bytes), expected(row_bytes * rows), out(row_bytes * rows);
    for (auto& b : padded) b = static_cast<uint8_t>(rng());
    for (size_t r = 0; r < rows; ++r) std::memcpy(expected.data() + r * row_bytes, padded.data() + r * stride, row_bytes);
    auto buffer = cuda::DeviceBuffer::allocate(expected.size());
    ASSERT_TRUE(buffer.ok());
    ASSERT_TRUE(up->copy_rows(buffer->data(), padded.data(), row_bytes, stride, rows).ok());
    ASSERT_TRUE(up->finish().ok());
    ASSERT_TRUE(buffer->download(out.data(), out.size()).ok());
    EXPECT_TRUE(out == expected) << rows << " rows of " << row_bytes << " bytes, " << stride << " apart";
  }
  EXPECT_FALSE(up->copy_rows(device[0].data(), host[0].data(), 16, 8, 2).ok());  // rows overlapping
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
  // Rows of a multiple of 8 move as 16-byte vectors (rms_row.cuh); other sizes, rows 4 bytes off a 16-byte
  // boundary (`shift`) and rows past 8192 take the scalar and tail paths.
  struct Case { int64_t rows, dim, shift; };
  for (auto [rows, dim, shift] : {Case{1, 4096, 0}, {3, 96, 0}, {2, 1, 0}, {5, 1000, 0}, {1, 257, 0}, {4, 8192, 0},
                                  {2, 4096, 1}, {3, 8200, 0}}) {
    for (DType dtype : kFloatTypes) {
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(dim) + " " + std::string(dtype_name(dtype)) +
                     (with_residual ? " residual" : "") + (shift ? " unaligned" : ""));
        std::vector<float> x = random_floats(rng, rows * dim), residual = random_floats(rng, rows * dim);
        const StoredFloats weight = store_as(random_floats(rng, dim), dtype);
        std::vector<float> want_x = x;
        if (with_residual) ref::add_in_place(want_x.data(), residual.data(), rows * dim);
        std::vector<float> want(rows * dim);
        ref::rms_norm(want_x.data(), rows, dim, ref::DenseMatrix{dtype, 1, dim, weight.bytes.data()}, 1e-5f, want.data());

        const size_t front = 4 * shift;
        cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4, front), r_dev = to_device(residual.data(), x.size() * 4);
        cuda::DeviceBuffer w_dev = to_device(weight.bytes.data(), weight.bytes.size());
        auto out_dev = cuda::DeviceBuffer::allocate(x.size() * 4);
        ASSERT_TRUE(out_dev.ok());
        ASSERT_TRUE(out_dev->fill_bytes(0xFF).ok());
        float* x_ptr = x_dev.as<float>() + shift;
        Status st = cuda::rms_norm(x_ptr, with_residual ? r_dev.as<float>() : nullptr, rows, dim,
                                   cuda::DeviceVector{dtype, dim, w_dev.data()}, 1e-5f, out_dev->as<float>());
        ASSERT_TRUE(st.ok()) << st.to_string();
        const double error = relative_l2(download_floats(*out_dev, x.size()), want);
        EXPECT_LE(error, 1e-5);  // float32 sums of up to 8192 squares in another order
        worst = std::max(worst, error);
        std::vector<float> got_x = download_floats(x_dev, x.size() + shift);
        got_x.erase(got_x.begin(), got_x.begin() + shift);
        EXPECT_LE(relative_l2(got_x, want_x), 0.0) << "x must hold x + residual";
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

// q and k rotated at `position` by the CPU's RoPE (model/rope.h's angles, ref::apply_rope): the reference for the
// kernels that rotate the token's query and key heads.
std::pair<std::vector<float>, std::vector<float>> rope_reference(std::vector<float> q, std::vector<float> k,
                                                                 const std::vector<float>& inv_freq, int64_t position,
                                                                 int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  std::vector<float> cos(head_dim / 2), sin(head_dim / 2);
  rope_cos_sin(inv_freq, position, 1, cos.data(), sin.data());
  ref::apply_rope(q.data(), 1, n_heads, head_dim, cos.data(), sin.data());
  ref::apply_rope(k.data(), 1, n_kv_heads, head_dim, cos.data(), sin.data());
  return {std::move(q), std::move(k)};
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
    const auto [want_q, want_k] = rope_reference(q, k, inv_freq, c.position, c.n_heads, c.n_kv_heads, c.head_dim);

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

// ---- The fused decode step's kernels: grouped GEMV with fused input ops and residual, overlapped launches,
// RoPE + KV store + attention + combine in one launch.

// Random GPTQ weights (RTN of random floats) of one shape, on the host and the device.
struct TestGptq {
  quant::GptqTensors host;
  cuda::DeviceGptqWeights device;
};

TestGptq make_gptq(std::mt19937& rng, int64_t rows, int64_t cols, int bits, int64_t group, bool symmetric) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(rows * cols);
  for (float& v : w) v = 0.05f * normal(rng);
  auto packed = quant::pack_gptq(quant::quantize_rtn(w.data(), rows, cols, quant::QuantScheme{bits, group, symmetric, false}));
  EXPECT_TRUE(packed.ok()) << packed.status().to_string();
  TestGptq t{std::move(*packed), {}};
  auto uploaded = cuda::DeviceGptqWeights::upload(t.host.view());
  EXPECT_TRUE(uploaded.ok()) << uploaded.status().to_string();
  if (uploaded.ok()) t.device = std::move(*uploaded);
  return t;
}

std::vector<float> round_to_f16(std::vector<float> v) {
  for (float& x : v) x = f16_to_f32(f32_to_f16(x));
  return v;
}

const char* input_name(cuda::GemvInput input) {
  switch (input) {
    case cuda::GemvInput::kPlain: return "plain";
    case cuda::GemvInput::kRmsNorm: return "rms_norm";
    case cuda::GemvInput::kSiluMul: return "silu_mul";
  }
  return "?";
}

// A GPTQ embedding table (petrel quantize --embedding-bits) looked up on the device: bitwise the CPU's
// dequantized rows, any bits, group and zero layout; ids outside the table give NaN rows, not a fault.
TEST(KernelsCuda, GptqEmbeddingLookupMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(24);
  struct Case { int64_t rows, cols, group; int bits; bool symmetric; };
  for (const Case c : {Case{1000, 256, -1, 4, true}, Case{1000, 256, 64, 4, false}, Case{72, 4096, 128, 4, false},
                       Case{40, 96, 32, 4, true}, Case{520, 128, -1, 8, false}, Case{132, 256, 32, 8, true}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " bits " + std::to_string(c.bits) + " group " +
                 std::to_string(c.group));
    const TestGptq m = make_gptq(rng, c.rows, c.cols, c.bits, c.group, c.symmetric);
    const std::vector<int32_t> tokens = {0, static_cast<int32_t>(c.rows - 1), 5, static_cast<int32_t>(c.rows / 2), 5, 1, 2, 3};
    std::vector<float> want(tokens.size() * c.cols);
    ref::embedding_lookup(m.host.view(), tokens, want.data());
    cuda::DeviceBuffer tokens_dev = to_device(tokens.data(), tokens.size() * 4);
    auto out = cuda::DeviceBuffer::allocate(want.size() * 4);
    ASSERT_TRUE(out.ok() && out->fill_bytes(0xFF).ok());
    Status st = cuda::embedding_lookup_gptq(m.device.view(), tokens_dev.as<int32_t>(), static_cast<int64_t>(tokens.size()),
                                            out->as<float>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(download_floats(*out, want.size()), want);
    const std::vector<int32_t> outside = {-1, static_cast<int32_t>(c.rows)};
    cuda::DeviceBuffer outside_dev = to_device(outside.data(), outside.size() * 4);
    ASSERT_TRUE(cuda::embedding_lookup_gptq(m.device.view(), outside_dev.as<int32_t>(), 2, out->as<float>()).ok());
    for (float v : download_floats(*out, 2 * c.cols)) ASSERT_TRUE(std::isnan(v));
  }
  cuda::DeviceGptqMatrix bad;
  bad.bits = 3;
  EXPECT_FALSE(cuda::embedding_lookup_gptq(bad, nullptr, 1, nullptr).ok());
}

// DeviceGptqMatrix::uniform_zero: the stored zero where every row of every group has it (symmetric grids), -1
// where one differs (an asymmetric grid, or one zero changed in the last group).
TEST(KernelsCuda, UniformZerosAreDetectedAtUpload) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(7);
  for (const int bits : {4, 8}) {
    for (const int64_t rows : {int64_t{64}, int64_t{24}}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit, " + std::to_string(rows) + " rows");
      const TestGptq sym = make_gptq(rng, rows, 256, bits, 64, true);
      EXPECT_EQ(sym.device.view().uniform_zero, (1 << (bits - 1)) - 1);  // GPTQ v1 stores zero - 1
      EXPECT_EQ(make_gptq(rng, rows, 256, bits, 64, false).device.view().uniform_zero, -1);
      std::vector<int32_t> zeros(sym.host.view().qzeros, sym.host.view().qzeros + 4 * rows * bits / 32);
      zeros.back() ^= 1;  // the last group's last word: one zero differs
      ref::GptqMatrix changed = sym.host.view();
      changed.qzeros = zeros.data();
      auto uploaded = cuda::DeviceGptqWeights::upload(changed);
      ASSERT_TRUE(uploaded.ok()) << uploaded.status().to_string();
      EXPECT_EQ(uploaded->view().uniform_zero, -1);
    }
  }
}

TEST(KernelsCuda, GroupedGemvWithFusedInputMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(31);
  struct Case { std::vector<int64_t> rows; int64_t cols, group; int bits; bool symmetric; };
  const Case cases[] = {
      {{4096, 1024, 1024}, 4096, -1, 4, true},  // Llama-3.1-8B q/k/v
      {{136, 40}, 1040, -1, 4, false},          // per channel (three batches in flight), a last step of 2 words
      {{200, 72, 1032}, 4096, 128, 4, false},   // rows that are no multiple of the 128-row block
      {{200, 1032}, 4096, 128, 4, true},        // symmetric: every zero the same (the uniform-zeros build)
      {{520, 136}, 1024, 64, 4, false},
      {{8}, 64, 32, 4, true},
      {{36, 52, 4}, 128, -1, 8, true},
      {{1028, 132}, 256, 32, 8, false},
      // One split of 8,192 inputs at 8 bits: 16 KB of staged x + 16 KB of fp16/bf16 norm weights, exactly 32 KB of
      // dynamic shared memory beside the static 16.5 KB (a Llama-3.1-70B-shaped LM head: at the old 32 KB opt-in threshold, a slice of exactly 32 KB failed to launch).
      {{64}, 8192, -1, 8, true},
  };
  auto workspace = cuda::GemvWorkspace::create();
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  double worst = 0, worst_fp32_input = 0;
  for (const Case& c : cases) {
    std::vector<TestGptq> matrices;
    for (int64_t rows : c.rows) matrices.push_back(make_gptq(rng, rows, c.cols, c.bits, c.group, c.symmetric));
    std::vector<cuda::DeviceBuffer> outputs;
    std::vector<cuda::GemvGroupMember> members;
    for (const TestGptq& m : matrices) {
      auto y = cuda::DeviceBuffer::allocate(m.host.rows * 4);
      ASSERT_TRUE(y.ok());
      outputs.push_back(std::move(*y));
      members.push_back({&m.device.view(), outputs.back().as<float>()});
    }
    const std::vector<float> x = random_floats(rng, c.cols, 2.0f), up = random_floats(rng, c.cols);
    cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4), up_dev = to_device(up.data(), up.size() * 4);
    for (cuda::GemvInput input : {cuda::GemvInput::kPlain, cuda::GemvInput::kRmsNorm, cuda::GemvInput::kSiluMul}) {
      for (DType norm_dtype : kFloatTypes) {
        if (input != cuda::GemvInput::kRmsNorm && norm_dtype != DType::kF32) continue;
        const StoredFloats norm = store_as(random_floats(rng, c.cols), norm_dtype);
        cuda::DeviceBuffer norm_dev = to_device(norm.bytes.data(), norm.bytes.size());
        // The input the product sees, on the host: the reference ops, then fp16 as the tensor cores take it.
        std::vector<float> in = x;
        if (input == cuda::GemvInput::kRmsNorm) {
          ref::rms_norm(x.data(), 1, c.cols, ref::DenseMatrix{norm_dtype, 1, c.cols, norm.bytes.data()}, 1e-5f, in.data());
        } else if (input == cuda::GemvInput::kSiluMul) {
          ref::silu_mul(x.data(), up.data(), c.cols, in.data());
        }
        const std::vector<float> in16 = round_to_f16(in);
        std::vector<std::vector<float>> want16(matrices.size()), want(matrices.size());
        for (size_t i = 0; i < matrices.size(); ++i) {
          const ref::GptqMatrix m = matrices[i].host.view();
          want16[i].resize(m.rows);
          want[i].resize(m.rows);
          ref::matmul(in16.data(), 1, m, want16[i].data());
          ref::matmul(in.data(), 1, m, want[i].data());
        }
        cuda::GemvFusion fusion;
        fusion.input = input;
        fusion.norm_weight = cuda::DeviceVector{norm_dtype, c.cols, norm_dev.data()};
        fusion.norm_eps = 1e-5f;
        fusion.up = up_dev.as<float>();
        const int steps = static_cast<int>((c.cols * c.bits / 32 + 3) / 4);
        for (int k_splits : {0, 1, std::min(steps, 3)}) {
          std::vector<std::vector<float>> without_overlap;  // the bits the overlapped launches must give too
          // Mode 0: not overlapped; 1: overlapped; 2, 3: overlapped with 1 or 2 batches of weight loads after the
          // wait, behind x's reads; 4: overlapped, every group's zeros loaded and decoded (the general build where
          // mode 1 took the uniform-zeros one).
          for (int mode = 0; mode < 5; ++mode) {
            const bool overlap = mode > 0;
            const int late = mode == 2 || mode == 3 ? mode - 1 : 0;
            SCOPED_TRACE(std::to_string(c.bits) + "-bit, " + std::to_string(c.rows.size()) + " matrices of " +
                         std::to_string(c.cols) + " cols, group " + std::to_string(c.group) + ", " + input_name(input) +
                         " " + std::string(dtype_name(norm_dtype)) + ", k_splits " + std::to_string(k_splits) +
                         (overlap ? ", overlapped" : "") + (late ? ", late batches " + std::to_string(late) : "") +
                         (mode == 4 ? ", zeros loaded" : ""));
            cuda::GemvOptions options;
            options.k_splits = k_splits;
            options.overlap_previous = overlap;
            options.l2_prefetch_steps = overlap ? 64 : 0;
            options.late_batches = late;
            options.uniform_zeros = mode != 4;
            std::vector<std::vector<float>> first;
            for (int run = 0; run < 2; ++run) {
              for (cuda::DeviceBuffer& y : outputs) ASSERT_TRUE(y.fill_bytes(0xFF).ok());
              Status st = cuda::gemv_gptq_grouped(members, x_dev.as<float>(), *workspace, nullptr, options, fusion);
              ASSERT_TRUE(st.ok()) << st.to_string();
              for (size_t i = 0; i < matrices.size(); ++i) {
                const std::vector<float> got = download_floats(outputs[i], matrices[i].host.rows);
                // RMSNorm: the sum of squares in another order can move an element's fp16 rounding by a step.
                const double error = relative_l2(got, want16[i]);
                EXPECT_LE(error, input == cuda::GemvInput::kRmsNorm ? 1e-4 : kTolerance) << "matrix " << i;
                EXPECT_LE(relative_l2(got, want[i]), kToleranceFp16Input) << "matrix " << i;
                worst = std::max(worst, error);
                worst_fp32_input = std::max(worst_fp32_input, relative_l2(got, want[i]));
                if (run == 0) first.push_back(got);
                else EXPECT_EQ(got, first[i]) << "not reproducible, matrix " << i;
              }
            }
            if (!overlap) without_overlap = first;
            else EXPECT_EQ(first, without_overlap) << "overlap, late batches or the zeros' build changed the bits";
          }
        }
      }
    }
  }
  // Refusals: mismatched members, too many, a residual on a group, the CUDA-core kernel with fusions.
  std::vector<TestGptq> mismatched;
  mismatched.push_back(make_gptq(rng, 64, 256, 4, 128, true));
  mismatched.push_back(make_gptq(rng, 64, 512, 4, 128, true));
  auto y = cuda::DeviceBuffer::allocate(4096);
  ASSERT_TRUE(y.ok());
  const cuda::GemvGroupMember bad[] = {{&mismatched[0].device.view(), y->as<float>()}, {&mismatched[1].device.view(), y->as<float>()}};
  EXPECT_FALSE(cuda::gemv_gptq_grouped(bad, y->as<float>(), *workspace).ok());
  const cuda::GemvGroupMember four[] = {bad[0], bad[0], bad[0], bad[0]};
  EXPECT_FALSE(cuda::gemv_gptq_grouped(four, y->as<float>(), *workspace).ok());
  cuda::GemvFusion residual;
  residual.residual = y->as<float>();
  const cuda::GemvGroupMember two[] = {bad[0], bad[0]};
  EXPECT_FALSE(cuda::gemv_gptq_grouped(two, y->as<float>(), *workspace, nullptr, {}, residual).ok());
  cuda::GemvOptions cuda_core;
  cuda_core.algorithm = cuda::GemvAlgorithm::kCudaCore;
  EXPECT_FALSE(cuda::gemv_gptq(*bad[0].w, y->as<float>(), y->as<float>() + 256, *workspace, nullptr, cuda_core, residual).ok());
  // RMSNorm weights are copied into shared memory 16 bytes at a time: they must be 16-byte aligned.
  cuda::GemvFusion misaligned_norm;
  misaligned_norm.input = cuda::GemvInput::kRmsNorm;
  misaligned_norm.norm_weight = cuda::DeviceVector{DType::kF32, 256, y->as<float>() + 1};
  EXPECT_EQ(cuda::gemv_gptq(*bad[0].w, y->as<float>() + 512, y->as<float>() + 256, *workspace, nullptr, {}, misaligned_norm).code(),
            ErrorCode::kInvalidArgument);
  std::printf("[ cuda grouped gemv ] worst relative L2 %.3g (x rounded to fp16; %.3g against float32 x)\n", worst,
              worst_fp32_input);
}

TEST(KernelsCuda, GemvResidualEpilogueUpdatesTheStreamInPlace) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(32);
  auto workspace = cuda::GemvWorkspace::create();
  ASSERT_TRUE(workspace.ok());
  struct Case { int64_t rows, cols, group; int bits; };
  for (const Case& c : {Case{4096, 14336, 128, 4}, Case{4096, 4096, -1, 4}, Case{200, 1024, 64, 4}, Case{68, 128, -1, 8}}) {
    const TestGptq m = make_gptq(rng, c.rows, c.cols, c.bits, c.group, false);
    const std::vector<float> gate = random_floats(rng, c.cols, 3.0f), up = random_floats(rng, c.cols),
                             stream = random_floats(rng, c.rows);
    cuda::DeviceBuffer gate_dev = to_device(gate.data(), gate.size() * 4), up_dev = to_device(up.data(), up.size() * 4);
    for (bool silu : {false, true}) {
      std::vector<float> in = gate;
      if (silu) ref::silu_mul(gate.data(), up.data(), c.cols, in.data());
      const std::vector<float> in16 = round_to_f16(in);
      std::vector<float> want(c.rows);
      ref::matmul(in16.data(), 1, m.host.view(), want.data());
      ref::add_in_place(want.data(), stream.data(), c.rows);
      const int steps = static_cast<int>((c.cols * c.bits / 32 + 3) / 4);
      for (int k_splits : {0, 1, std::min(steps, 5)}) {
        SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + (silu ? " silu" : "") + " k_splits " +
                     std::to_string(k_splits));
        cuda::DeviceBuffer stream_dev = to_device(stream.data(), stream.size() * 4);
        cuda::GemvFusion fusion;
        fusion.input = silu ? cuda::GemvInput::kSiluMul : cuda::GemvInput::kPlain;
        fusion.up = up_dev.as<float>();
        fusion.residual = stream_dev.as<float>();
        cuda::GemvOptions options;
        options.k_splits = k_splits;
        options.overlap_previous = true;
        Status st = cuda::gemv_gptq(m.device.view(), gate_dev.as<float>(), stream_dev.as<float>(), *workspace, nullptr,
                                    options, fusion);
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_LE(relative_l2(download_floats(stream_dev, c.rows), want), kTolerance);
      }
    }
  }
}

// Atomic split-K (GemvOptions::atomic_reduce): the slices added into y in place (the residual stream) or into
// zeros left by another launch's GemvFusion::clear, against the reference; two slices into zeros bitwise the
// same on every run.
TEST(KernelsCuda, GemvAtomicSplitKMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(33);
  auto workspace = cuda::GemvWorkspace::create();
  ASSERT_TRUE(workspace.ok());
  struct Case { std::vector<int64_t> rows; int64_t cols, group; int bits; };
  for (const Case& c : {Case{{4096}, 14336, 128, 4}, Case{{14336, 14336}, 4096, -1, 4}, Case{{200, 72}, 1024, 64, 4},
                        Case{{68}, 128, -1, 8}}) {
    std::vector<TestGptq> matrices;
    for (int64_t rows : c.rows) matrices.push_back(make_gptq(rng, rows, c.cols, c.bits, c.group, false));
    const std::vector<float> x = random_floats(rng, c.cols, 2.0f), stream = random_floats(rng, c.rows[0]);
    const std::vector<float> x16 = round_to_f16(x);
    cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4);
    const bool in_place = c.rows.size() == 1;
    const int steps = static_cast<int>((c.cols * c.bits / 32 + 3) / 4);
    for (int k_splits : {0, 1, 2, std::min(steps, 5)}) {
      SCOPED_TRACE(std::to_string(c.rows[0]) + "x" + std::to_string(c.cols) + (in_place ? " in place" : " cleared") +
                   " k_splits " + std::to_string(k_splits));
      std::vector<std::vector<float>> first;
      for (int run = 0; run < 2; ++run) {
        std::vector<cuda::DeviceBuffer> outputs;
        std::vector<cuda::GemvGroupMember> members;
        for (const TestGptq& m : matrices) {
          outputs.push_back(in_place ? to_device(stream.data(), stream.size() * 4) : to_device(x.data(), m.host.rows * 4));
          members.push_back({&m.device.view(), outputs.back().as<float>()});
        }
        if (!in_place) {  // garbage in y, cleared by a launch before (one buffer each, as the fused step does)
          for (size_t i = 0; i < outputs.size(); ++i) {
            ASSERT_TRUE(outputs[i].fill_bytes(0x7F).ok());
            cuda::GemvFusion clear;
            clear.clear[i % 2] = {outputs[i].as<float>(), matrices[i].host.rows};
            auto scratch = cuda::DeviceBuffer::allocate(matrices[0].host.rows * 4);
            ASSERT_TRUE(scratch.ok());
            Status st = cuda::gemv_gptq(matrices[0].device.view(), x_dev.as<float>(), scratch->as<float>(), *workspace,
                                        nullptr, {}, clear);
            ASSERT_TRUE(st.ok()) << st.to_string();
          }
        }
        cuda::GemvOptions options;
        options.k_splits = k_splits;
        options.overlap_previous = true;
        options.atomic_reduce = true;
        cuda::GemvFusion fusion;
        if (in_place) fusion.residual = outputs[0].as<float>();
        Status st = cuda::gemv_gptq_grouped(members, x_dev.as<float>(), *workspace, nullptr, options, fusion);
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (size_t i = 0; i < matrices.size(); ++i) {
          std::vector<float> want(matrices[i].host.rows);
          ref::matmul(x16.data(), 1, matrices[i].host.view(), want.data());
          if (in_place) ref::add_in_place(want.data(), stream.data(), want.size());
          const std::vector<float> got = download_floats(outputs[i], matrices[i].host.rows);
          EXPECT_LE(relative_l2(got, want), kTolerance) << "matrix " << i;
          if (run == 0) {
            first.push_back(got);
          } else if (!in_place && (k_splits == 1 || k_splits == 2)) {
            EXPECT_EQ(got, first[i]) << "two slices into zeros must be reproducible";
          }
        }
      }
    }
  }
  // Refusals: a residual that is not y, a misaligned or ragged buffer to clear.
  const TestGptq m = make_gptq(rng, 64, 256, 4, 128, true);
  auto y = cuda::DeviceBuffer::allocate(4096);
  ASSERT_TRUE(y.ok());
  cuda::GemvOptions atomic;
  atomic.atomic_reduce = true;
  cuda::GemvFusion elsewhere;
  elsewhere.residual = y->as<float>() + 64;
  EXPECT_FALSE(cuda::gemv_gptq(m.device.view(), y->as<float>() + 512, y->as<float>(), *workspace, nullptr, atomic, elsewhere).ok());
  cuda::GemvFusion ragged;
  ragged.clear[0] = {y->as<float>(), 6};
  EXPECT_FALSE(cuda::gemv_gptq(m.device.view(), y->as<float>() + 512, y->as<float>() + 64, *workspace, nullptr, {}, ragged).ok());
  ragged.clear[0] = {};
  ragged.clear[1] = {y->as<float>() + 1, 8};
  EXPECT_FALSE(cuda::gemv_gptq(m.device.view(), y->as<float>() + 512, y->as<float>() + 64, *workspace, nullptr, {}, ragged).ok());
}

// gemv_tma.h's tensor-copy-fed GEMV (a probe for the decode step, not used by the model): the register kernel's
// arithmetic, so ref::matmul's sums within kTolerance, on shapes with partial row tiles, partial warps, partial
// stages and uneven slices, every stage count; and what it refuses.
TEST(KernelsCuda, GemvTmaMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(35);
  auto workspace = cuda::GemvWorkspace::create();
  ASSERT_TRUE(workspace.ok());
  auto devices = cuda::list_devices();
  ASSERT_TRUE(devices.ok());
  const int multiprocessors = (*devices)[0].multiprocessors;
  struct Case { int64_t rows, cols; };
  for (const Case& c : {Case{4096, 4096}, Case{1000, 2048}, Case{200, 96}, Case{72, 4096}, Case{14336, 4096}, Case{264, 8224}}) {
    const TestGptq m = make_gptq(rng, c.rows, c.cols, 4, -1, false);
    const std::vector<float> x = random_floats(rng, c.cols, 2.0f);
    const std::vector<float> x16 = round_to_f16(x);
    std::vector<float> want(c.rows);
    ref::matmul(x16.data(), 1, m.host.view(), want.data());
    cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4);
    auto y = cuda::DeviceBuffer::allocate(c.rows * 4);
    ASSERT_TRUE(y.ok());
    for (int k_splits : {0, 1, 5}) {
      for (int stages : {1, 2, 4, cuda::kMaxGemvTmaStages}) {
        SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " k_splits " + std::to_string(k_splits) +
                     " stages " + std::to_string(stages));
        ASSERT_TRUE(y->fill_bytes(0).ok());
        cuda::GemvTmaOptions options;
        options.k_splits = k_splits;
        options.stages = stages;
        options.prewait_stages = k_splits == 5 ? 1 : -1;  // the rest asked for after x is staged
        const Status st = cuda::gemv_gptq_tma(m.device.view(), x_dev.as<float>(), y->as<float>(), multiprocessors, nullptr, options);
        if (st.code() == ErrorCode::kUnsupported) GTEST_SKIP() << st.to_string();  // before compute capability 9.0
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_LE(relative_l2(download_floats(*y, c.rows), want), kTolerance);
      }
    }
  }
  // Groups of 128 and 256 inputs with one zero for all (a symmetric grid, petrel's default): each half stage
  // promoted with its group's scales, slices rounded to whole 128-input groups (odd k_splits, partial stages); against
  // the reference, and against the register kernel's atomic launch (the same sums, added in another order).
  struct GroupCase { int64_t rows, cols, group; };
  for (const GroupCase& c : {GroupCase{1000, 2048, 128}, GroupCase{264, 1152, 128}, GroupCase{4096, 4096, 128},
                             GroupCase{72, 4096, 256}, GroupCase{200, 1536, 256}}) {
    const TestGptq m = make_gptq(rng, c.rows, c.cols, 4, c.group, true);
    ASSERT_GE(m.device.view().uniform_zero, 0);
    const std::vector<float> x = random_floats(rng, c.cols, 2.0f);
    const std::vector<float> x16 = round_to_f16(x);
    std::vector<float> want(c.rows);
    ref::matmul(x16.data(), 1, m.host.view(), want.data());
    cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4);
    auto y = cuda::DeviceBuffer::allocate(c.rows * 4), y_register = cuda::DeviceBuffer::allocate(c.rows * 4);
    ASSERT_TRUE(y.ok() && y_register.ok());
    for (int k_splits : {0, 1, 3, 5}) {
      for (int stages : {1, 2}) {
        SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " group " + std::to_string(c.group) +
                     " k_splits " + std::to_string(k_splits) + " stages " + std::to_string(stages));
        ASSERT_TRUE(y->fill_bytes(0).ok());
        ASSERT_TRUE(y_register->fill_bytes(0).ok());
        cuda::GemvTmaOptions options;
        options.k_splits = k_splits;
        options.stages = stages;
        const Status st = cuda::gemv_gptq_tma(m.device.view(), x_dev.as<float>(), y->as<float>(), multiprocessors, nullptr, options);
        ASSERT_TRUE(st.ok()) << st.to_string();
        const std::vector<float> got = download_floats(*y, c.rows);
        EXPECT_LE(relative_l2(got, want), kTolerance);
        cuda::GemvOptions atomic;
        atomic.k_splits = k_splits;
        atomic.atomic_reduce = true;
        ASSERT_TRUE(cuda::gemv_gptq(m.device.view(), x_dev.as<float>(), y_register->as<float>(), *workspace, nullptr, atomic).ok());
        EXPECT_LE(relative_l2(got, download_floats(*y_register, c.rows)), 1e-5);
      }
    }
  }
  {  // zeros that vary by group, and groups not a multiple of 128 inputs: refused, naming why
    const TestGptq asymmetric = make_gptq(rng, 256, 1024, 4, 128, false);
    const TestGptq small_groups = make_gptq(rng, 256, 1024, 4, 64, true);
    for (const TestGptq* m : {&asymmetric, &small_groups}) {
      if (m == &asymmetric && m->device.view().uniform_zero >= 0) continue;  // random zeros that came out equal
      const Status st = cuda::gemv_gptq_tma_supports(m->device.view());
      EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
      EXPECT_NE(st.message().find("group size"), std::string::npos) << st.to_string();
    }
  }
  // Grouped (gate/up-like: two members side by side in one grid) with the RMSNorm input and a vector cleared, as the
  // decode step would launch it: against the reference ops, and against gemv_gptq_grouped with atomic split-K on
  // the same slices (its sums of squares in the same order).
  for (const int64_t cols : {2048, 5120}) {
    std::vector<TestGptq> matrices;
    for (int64_t rows : {1000, 2048}) matrices.push_back(make_gptq(rng, rows, cols, 4, -1, false));
    const std::vector<float> x = random_floats(rng, cols, 2.0f);
    cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4);
    for (DType norm_dtype : kFloatTypes) {
      const StoredFloats norm = store_as(random_floats(rng, cols), norm_dtype);
      cuda::DeviceBuffer norm_dev = to_device(norm.bytes.data(), norm.bytes.size());
      std::vector<float> in(cols);
      ref::rms_norm(x.data(), 1, cols, ref::DenseMatrix{norm_dtype, 1, cols, norm.bytes.data()}, 1e-5f, in.data());
      const std::vector<float> in16 = round_to_f16(in);
      std::vector<cuda::DeviceBuffer> outputs, register_outputs;
      std::vector<cuda::GemvGroupMember> members, register_members;
      for (const TestGptq& m : matrices) {
        outputs.push_back(to_device(x.data(), m.host.rows * 4));
        register_outputs.push_back(to_device(x.data(), m.host.rows * 4));
        ASSERT_TRUE(outputs.back().fill_bytes(0).ok());
        ASSERT_TRUE(register_outputs.back().fill_bytes(0).ok());
        members.push_back({&m.device.view(), outputs.back().as<float>()});
        register_members.push_back({&m.device.view(), register_outputs.back().as<float>()});
      }
      cuda::DeviceBuffer cleared = to_device(x.data(), 64 * 4);
      cuda::GemvFusion fusion;
      fusion.input = cuda::GemvInput::kRmsNorm;
      fusion.norm_weight = cuda::DeviceVector{norm_dtype, cols, norm_dev.data()};
      fusion.norm_eps = 1e-5f;
      fusion.clear[1] = {cleared.as<float>(), 64};
      cuda::GemvTmaOptions options;
      options.k_splits = 2;
      options.stages = 3;
      options.overlap_previous = true;
      const Status st = cuda::gemv_gptq_tma_grouped(members, x_dev.as<float>(), multiprocessors, nullptr, options, fusion);
      ASSERT_TRUE(st.ok()) << st.to_string();
      cuda::GemvOptions atomic;
      atomic.k_splits = 2;
      atomic.atomic_reduce = true;
      atomic.overlap_previous = true;
      const Status rst = cuda::gemv_gptq_grouped(register_members, x_dev.as<float>(), *workspace, nullptr, atomic, fusion);
      ASSERT_TRUE(rst.ok()) << rst.to_string();
      for (size_t i = 0; i < matrices.size(); ++i) {
        SCOPED_TRACE("grouped RMSNorm " + std::string(dtype_name(norm_dtype)) + ", matrix " + std::to_string(i));
        std::vector<float> want(matrices[i].host.rows);
        ref::matmul(in16.data(), 1, matrices[i].host.view(), want.data());
        const std::vector<float> got = download_floats(outputs[i], matrices[i].host.rows);
        EXPECT_LE(relative_l2(got, want), 1e-4);  // the sum of squares' order may move an fp16 rounding
        EXPECT_EQ(got, download_floats(register_outputs[i], matrices[i].host.rows)) << "two slices into zeros: same bits";
      }
      EXPECT_EQ(download_floats(cleared, 64), std::vector<float>(64, 0.0f));
    }
  }
  // SiLU(gate) * up (down's input), the grid of slices: against the reference ops, and bitwise against the register
  // kernel's atomic launch on the same slices (one slice into zeros: one add a row).
  {
    const int64_t rows = 1000, cols = 2816;
    const TestGptq m = make_gptq(rng, rows, cols, 4, -1, false);
    const std::vector<float> gate = random_floats(rng, cols, 3.0f), up = random_floats(rng, cols, 2.0f);
    std::vector<float> in(cols);
    ref::silu_mul(gate.data(), up.data(), cols, in.data());
    const std::vector<float> in16 = round_to_f16(in);
    std::vector<float> want(rows);
    ref::matmul(in16.data(), 1, m.host.view(), want.data());
    cuda::DeviceBuffer gate_dev = to_device(gate.data(), cols * 4), up_dev = to_device(up.data(), cols * 4);
    auto y = cuda::DeviceBuffer::allocate(rows * 4), y_register = cuda::DeviceBuffer::allocate(rows * 4);
    ASSERT_TRUE(y.ok() && y_register.ok());
    cuda::GemvFusion fusion;
    fusion.input = cuda::GemvInput::kSiluMul;
    fusion.up = up_dev.as<float>();
    for (int k_splits : {1, 4}) {
      SCOPED_TRACE("SiLU * up, k_splits " + std::to_string(k_splits));
      ASSERT_TRUE(y->fill_bytes(0).ok());
      ASSERT_TRUE(y_register->fill_bytes(0).ok());
      cuda::GemvTmaOptions options;
      options.k_splits = k_splits;
      options.stages = 2;
      const cuda::GemvGroupMember member{&m.device.view(), y->as<float>()};
      const Status st = cuda::gemv_gptq_tma_grouped({&member, 1}, gate_dev.as<float>(), multiprocessors, nullptr, options, fusion);
      ASSERT_TRUE(st.ok()) << st.to_string();
      const std::vector<float> got = download_floats(*y, rows);
      EXPECT_LE(relative_l2(got, want), kTolerance);
      if (k_splits == 1) {
        cuda::GemvOptions atomic;
        atomic.k_splits = 1;
        atomic.atomic_reduce = true;
        const cuda::GemvGroupMember register_member{&m.device.view(), y_register->as<float>()};
        const Status rst = cuda::gemv_gptq_grouped({&register_member, 1}, gate_dev.as<float>(), *workspace, nullptr, atomic, fusion);
        ASSERT_TRUE(rst.ok()) << rst.to_string();
        EXPECT_EQ(got, download_floats(*y_register, rows));
      }
    }
  }
  const TestGptq grouped = make_gptq(rng, 64, 256, 4, 128, false), wide = make_gptq(rng, 64, 256, 8, -1, false),
                 plain = make_gptq(rng, 64, 256, 4, -1, false);
  auto y = cuda::DeviceBuffer::allocate(4096);
  ASSERT_TRUE(y.ok());
  EXPECT_FALSE(cuda::gemv_gptq_tma(grouped.device.view(), y->as<float>() + 512, y->as<float>(), multiprocessors).ok());
  EXPECT_FALSE(cuda::gemv_gptq_tma(wide.device.view(), y->as<float>() + 512, y->as<float>(), multiprocessors).ok());
  EXPECT_FALSE(cuda::gemv_gptq_tma(plain.device.view(), y->as<float>() + 513, y->as<float>(), multiprocessors).ok());
  cuda::GemvTmaOptions too_deep;
  too_deep.stages = cuda::kMaxGemvTmaStages + 1;
  EXPECT_FALSE(cuda::gemv_gptq_tma(plain.device.view(), y->as<float>() + 512, y->as<float>(), multiprocessors, nullptr, too_deep).ok());
}

// The records in a timeline ring after one GEMV launch of `blocks` blocks (timeline.h's layout: tag, kind | sm,
// block | steps, t0, then t1 t2 t3 t4 t5 t6 t7 t8 - t0): every block once, with the launch's tag (its qweight), the
// kind and the steps a block; stamps in order, t5 (loads or stages asked for) <= t1 (past the wait) <= t2 (x staged;
// RMSNorm inputs t4, the sum of squares, between) <= t3 (out of the loop) <= t8 (the end), well under a
// millisecond; attention's t6 and t7 (and t4 without an RMSNorm input) not reached.
void expect_gemv_records(const cuda::DeviceBuffer& records, const cuda::DeviceBuffer& count, uint32_t blocks,
                         const void* qweight, uint32_t kind, uint32_t steps) {
  constexpr uint32_t kNotReached = 0xFFFFFFFFu;
  const bool norm = (kind & 0xFu) == static_cast<uint32_t>(cuda::GemvInput::kRmsNorm);
  std::vector<uint32_t> n(1);
  ASSERT_TRUE(cuda::synchronize().ok());
  ASSERT_TRUE(count.download(n.data(), 4).ok());
  ASSERT_EQ(n[0], blocks) << "one record a block";
  std::vector<uint32_t> words(n[0] * cuda::kTimelineWords);
  ASSERT_TRUE(records.download(words.data(), words.size() * 4).ok());
  std::vector<bool> seen(blocks, false);
  for (uint32_t i = 0; i < n[0]; ++i) {
    const uint32_t* r = words.data() + i * cuda::kTimelineWords;
    const uint32_t t1 = r[4], t2 = r[5], t3 = r[6], t4 = r[7], t5 = r[8], t8 = r[11];
    EXPECT_EQ(r[0], static_cast<uint32_t>(reinterpret_cast<uintptr_t>(qweight)));
    EXPECT_EQ(r[1] & 0xFFFFu, kind);
    const uint32_t block = r[2] & 0xFFFFu;
    ASSERT_LT(block, blocks);
    EXPECT_FALSE(seen[block]) << "block " << block << " twice";
    seen[block] = true;
    EXPECT_EQ(r[2] >> 16, steps) << "input steps a block";
    EXPECT_LE(t5, t1) << "t5, the block's loads issued, comes before t1, its wait done";
    if (norm) {
      EXPECT_LE(t1, t4) << "t1 before t4, the sum of squares";
      EXPECT_LE(t4, t2) << "t4 before t2, x staged";
    } else {
      EXPECT_LE(t1, t2);
      EXPECT_EQ(t4, kNotReached) << "t4: RMSNorm GEMVs' (and attention's)";
    }
    EXPECT_LE(t2, t3);
    EXPECT_LE(t3, t8);
    EXPECT_LT(t8, 1000000u) << "a block of a small GEMV takes well under a millisecond";
    for (int k : {9, 10}) EXPECT_EQ(r[k], kNotReached) << "stamp " << k - 3 << ": attention's";
  }
  for (uint32_t b = 0; b < blocks; ++b) EXPECT_TRUE(seen[b]) << "block " << b;
}

// The block timeline (timeline.h): with a ring installed, a GEMV launch appends one record a block with its
// stamps in order, and its result is unchanged; removed, nothing is appended.
TEST(KernelsCuda, TimelineRecordsEveryBlockOfAGemv) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(34);
  auto workspace = cuda::GemvWorkspace::create();
  ASSERT_TRUE(workspace.ok());
  const TestGptq m = make_gptq(rng, 1000, 2048, 4, 128, false);
  const std::vector<float> x = random_floats(rng, 2048);
  cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4);
  auto y = cuda::DeviceBuffer::allocate(1000 * 4), y_timed = cuda::DeviceBuffer::allocate(1000 * 4);
  auto records = cuda::DeviceBuffer::allocate(4096 * cuda::kTimelineWords * 4), count = cuda::DeviceBuffer::allocate(4);
  ASSERT_TRUE(y.ok() && y_timed.ok() && records.ok() && count.ok());
  ASSERT_TRUE(count->fill_bytes(0).ok());
  cuda::GemvOptions options;
  options.k_splits = 4;
  ASSERT_TRUE(cuda::gemv_gptq(m.device.view(), x_dev.as<float>(), y->as<float>(), *workspace, nullptr, options).ok());
  const cuda::TimelineRing ring{records->as<uint32_t>(), count->as<uint32_t>(), 4096};
  cuda::set_timeline(&ring);
  Status st = cuda::gemv_gptq(m.device.view(), x_dev.as<float>(), y_timed->as<float>(), *workspace, nullptr, options);
  cuda::set_timeline(nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(cuda::gemv_gptq(m.device.view(), x_dev.as<float>(), y_timed->as<float>(), *workspace, nullptr, options).ok());
  EXPECT_EQ(download_floats(*y_timed, 1000), download_floats(*y, 1000));
  // 8 row tiles x 4 slices; 2048 inputs = 256 words = 64 steps over 4 slices; 4-bit, plain input.
  expect_gemv_records(*records, *count, 32, m.device.view().qweight, 0x40u, 16);
}

// The same for the tensor-copy GEMV (gemv_tma.cu's timeline twin): one record a block with gemv_gptq's kind and
// stamps in order (t4 the RMSNorm input's sum of squares), the sums those of the product's kernel.
TEST(KernelsCuda, TimelineRecordsEveryBlockOfATensorCopyGemv) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto devices = cuda::list_devices();
  ASSERT_TRUE(devices.ok());
  if ((*devices)[0].compute_major < 9) GTEST_SKIP() << "tensor copies need compute capability 9.0";
  std::mt19937 rng(41);
  const TestGptq m = make_gptq(rng, 1000, 2048, 4, -1, false);
  const std::vector<float> x = random_floats(rng, 2048), norm = random_floats(rng, 2048);
  cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4), norm_dev = to_device(norm.data(), norm.size() * 4);
  auto y = cuda::DeviceBuffer::allocate(1000 * 4), y_timed = cuda::DeviceBuffer::allocate(1000 * 4);
  auto records = cuda::DeviceBuffer::allocate(4096 * cuda::kTimelineWords * 4), count = cuda::DeviceBuffer::allocate(4);
  ASSERT_TRUE(y.ok() && y_timed.ok() && records.ok() && count.ok());
  ASSERT_TRUE(count->fill_bytes(0).ok() && y->fill_bytes(0).ok() && y_timed->fill_bytes(0).ok());
  cuda::GemvTmaOptions options;
  options.k_splits = 1;  // one slice a row tile: the same sums in the same order, bit for bit
  options.stages = 1;
  cuda::GemvFusion fusion;
  fusion.input = cuda::GemvInput::kRmsNorm;
  fusion.norm_weight = cuda::DeviceVector{DType::kF32, 2048, norm_dev.data()};
  fusion.norm_eps = 1e-5f;
  const cuda::GemvGroupMember member{&m.device.view(), y->as<float>()}, timed{&m.device.view(), y_timed->as<float>()};
  const int multiprocessors = (*devices)[0].multiprocessors;
  ASSERT_TRUE(cuda::gemv_gptq_tma_grouped({&member, 1}, x_dev.as<float>(), multiprocessors, nullptr, options, fusion).ok());
  const cuda::TimelineRing ring{records->as<uint32_t>(), count->as<uint32_t>(), 4096};
  cuda::set_timeline(&ring);
  const Status st = cuda::gemv_gptq_tma_grouped({&timed, 1}, x_dev.as<float>(), multiprocessors, nullptr, options, fusion);
  cuda::set_timeline(nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(download_floats(*y_timed, 1000), download_floats(*y, 1000));
  // 8 row tiles x 1 slice of 64 steps (2048 inputs = 256 words); 4-bit, RMSNorm input.
  expect_gemv_records(*records, *count, 8, m.device.view().qweight, 0x41u, 64);
}

// The batch kernels (prompt chunks of up to 32 tokens through the GEMV): every token's row against
// ref::matmul on that row rounded to fp16, and bit for bit against the vector kernel on the same row with the
// same k_splits; grouped members, SiLU*up input, the residual epilogue, several row tiles per block, and
// token counts that leave n-tiles partly empty.
TEST(KernelsCuda, BatchGemvMatchesReferenceAndTheVectorKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(33);
  struct Case { std::vector<int64_t> rows; int64_t cols, group; bool symmetric; };
  const Case cases[] = {
      {{4096, 1024, 1024}, 4096, -1, true},  // Llama-3.1-8B q/k/v
      {{200, 72, 1032}, 1024, 128, false},   // rows that are no multiple of the 128-row tile
      {{520}, 1056, 32, false},              // 33 steps: a partial batch of steps, an odd slice
      {{8, 136}, 64, 32, true},              // 2 steps
  };
  auto workspace = cuda::GemvWorkspace::create(int64_t{4} << 20);
  ASSERT_TRUE(workspace.ok()) << workspace.status().to_string();
  double worst = 0;
  for (const Case& c : cases) {
    std::vector<TestGptq> matrices;
    for (int64_t rows : c.rows) matrices.push_back(make_gptq(rng, rows, c.cols, 4, c.group, c.symmetric));
    for (int64_t tokens : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{29}, int64_t{32}}) {
      const std::vector<float> x = random_floats(rng, tokens * c.cols, 2.0f), up = random_floats(rng, tokens * c.cols);
      cuda::DeviceBuffer x_dev = to_device(x.data(), x.size() * 4), up_dev = to_device(up.data(), up.size() * 4);
      for (bool silu : {false, true}) {
        std::vector<float> in = x;
        if (silu) ref::silu_mul(x.data(), up.data(), tokens * c.cols, in.data());
        const std::vector<float> in16 = round_to_f16(in);
        const bool with_residual = matrices.size() == 1;
        const std::vector<float> residual = random_floats(rng, tokens * c.rows[0]);
        std::vector<std::vector<float>> want(matrices.size());
        for (size_t i = 0; i < matrices.size(); ++i) {
          const ref::GptqMatrix m = matrices[i].host.view();
          want[i].resize(tokens * m.rows);
          ref::matmul(in16.data(), tokens, m, want[i].data());
          if (with_residual) ref::add_in_place(want[i].data(), residual.data(), tokens * m.rows);
        }
        const int steps = static_cast<int>((c.cols / 8 + 3) / 4);
        for (int k_splits : {0, 1, std::min(steps, 3)}) {
          for (int row_tiles : {0, 1, 3}) {
            SCOPED_TRACE(std::to_string(c.rows.size()) + " matrices of " + std::to_string(c.cols) + " cols, group " +
                         std::to_string(c.group) + ", " + std::to_string(tokens) + " tokens" + (silu ? ", silu" : "") +
                         ", k_splits " + std::to_string(k_splits) + ", row_tiles " + std::to_string(row_tiles));
            std::vector<cuda::DeviceBuffer> outputs;
            std::vector<cuda::GemvGroupMember> members;
            for (const TestGptq& m : matrices) {
              outputs.push_back(with_residual ? to_device(residual.data(), residual.size() * 4)
                                              : to_device(std::vector<float>(tokens * m.host.rows, NAN).data(),
                                                          tokens * m.host.rows * 4));
              members.push_back({&m.device.view(), outputs.back().as<float>()});
            }
            cuda::GemvOptions options;
            options.k_splits = k_splits;
            options.row_tiles = row_tiles;
            options.overlap_previous = row_tiles == 1;
            cuda::GemvFusion fusion;
            fusion.input = silu ? cuda::GemvInput::kSiluMul : cuda::GemvInput::kPlain;
            fusion.up = up_dev.as<float>();
            if (with_residual) fusion.residual = outputs[0].as<float>();
            Status st = cuda::gemv_gptq_batch(members, x_dev.as<float>(), tokens, *workspace, nullptr, options, fusion);
            ASSERT_TRUE(st.ok()) << st.to_string();
            for (size_t i = 0; i < matrices.size(); ++i) {
              const std::vector<float> got = download_floats(outputs[i], tokens * matrices[i].host.rows);
              const double error = relative_l2(got, want[i]);
              EXPECT_LE(error, kTolerance) << "matrix " << i;
              worst = std::max(worst, error);
            }
            if (k_splits == 0 || row_tiles != 0) continue;
            // Each token through the vector kernel with the same splits (the batch plan may need more than
            // asked for, to fit 32 tokens' x in shared memory): the same bits.
            auto plan = cuda::plan_gemv_gptq_batch(members, tokens, workspace->multiprocessors(),
                                                   workspace->partial_capacity(), options);
            ASSERT_TRUE(plan.ok()) << plan.status().to_string();
            cuda::GemvOptions row_options = options;
            row_options.k_splits = plan->k_splits;
            for (int64_t j : {int64_t{0}, tokens - 1}) {
              std::vector<cuda::DeviceBuffer> rows_out;
              std::vector<cuda::GemvGroupMember> one;
              for (const TestGptq& m : matrices) {
                rows_out.push_back(with_residual ? to_device(residual.data() + j * m.host.rows, m.host.rows * 4)
                                                 : to_device(std::vector<float>(m.host.rows, NAN).data(), m.host.rows * 4));
                one.push_back({&m.device.view(), rows_out.back().as<float>()});
              }
              cuda::GemvFusion row_fusion = fusion;
              row_fusion.up = up_dev.as<float>() + j * c.cols;
              if (with_residual) row_fusion.residual = rows_out[0].as<float>();
              st = cuda::gemv_gptq_grouped(one, x_dev.as<float>() + j * c.cols, *workspace, nullptr, row_options, row_fusion);
              ASSERT_TRUE(st.ok()) << st.to_string();
              for (size_t i = 0; i < matrices.size(); ++i) {
                const int64_t rows = matrices[i].host.rows;
                const std::vector<float> batch = download_floats(outputs[i], tokens * rows);
                EXPECT_EQ(download_floats(rows_out[i], rows), std::vector<float>(batch.begin() + j * rows, batch.begin() + (j + 1) * rows))
                    << "token " << j << ", matrix " << i;
              }
            }
          }
        }
      }
    }
  }
  // Refusals: no tokens, too many, 8-bit weights, an RMSNorm input, a residual on a group.
  const TestGptq four = make_gptq(rng, 64, 256, 4, 128, true), eight = make_gptq(rng, 64, 256, 8, 128, true);
  auto y = cuda::DeviceBuffer::allocate(64 * 64 * 4);
  ASSERT_TRUE(y.ok());
  const cuda::GemvGroupMember m4[] = {{&four.device.view(), y->as<float>()}}, m8[] = {{&eight.device.view(), y->as<float>()}};
  EXPECT_FALSE(cuda::gemv_gptq_batch(m4, y->as<float>(), 0, *workspace).ok());
  EXPECT_FALSE(cuda::gemv_gptq_batch(m4, y->as<float>(), cuda::kMaxGemvTokens + 1, *workspace).ok());
  EXPECT_FALSE(cuda::gemv_gptq_batch(m8, y->as<float>(), 4, *workspace).ok());
  cuda::GemvFusion norm;
  norm.input = cuda::GemvInput::kRmsNorm;
  EXPECT_FALSE(cuda::gemv_gptq_batch(m4, y->as<float>(), 4, *workspace, nullptr, {}, norm).ok());
  cuda::GemvFusion residual;
  residual.residual = y->as<float>();
  const cuda::GemvGroupMember two[] = {m4[0], m4[0]};
  EXPECT_FALSE(cuda::gemv_gptq_batch(two, y->as<float>(), 4, *workspace, nullptr, {}, residual).ok());
  std::printf("[ cuda batch gemv ] worst relative L2 %.3g (x rounded to fp16)\n", worst);
}

// A chain of dependent launches shaped like one layer of the fused step, each overlapping the one before it,
// launched on a stream and replayed from a CUDA graph many times: the same bits as launched one at a time.
TEST(KernelsCuda, OverlappedLaunchChainGivesTheSameBitsAsSerialLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(33);
  const int64_t hidden = 1024, inner = 2816;
  const TestGptq q = make_gptq(rng, hidden, hidden, 4, 128, true), k = make_gptq(rng, 256, hidden, 4, 128, true),
                 o = make_gptq(rng, hidden, hidden, 4, 128, true), gate = make_gptq(rng, inner, hidden, 4, 128, true),
                 up = make_gptq(rng, inner, hidden, 4, 128, true), down = make_gptq(rng, hidden, inner, 4, 128, true);
  const std::vector<float> x0 = random_floats(rng, hidden);
  const StoredFloats norm = store_as(random_floats(rng, hidden), DType::kBF16);
  cuda::DeviceBuffer norm_dev = to_device(norm.bytes.data(), norm.bytes.size());
  auto alloc = [](int64_t n) {
    auto b = cuda::DeviceBuffer::allocate(n * 4);
    EXPECT_TRUE(b.ok());
    return std::move(*b);
  };
  cuda::DeviceBuffer x = alloc(hidden), q_out = alloc(hidden), k_out = alloc(256), g_out = alloc(inner), u_out = alloc(inner);
  auto workspace = cuda::GemvWorkspace::create();
  auto stream = cuda::CudaStream::create();
  ASSERT_TRUE(workspace.ok() && stream.ok());
  auto run_layer = [&](bool overlap, bool cluster = false) -> Status {
    cuda::GemvOptions options;
    options.overlap_previous = overlap;
    options.cluster_reduce = cluster;
    cuda::GemvFusion normed;
    normed.input = cuda::GemvInput::kRmsNorm;
    normed.norm_weight = cuda::DeviceVector{DType::kBF16, hidden, norm_dev.data()};
    normed.norm_eps = 1e-5f;
    const cuda::GemvGroupMember qk[] = {{&q.device.view(), q_out.as<float>()}, {&k.device.view(), k_out.as<float>()}};
    PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_grouped(qk, x.as<float>(), *workspace, stream->get(), options, normed));
    cuda::GemvFusion add;
    add.residual = x.as<float>();
    PETREL_RETURN_IF_ERROR(cuda::gemv_gptq(o.device.view(), q_out.as<float>(), x.as<float>(), *workspace, stream->get(), options, add));
    const cuda::GemvGroupMember gu[] = {{&gate.device.view(), g_out.as<float>()}, {&up.device.view(), u_out.as<float>()}};
    PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_grouped(gu, x.as<float>(), *workspace, stream->get(), options, normed));
    cuda::GemvFusion silu_add;
    silu_add.input = cuda::GemvInput::kSiluMul;
    silu_add.up = u_out.as<float>();
    silu_add.residual = x.as<float>();
    return cuda::gemv_gptq(down.device.view(), g_out.as<float>(), x.as<float>(), *workspace, stream->get(), options, silu_add);
  };
  constexpr int kLayers = 12;
  std::vector<float> serial;
  // serial; overlapped on the stream; overlapped in a graph; the same with cluster split-K reductions
  for (int variant = 0; variant < 5; ++variant) {
    SCOPED_TRACE(variant);
    const bool cluster = variant >= 3;
    ASSERT_TRUE(x.upload(x0.data(), hidden * 4).ok());
    if (variant < 2 || variant == 3) {
      for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(run_layer(variant != 0, cluster).ok());
    } else {
      ASSERT_TRUE(cuda::CudaGraph::begin_capture(stream->get()).ok());
      Status enqueued = Status();
      for (int l = 0; l < kLayers && enqueued.ok(); ++l) enqueued = run_layer(true, cluster);
      auto graph = cuda::CudaGraph::end_capture(stream->get());
      ASSERT_TRUE(enqueued.ok()) << enqueued.to_string();
      ASSERT_TRUE(graph.ok()) << graph.status().to_string();
      ASSERT_TRUE(graph->launch(stream->get()).ok());
    }
    ASSERT_TRUE(stream->synchronize().ok());
    const std::vector<float> got = download_floats(x, hidden);
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
    if (variant == 0) serial = got;
    else EXPECT_EQ(got, serial);
  }
}

// The resident chains (kernels/cuda/resident_gemv.cu) against the same products as gemv_gptq_grouped launches,
// layer-shaped like the decode step (o reads q where the step reads attention's output): the same bits for
// every output, launched on a stream and replayed from a graph, per channel and at groups 128 and 32 (whose
// group changes take compute_batch's per-step path), with member tiles of fewer than 128 rows.
TEST(KernelsCuda, ResidentGemvChainsGiveTheBitsOfGroupedLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto info = cuda::device_info(0);
  ASSERT_TRUE(info.ok());
  if (info->compute_major < 9) GTEST_SKIP() << "resident chains need compute capability 9.0";
  std::mt19937 rng(35);
  struct Case { int64_t hidden, kv, inner, group; };
  // The last: Llama-3.1-8B's shapes (blocks with several units of every product at 4 blocks an SM).
  for (const Case& c : {Case{1024, 256, 2816, 128}, Case{1024, 64, 2816, -1}, Case{256, 64, 768, 32}, Case{512, 128, 1408, 128},
                        Case{4096, 1024, 14336, 128}}) {
    SCOPED_TRACE("hidden " + std::to_string(c.hidden) + ", kv " + std::to_string(c.kv) + ", inner " +
                 std::to_string(c.inner) + ", group " + std::to_string(c.group));
    const TestGptq q = make_gptq(rng, c.hidden, c.hidden, 4, c.group, false), k = make_gptq(rng, c.kv, c.hidden, 4, c.group, true),
                   v = make_gptq(rng, c.kv, c.hidden, 4, c.group, false), o = make_gptq(rng, c.hidden, c.hidden, 4, c.group, true),
                   gate = make_gptq(rng, c.inner, c.hidden, 4, c.group, false),
                   up = make_gptq(rng, c.inner, c.hidden, 4, c.group, true),
                   down = make_gptq(rng, c.hidden, c.inner, 4, c.group, false);
    const std::vector<float> x0 = random_floats(rng, c.hidden);
    const StoredFloats norm1 = store_as(random_floats(rng, c.hidden), DType::kBF16);
    const StoredFloats norm2 = store_as(random_floats(rng, c.hidden), DType::kF32);
    cuda::DeviceBuffer norm1_dev = to_device(norm1.bytes.data(), norm1.bytes.size());
    cuda::DeviceBuffer norm2_dev = to_device(norm2.bytes.data(), norm2.bytes.size());
    auto alloc = [](int64_t n) {
      auto b = cuda::DeviceBuffer::allocate(n * 4);
      EXPECT_TRUE(b.ok());
      return std::move(*b);
    };
    cuda::DeviceBuffer x = alloc(c.hidden), q_out = alloc(c.hidden), k_out = alloc(c.kv), v_out = alloc(c.kv),
                       g_out = alloc(c.inner), u_out = alloc(c.inner);
    auto workspace = cuda::GemvWorkspace::create();
    auto stream = cuda::CudaStream::create();
    ASSERT_TRUE(workspace.ok() && stream.ok());
    cuda::GemvFusion input_norm, post_norm, add, silu_add;
    input_norm.input = post_norm.input = cuda::GemvInput::kRmsNorm;
    input_norm.norm_weight = cuda::DeviceVector{DType::kBF16, c.hidden, norm1_dev.data()};
    post_norm.norm_weight = cuda::DeviceVector{DType::kF32, c.hidden, norm2_dev.data()};
    input_norm.norm_eps = post_norm.norm_eps = 1e-5f;
    add.residual = x.as<float>();
    silu_add.input = cuda::GemvInput::kSiluMul;
    silu_add.up = u_out.as<float>();
    silu_add.residual = x.as<float>();
    const std::vector<cuda::GemvGroupMember> qkv_members = {
        {&q.device.view(), q_out.as<float>()}, {&k.device.view(), k_out.as<float>()}, {&v.device.view(), v_out.as<float>()}};
    const std::vector<cuda::GemvGroupMember> o_members = {{&o.device.view(), x.as<float>()}};
    const std::vector<cuda::GemvGroupMember> gu_members = {{&gate.device.view(), g_out.as<float>()}, {&up.device.view(), u_out.as<float>()}};
    const std::vector<cuda::GemvGroupMember> down_members = {{&down.device.view(), x.as<float>()}};
    const cuda::ResidentGemv qkv{qkv_members, x.as<float>(), input_norm}, o_product{o_members, q_out.as<float>(), add},
        gu{gu_members, x.as<float>(), post_norm}, down_product{down_members, g_out.as<float>(), silu_add};
    constexpr int kLayers = 6;
    // Chain 0: q/k/v; chains 1 .. kLayers - 1: o, gate/up, down, q/k/v; the last: o, gate/up, down.
    std::vector<std::vector<cuda::ResidentGemv>> chains = {{qkv}};
    for (int l = 1; l < kLayers; ++l) chains.push_back({o_product, gu, down_product, qkv});
    chains.push_back({o_product, gu, down_product});

    auto outputs = [&] {
      std::vector<float> all = download_floats(x, c.hidden);
      for (const cuda::DeviceBuffer* b : {&q_out, &k_out, &v_out, &g_out, &u_out}) {
        const std::vector<float> part = download_floats(*b, static_cast<int64_t>(b->size() / 4));
        all.insert(all.end(), part.begin(), part.end());
      }
      return all;
    };
    auto start = [&] {
      EXPECT_TRUE(x.upload(x0.data(), c.hidden * 4).ok());
      for (cuda::DeviceBuffer* b : {&q_out, &k_out, &v_out, &g_out, &u_out}) EXPECT_TRUE(b->fill_bytes(0xFF).ok());
    };
    // Resident, with slices of at least 32 steps (the default) and with the GEMV planner's (min_unit_steps
    // 0), at 1 block an SM (many units a block) and as many as fit: serial launches, overlapped launches,
    // overlapped launches in a graph replayed three times; units handed out slices outermost (the default) and
    // tiles outermost; weights streamed from the tiled copy. The reference: every product as its own grouped launch with the same k_splits, one
    // after another.
    for (int variant = 0; variant < 24; ++variant) {
      SCOPED_TRACE("variant " + std::to_string(variant));
      cuda::ResidentGemvOptions options;
      options.max_blocks_per_sm = variant % 6 < 3 ? 1 : 0;
      options.min_unit_steps = variant % 12 < 6 || variant >= 18 ? 32 : 0;
      options.slices_outermost = variant < 12 || variant >= 18;
      options.tiled_copy = variant >= 18;  // stages from the tiled copy (whole-stage slices: min_unit_steps 32)
      auto resident = cuda::ResidentGemvChains::create(chains, workspace->partial_capacity(), options);
      ASSERT_TRUE(resident.ok()) << resident.status().to_string();
      ASSERT_EQ(resident->size(), kLayers + 1);
      start();
      for (int i = 0; i < resident->size(); ++i) {
        for (size_t p = 0; p < chains[i].size(); ++p) {
          const cuda::ResidentGemv& g = chains[i][p];
          cuda::GemvOptions serial;
          serial.k_splits = resident->k_splits(i, static_cast<int>(p));
          Status st = cuda::gemv_gptq_grouped(g.members, g.x, *workspace, stream->get(), serial, g.fusion);
          ASSERT_TRUE(st.ok()) << st.to_string();
        }
      }
      ASSERT_TRUE(stream->synchronize().ok());
      const std::vector<float> want = outputs();
      for (float value : want) ASSERT_TRUE(std::isfinite(value));
      const bool overlap = variant % 3 > 0;
      start();
      if (variant % 3 < 2) {
        for (int i = 0; i < resident->size(); ++i) ASSERT_TRUE(resident->enqueue(i, stream->get(), overlap).ok());
      } else {
        ASSERT_TRUE(cuda::CudaGraph::begin_capture(stream->get()).ok());
        Status enqueued = Status();
        for (int i = 0; i < resident->size() && enqueued.ok(); ++i) enqueued = resident->enqueue(i, stream->get(), overlap);
        auto graph = cuda::CudaGraph::end_capture(stream->get());
        ASSERT_TRUE(enqueued.ok()) << enqueued.to_string();
        ASSERT_TRUE(graph.ok()) << graph.status().to_string();
        for (int replay = 0; replay < 3; ++replay) {
          start();
          ASSERT_TRUE(graph->launch(stream->get()).ok());
          ASSERT_TRUE(stream->synchronize().ok());
          EXPECT_EQ(outputs(), want) << "replay " << replay;
        }
        continue;
      }
      ASSERT_TRUE(stream->synchronize().ok());
      EXPECT_EQ(outputs(), want);
    }
  }
}

// The fused decode attention's default grid, cut to one wave (host arithmetic: runs without a GPU). The H200's
// numbers for Llama-3.1-8B: 132 SMs; at a 8,192-position cache a block takes ~153 KB of shared memory (one an
// SM), at 4,096 ~84 KB (two).
TEST(KernelsCuda, DecodeAttentionDefaultGridIsOneWave) {
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(8, 32, 132, 1), 16);   // 256 blocks would be 2 waves
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(8, 32, 132, 2), 32);   // 256 <= 264: as it is
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(8, 16, 132, 1), 16);
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(8, 32, 100, 1), 12);
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(64, 32, 132, 1), 2);
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(200, 4, 132, 1), 1);   // never below one block a KV head
  EXPECT_EQ(cuda::decode_attention_one_wave_blocks(8, 32, 132, 0), 16);   // a block larger than an SM's room: as 1
}

TEST(KernelsCuda, DecodeAttentionRopeMatchesRopeThenAttention) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(34);
  struct Case { int64_t n_heads, n_kv_heads, head_dim, position, context, split, max_blocks = 0; };
  RopeConfig rope_config;
  rope_config.theta = 500000.0;
  double worst = 0, worst_mma = 0;
  for (const Case& c : {Case{32, 8, 128, 0, 4096, 0}, Case{32, 8, 128, 63, 4096, 0}, Case{32, 8, 128, 64, 4096, 0},
                        Case{32, 8, 128, 1000, 4096, 0}, Case{8, 2, 32, 299, 512, 0}, Case{4, 1, 40, 76, 128, 16},
                        Case{6, 6, 16, 128, 256, 32}, Case{64, 1, 64, 49, 64, 0}, Case{2, 2, 256, 32, 33, 7},
                        Case{8, 2, 30, 4, 5, 1}, Case{3, 1, 2, 9, 16, 4}, Case{32, 8, 128, 4095, 4096, 0},
                        // past 4 chunk slots x 32 blocks: several rounds of chunks a block, two stage buffers
                        Case{8, 2, 64, 9000, 10000, 0}, Case{4, 2, 128, 5000, 5001, 0},
                        // a capped grid (DecodeAttentionShape::fused_max_blocks): more chunks and rounds a block
                        Case{32, 8, 128, 1000, 4096, 0, 1}, Case{32, 8, 128, 4095, 4096, 0, 2},
                        Case{32, 8, 128, 100, 4096, 0, 4}, Case{8, 2, 64, 9000, 10000, 0, 3},
                        // the tensor-core build's edges: 16, 1 and 5 query heads a KV head (rows of its products),
                        // chunk boundaries, a partial last chunk in a later round
                        Case{32, 2, 64, 31, 64, 0}, Case{8, 8, 128, 32, 128, 0}, Case{10, 2, 128, 160, 4096, 0, 1},
                        Case{20, 4, 64, 300, 512, 0, 2}}) {
    std::vector<float> tensor_core_result;  // mode 0's (the warm pass), which modes 4 and 5 (without) must equal
    const uint32_t case_seed = rng();         // every mode of a case on the same inputs
    for (int mode = 0; mode < 6; ++mode) {
      std::mt19937 mode_rng(case_seed);
      const bool overlap = mode % 2 == 1, tensor_cores = mode < 2 || mode >= 4;
      const bool warm = mode < 2;  // the tensor-core build's warm pass (the default), modes 4 and 5 without it
      SCOPED_TRACE(std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads of " +
                   std::to_string(c.head_dim) + " at position " + std::to_string(c.position) + " of " +
                   std::to_string(c.context) + ", split " + std::to_string(c.split) + ", at most " +
                   std::to_string(c.max_blocks) + " blocks" + (overlap ? ", overlapped" : "") +
                   (tensor_cores ? ", tensor cores where the shape allows" : ", float32") + (warm ? ", warm pass" : ""));
      const int64_t kv_dim = c.n_kv_heads * c.head_dim;
      const std::vector<float> q = random_floats(mode_rng, c.n_heads * c.head_dim, 0.5f),
                               k = random_floats(mode_rng, kv_dim, 0.5f), v = random_floats(mode_rng, kv_dim);
      StoredFloats keys = store_as(random_floats(mode_rng, c.context * kv_dim), DType::kF16);
      StoredFloats values = store_as(random_floats(mode_rng, c.context * kv_dim), DType::kF16);
      const std::vector<float> inv_freq = rope_inverse_frequencies(rope_config, c.head_dim);
      const auto [want_q, want_k] = rope_reference(q, k, inv_freq, c.position, c.n_heads, c.n_kv_heads, c.head_dim);

      cuda::DeviceBuffer q_dev = to_device(q.data(), q.size() * 4), k_dev = to_device(k.data(), k.size() * 4),
                         v_dev = to_device(v.data(), v.size() * 4), f_dev = to_device(inv_freq.data(), inv_freq.size() * 4),
                         keys_dev = to_device(keys.bytes.data(), keys.bytes.size()),
                         values_dev = to_device(values.bytes.data(), values.bytes.size());
      const int32_t position = static_cast<int32_t>(c.position);
      cuda::DeviceBuffer pos_dev = to_device(&position, 4);
      const cuda::DecodeAttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.context, c.split, c.max_blocks,
                                             tensor_cores, warm};
      // The tensor-core build (head_dim 32, 64 or 128, at most 16 query heads a KV head) rounds q and the
      // probabilities to fp16: ~1e-4 where the float32 build is at ~1e-7.
      const int64_t group = c.n_heads / c.n_kv_heads;
      const bool mma = tensor_cores && (c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128) && group <= 16;
      auto workspace = cuda::DeviceBuffer::allocate(cuda::decode_attention_workspace_floats(shape) * 4);
      auto counters = cuda::DeviceBuffer::allocate(c.n_kv_heads * 4);
      auto out = cuda::DeviceBuffer::allocate(q.size() * 4);
      ASSERT_TRUE(workspace.ok() && counters.ok() && out.ok());
      ASSERT_TRUE(workspace->fill_bytes(0xFF).ok() && counters->fill_bytes(0).ok());
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {  // twice: the counters are left at zero, the result is reproducible
        ASSERT_TRUE(out->fill_bytes(0xFF).ok());
        Status st = cuda::decode_attention_rope(q_dev.as<float>(), k_dev.as<float>(), v_dev.as<float>(), f_dev.as<float>(),
                                                pos_dev.as<int32_t>(), keys_dev.as<uint16_t>(), values_dev.as<uint16_t>(),
                                                shape, workspace->as<float>(), counters->as<uint32_t>(), out->as<float>(),
                                                nullptr, overlap);
        ASSERT_TRUE(st.ok()) << st.to_string();
        const std::vector<float> got = download_floats(*out, q.size());
        if (run == 0) first = got;
        else EXPECT_EQ(got, first) << "not reproducible";
      }
      std::vector<uint32_t> counts(c.n_kv_heads);
      ASSERT_TRUE(counters->download(counts.data(), counts.size() * 4).ok());
      EXPECT_EQ(counts, std::vector<uint32_t>(c.n_kv_heads, 0u));
      // The caches: row `position` holds this token's rotated key and value in fp16, the others are unchanged.
      std::vector<uint16_t> key_rows(c.context * kv_dim), value_rows(c.context * kv_dim);
      ASSERT_TRUE(keys_dev.download(key_rows.data(), key_rows.size() * 2).ok());
      ASSERT_TRUE(values_dev.download(value_rows.data(), value_rows.size() * 2).ok());
      for (int64_t r = 0; r < c.context; ++r) {
        for (int64_t i = 0; i < kv_dim; ++i) {
          const int64_t at = r * kv_dim + i;
          uint16_t stored_key, stored_value;
          std::memcpy(&stored_key, keys.bytes.data() + 2 * at, 2);
          std::memcpy(&stored_value, values.bytes.data() + 2 * at, 2);
          if (r != c.position) {
            ASSERT_EQ(key_rows[at], stored_key) << "row " << r;
            ASSERT_EQ(value_rows[at], stored_value) << "row " << r;
            continue;
          }
          EXPECT_EQ(value_rows[at], f32_to_f16(v[i]));
          // As rope_store_kv: the CPU's FMA contraction can move the fp16 rounding of a key by one step.
          EXPECT_LE(std::abs(int(key_rows[at]) - int(f32_to_f16(want_k[i]))), 1) << "key " << i;
          keys.widened[at] = f16_to_f32(key_rows[at]);
          values.widened[at] = f16_to_f32(value_rows[at]);
        }
      }
      std::vector<float> want(q.size());
      ref::attention(want_q.data(), keys.widened.data(), values.widened.data(), 1, c.position, c.n_heads, c.n_kv_heads,
                     c.head_dim, want.data());
      const double error = relative_l2(first, want);
      EXPECT_LE(error, mma ? 1e-3 : 1e-5);
      if (mode == 0) tensor_core_result = first;
      if (mode >= 4) {
        EXPECT_EQ(first, tensor_core_result) << "the warm pass changes no bit of the tensor-core build's result";
      }
      (mma ? worst_mma : worst) = std::max(mma ? worst_mma : worst, error);
    }
  }
  EXPECT_FALSE(cuda::decode_attention_rope(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                           cuda::DecodeAttentionShape{8, 2, 15, 8, 0}, nullptr, nullptr, nullptr).ok());
  std::printf("[ cuda attention + rope ] worst relative L2 %.3g (float32), %.3g (tensor cores)\n", worst, worst_mma);
}

// cuda::top_k_logits against a full sort on the host (value descending, id ascending among equals): random
// logits of Llama 3's vocabulary, short and awkward lengths (fewer 64-value blocks than k), ties (values on a
// coarse grid, zeros of both signs), infinities; NaNs and ties past the kernel's candidate limit answer
// "count 0" (the caller then reads every logit), never a wrong list.
TEST(KernelsCuda, TopKLogitsMatchAFullSort) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  std::mt19937 rng(61);
  auto result = cuda::DeviceBuffer::allocate(sizeof(cuda::TopKResult));
  auto workspace = cuda::DeviceBuffer::allocate(cuda::kTopKWorkspaceBytes);
  ASSERT_TRUE(result.ok() && workspace.ok());
  auto* out = static_cast<cuda::TopKResult*>(result->data());
  void* scratch = workspace->data();
  bool overlap = false;  // alternated: the same answers with programmatic dependent launch
  auto run = [&](const std::vector<float>& v, int k) {
    auto dev = to_device(v.data(), v.size() * 4);
    cuda::TopKResult got{};
    EXPECT_TRUE(result->fill_bytes(0xAB).ok());
    const Status st = cuda::top_k_logits(dev.as<float>(), static_cast<int64_t>(v.size()), k, out, scratch, nullptr, overlap);
    overlap = !overlap;
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(cuda::synchronize().ok());
    EXPECT_TRUE(result->download(&got, sizeof got).ok());
    return got;
  };
  auto expect_sorted_top = [&](const std::vector<float>& v, int k, const cuda::TopKResult& got) {
    std::vector<int32_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    ASSERT_EQ(got.count, k);
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(got.ids[i], order[i]) << "rank " << i;
      EXPECT_EQ(got.values[i], v[order[i]]) << "rank " << i;  // -0.0 may come back as +0.0: equal
    }
  };
  int checked = 0;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{65}, int64_t{100}, int64_t{4097}, int64_t{128256},
                    cuda::kMaxDeviceTopKValues}) {
    for (int k : {1, 2, 40, 64}) {
      if (k > n) continue;
      SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k));
      std::normal_distribution<float> normal(0.0f, 3.0f);
      std::vector<float> v(n);
      for (float& x : v) x = normal(rng);
      expect_sorted_top(v, k, run(v, k));
      for (float& x : v) x = 0.5f * std::round(2.0f * normal(rng));  // coarse grid: ties everywhere
      for (int i = 0; i < 5; ++i) v[rng() % n] = -0.0f;
      if (n > 10) {
        v[rng() % n] = -INFINITY;
        v[rng() % n] = 12.5f;
        v[rng() % n] = 12.5f;  // a tie at the top (or the same slot twice)
      }
      const cuda::TopKResult got = run(v, k);
      if (got.count != 0) expect_sorted_top(v, k, got);  // 0: more ties at the threshold than it collects
      checked += 2;
    }
  }
  // A NaN, and more values tied at the threshold than the kernel collects: count 0.
  std::vector<float> v(128256, 1.0f);
  EXPECT_EQ(run(v, 40).count, 0) << "128,256 values tied at the threshold";
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000);
  v[77] = std::nanf("");
  EXPECT_EQ(run(v, 1).count, 0) << "NaN";
  // Refusals.
  auto dev = to_device(v.data(), 64 * 4);
  EXPECT_FALSE(cuda::top_k_logits(dev.as<float>(), 64, 0, out, scratch).ok());
  EXPECT_FALSE(cuda::top_k_logits(dev.as<float>(), 64, cuda::kMaxDeviceTopK + 1, out, scratch).ok());
  EXPECT_FALSE(cuda::top_k_logits(dev.as<float>(), 10, 20, out, scratch).ok());
  EXPECT_FALSE(cuda::top_k_logits(dev.as<float>(), cuda::kMaxDeviceTopKValues + 1, 1, out, scratch).ok());
  EXPECT_FALSE(cuda::top_k_logits(nullptr, 64, 1, out, scratch).ok());
  EXPECT_FALSE(cuda::top_k_logits(dev.as<float>(), 64, 1, out, nullptr).ok());
  std::printf("[ cuda top_k ] %d lists equal to a full sort's\n", checked);
}

}  // namespace
}  // namespace petrel

#endif  // PETREL_HAVE_CUDA
