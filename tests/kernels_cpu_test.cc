// kernels/cpu against kernels/ref, on every Highway target this CPU supports, with random and awkward shapes.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <bit>
#include <cmath>
#include <numeric>
#include <random>

#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/kernels/cpu/ops.h"
#include "petrel/model/kv_cache.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::random_floats;
using testing::relative_l2;

// Both kernels (VNNI and int16 pairs) multiply int16 activation codes: per row and block of gcd(group, 128)
// columns, q = round_half_even(x / s), s = max|x| / 32639. Against the reference fed those same activations
// (s * q) only the float summation order differs; against the float activations the codes' rounding adds up to
// half a step per input, which a 40x outlier in a block makes ~1e-4 of the output's scale.
constexpr double kTolerance = 1e-5;
constexpr double kToleranceFloatInput = 3e-4;

// x with each block of `block` columns of each row replaced by s * q as above (an independent restatement of the
// kernels' documented rounding, not their code).
std::vector<float> through_int16_codes(const std::vector<float>& x, int64_t cols, int64_t block) {
  std::vector<float> out(x.size());
  for (size_t b0 = 0; b0 < x.size(); b0 += static_cast<size_t>(block)) {
    float amax = 0;
    for (size_t c = b0; c < b0 + static_cast<size_t>(block); ++c) amax = std::max(amax, std::fabs(x[c]));
    const float s = amax > 0 ? amax / 32639.0f : 1.0f;
    for (size_t c = b0; c < b0 + static_cast<size_t>(block); ++c) out[c] = s * std::nearbyint(x[c] * (1.0f / s));
  }
  return out;
}

struct Shape { int64_t rows, cols, group; bool sym; int bits; };

// Random and awkward shapes: channel counts that are not multiples of the 16-lane vector, the 64-channel GEMV
// step or the 128-channel GEMM panel; groups smaller than, equal to and larger than the 128-column activation
// block; 8-bit (the LM head's format); enough 128-column blocks for the GEMV to split the input between threads
// (rows a multiple of 16, >= 2 blocks per thread).
const Shape kShapes[] = {{64, 256, -1, true, 4},  {72, 128, 64, false, 4}, {8, 8, -1, true, 4},
                         {200, 1024, 128, true, 4}, {24, 64, 32, false, 4}, {136, 512, -1, false, 4},
                         {272, 768, 256, false, 4}, {152, 384, 384, true, 4}, {4, 4, -1, true, 8},
                         {52, 256, -1, true, 8},    {36, 128, 64, false, 8}, {200, 640, 128, false, 8},
                         {64, 1024, -1, true, 4},   {48, 512, 64, false, 8}, {1024, 2048, 128, false, 4}};

quant::GptqTensors make_matrix(const Shape& s, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(s.rows * s.cols);
  for (float& v : w) v = 0.05f * normal(rng);
  quant::QuantScheme scheme{s.bits, s.group, s.sym, false};
  auto packed = quant::pack_gptq(quant::quantize_rtn(w.data(), s.rows, s.cols, scheme));
  EXPECT_TRUE(packed.ok()) << packed.status().to_string();
  return std::move(*packed);
}

TEST(KernelsCpu, GptqMatmulMatchesReferenceOnEveryTarget) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Shape& s : kShapes) {
      const quant::GptqTensors packed = make_matrix(s, rng);
      const ref::GptqMatrix m = packed.view();
      ASSERT_TRUE(cpu::gptq_matmul_supports(m));
      for (int64_t n_rows : {1, 2, 7, 13}) {  // the GEMV, and GEMM tiles with and without padding rows
        std::vector<float> x(n_rows * s.cols);
        for (float& v : x) v = normal(rng);
        x[0] = 40.0f;  // an outlier, as real activations have
        std::vector<float> want(n_rows * s.rows), want_float(n_rows * s.rows), got(n_rows * s.rows, -1.0f);
        const std::vector<float> x_codes = through_int16_codes(x, s.cols, std::gcd<int64_t>(m.group_size, 128));
        ref::matmul(x_codes.data(), n_rows, m, want.data());
        ref::matmul(x.data(), n_rows, m, want_float.data());
        cpu::gptq_matmul(x.data(), n_rows, m, got.data());
        EXPECT_LE(relative_l2(got, want), kTolerance)
            << hwy::TargetName(target) << " (" << cpu::gptq_matmul_variant() << ") bits " << s.bits << " rows "
            << s.rows << " cols " << s.cols << " group " << s.group << " n_rows " << n_rows;
        EXPECT_LE(relative_l2(got, want_float), kToleranceFloatInput) << hwy::TargetName(target) << " float input";
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The prompt processor (GEMM) and the token generator (GEMV) must agree far more tightly than either agrees
// with the float reference: they see the same int16 codes and differ only in float summation order.
TEST(KernelsCpu, GemmRowsEqualGemvPerRow) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& s : kShapes) {
    const quant::GptqTensors packed = make_matrix(s, rng);
    const ref::GptqMatrix m = packed.view();
    const int64_t n_rows = 9;
    std::vector<float> x(n_rows * s.cols);
    for (float& v : x) v = normal(rng);
    std::vector<float> gemm(n_rows * s.rows), gemv(n_rows * s.rows);
    cpu::gptq_matmul(x.data(), n_rows, m, gemm.data());
    for (int64_t r = 0; r < n_rows; ++r) cpu::gptq_matmul(x.data() + r * s.cols, 1, m, gemv.data() + r * s.rows);
    EXPECT_LE(relative_l2(gemm, gemv), 1e-6) << "rows " << s.rows << " cols " << s.cols << " group " << s.group;
  }
}

// q/k/v and gate/up in one call give exactly what separate calls give (same kernel, same block split).
TEST(KernelsCpu, SharedInputMatmulEqualsSeparateCalls) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Shape shapes[] = {{256, 1024, -1, true, 4}, {64, 1024, -1, true, 4}, {72, 1024, -1, false, 4}};
  std::vector<quant::GptqTensors> packed;
  for (const Shape& s : shapes) packed.push_back(make_matrix(s, rng));
  std::vector<ref::GptqMatrix> views;
  for (const auto& p : packed) views.push_back(p.view());
  for (int64_t n_rows : {1, 5}) {
    std::vector<float> x(n_rows * 1024);
    for (float& v : x) v = normal(rng);
    std::vector<std::vector<float>> fused, separate;
    for (const auto& v : views) fused.emplace_back(n_rows * v.rows), separate.emplace_back(n_rows * v.rows);
    const ref::GptqMatrix* ws[] = {&views[0], &views[1], &views[2]};  // the third (72 rows) cannot split: fallback
    float* ys[] = {fused[0].data(), fused[1].data(), fused[2].data()};
    cpu::gptq_matmul_shared_input(x.data(), n_rows, ws, ys);
    for (size_t m = 0; m < views.size(); ++m) cpu::gptq_matmul(x.data(), n_rows, views[m], separate[m].data());
    for (size_t m = 0; m < views.size(); ++m) EXPECT_EQ(fused[m], separate[m]) << "matrix " << m << " rows " << n_rows;
    const ref::GptqMatrix* two[] = {&views[0], &views[1]};  // both split: one dispatch
    float* ys2[] = {fused[0].data(), fused[1].data()};
    cpu::gptq_matmul_shared_input(x.data(), n_rows, two, ys2);
    EXPECT_EQ(fused[0], separate[0]);
    EXPECT_EQ(fused[1], separate[1]);
  }
}

// qweight with padded word rows (CPU bundles, GptqMatrix::stride()): the same products, bit for bit, as the
// dense matrix, on every target, for the GEMV and the GEMM; the padding holds garbage that must not be read.
TEST(KernelsCpu, GptqMatmulReadsPaddedWordRows) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Shape& s : {Shape{64, 256, -1, true, 4}, Shape{72, 128, 64, false, 4}, Shape{200, 640, 128, false, 8},
                           Shape{512, 1024, -1, false, 4}}) {
      const quant::GptqTensors packed = make_matrix(s, rng);
      const ref::GptqMatrix dense = packed.view();
      const int64_t words = s.cols * s.bits / 32;
      for (int64_t stride : {s.rows + 3, s.rows + 16, cpu::preferred_word_row_stride(s.rows)}) {
        std::vector<int32_t> padded(words * stride);
        for (int32_t& v : padded) v = static_cast<int32_t>(rng());
        for (int64_t k = 0; k < words; ++k) {
          std::copy_n(dense.qweight + k * s.rows, s.rows, padded.begin() + k * stride);
        }
        ref::GptqMatrix m = dense;
        m.qweight = padded.data();
        m.word_row_stride = stride;
        ASSERT_TRUE(cpu::gptq_matmul_supports(m));
        for (int64_t n_rows : {1, 6}) {
          std::vector<float> x(n_rows * s.cols);
          for (float& v : x) v = normal(rng);
          std::vector<float> want(n_rows * s.rows), got(n_rows * s.rows, -1.0f), ref_dense(n_rows * s.rows),
              ref_padded(n_rows * s.rows);
          cpu::gptq_matmul(x.data(), n_rows, dense, want.data());
          cpu::gptq_matmul(x.data(), n_rows, m, got.data());
          EXPECT_EQ(got, want) << hwy::TargetName(target) << " rows " << s.rows << " stride " << stride << " n_rows "
                               << n_rows;
          ref::matmul(x.data(), n_rows, dense, ref_dense.data());
          ref::matmul(x.data(), n_rows, m, ref_padded.data());
          EXPECT_EQ(ref_padded, ref_dense) << "ref, stride " << stride;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The export's padding rule: Llama's output sizes (4 KiB multiples) get 64 words, sizes that already spread
// their 16 streams over the page get none, small matrices are not padded by more than rows / 8.
TEST(KernelsCpu, PreferredWordRowStride) {
  EXPECT_EQ(cpu::preferred_word_row_stride(4096), 4160);
  EXPECT_EQ(cpu::preferred_word_row_stride(14336), 14400);
  EXPECT_EQ(cpu::preferred_word_row_stride(1024), 1088);
  EXPECT_EQ(cpu::preferred_word_row_stride(512), 576);
  EXPECT_EQ(cpu::preferred_word_row_stride(128256), 128320);  // the head: 1 KiB steps put 4 streams per set
  EXPECT_EQ(cpu::preferred_word_row_stride(4160), 4160);
  EXPECT_EQ(cpu::preferred_word_row_stride(2752), 2752);
  EXPECT_EQ(cpu::preferred_word_row_stride(256), 256);  // would need more than 32 words of padding
  EXPECT_EQ(cpu::preferred_word_row_stride(64), 64);
  for (int64_t rows = 1; rows < 20000; rows += 37) {
    const int64_t stride = cpu::preferred_word_row_stride(rows);
    EXPECT_GE(stride, rows);
    EXPECT_LE(stride - rows, rows / 8);
    EXPECT_TRUE(stride == rows || stride % 16 == 0) << rows;
  }
}

TEST(KernelsCpu, GptqMatmulRefusesWhatItDoesNotHandle) {
  ref::GptqMatrix m;
  m.bits = 2;
  m.rows = 16;
  m.cols = 64;
  m.group_size = 64;
  EXPECT_FALSE(cpu::gptq_matmul_supports(m));
  m.bits = 4;
  EXPECT_TRUE(cpu::gptq_matmul_supports(m));
  int32_t g_idx[64] = {};
  m.g_idx = g_idx;
  EXPECT_FALSE(cpu::gptq_matmul_supports(m));
}

// Attention over a cache of each type against ref::attention fed the values the cache holds (its rounding
// applied), for prefill chunks and single tokens, grouped and plain heads, head sizes 128, 40 and 20 (tails).
TEST(KernelsCpu, AttentionMatchesReferenceForEveryKvType) {
  std::mt19937 rng(3);
  struct Case { int64_t n_heads, n_kv_heads, head_dim, first_pos, n_rows; };
  const Case cases[] = {{8, 2, 128, 0, 9}, {8, 2, 128, 37, 1}, {4, 1, 40, 5, 6}, {6, 6, 20, 0, 3}, {32, 8, 128, 100, 1}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8}) {
      for (const Case& c : cases) {
        const int64_t positions = c.first_pos + c.n_rows, kv_dim = c.n_kv_heads * c.head_dim;
        KvCache cache(positions, 1, c.n_kv_heads, c.head_dim, type);
        const cpu::KvLayer kv = cache.layer(0);
        const auto keys = random_floats(rng, positions * kv_dim, 2.0f), values = random_floats(rng, positions * kv_dim);
        cpu::kv_store(kv, 0, positions, keys.data(), values.data());
        // What the cache holds, as float, for the reference.
        std::vector<float> k_held(keys.size()), v_held(values.size());
        for (int64_t p = 0; p < positions; ++p) {
          for (int64_t h = 0; h < c.n_kv_heads; ++h) {
            cpu::kv_load(kv, p, h, false, k_held.data() + (p * c.n_kv_heads + h) * c.head_dim);
            cpu::kv_load(kv, p, h, true, v_held.data() + (p * c.n_kv_heads + h) * c.head_dim);
          }
        }
        // The rounding itself is bounded: f16 to an ulp (2^-10 relative; Highway 1.0.3 truncates on targets without F16C), q8 to half a step (max / 254).
        for (size_t i = 0; i < keys.size(); ++i) {
          const double err = std::fabs(double(k_held[i]) - keys[i]);
          const double bound = type == KvType::kF32 ? 0.0 : type == KvType::kF16 ? std::fabs(keys[i]) * 0x1p-10 + 0x1p-24 : 20.0 / 254;
          ASSERT_LE(err, bound) << hwy::TargetName(target) << " " << cpu::kv_type_name(type) << " element " << i << " = " << keys[i];
        }
        const auto q = random_floats(rng, c.n_rows * c.n_heads * c.head_dim);
        std::vector<float> want(q.size()), got(q.size(), -1.0f);
        ref::attention(q.data(), k_held.data(), v_held.data(), c.n_rows, c.first_pos, c.n_heads, c.n_kv_heads,
                       c.head_dim, want.data());
        cpu::attention(q.data(), kv, c.n_rows, c.first_pos, c.n_heads, got.data());
        EXPECT_LE(relative_l2(got, want), 1e-5) << hwy::TargetName(target) << " " << cpu::kv_type_name(type)
                                                << " heads " << c.n_heads << "/" << c.n_kv_heads << " dim " << c.head_dim;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// RMSNorm (bf16 weight), RoPE, SiLU-multiply and the residual add against kernels/ref, sizes with tails.
TEST(KernelsCpu, ElementwiseOpsMatchReference) {
  std::mt19937 rng(5);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (int64_t dim : {8, 40, 131, 4096}) {
      const int64_t rows = 3;
      const auto x = random_floats(rng, rows * dim, 3.0f), y = random_floats(rng, rows * dim);
      std::vector<uint16_t> w_bf16(dim);
      for (int64_t i = 0; i < dim; ++i) w_bf16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(1.0f + 0.01f * i) >> 16);
      const ref::DenseMatrix weight{DType::kBF16, 1, dim, w_bf16.data()};
      std::vector<float> want(rows * dim), got(rows * dim);
      ref::rms_norm(x.data(), rows, dim, weight, 1e-5f, want.data());
      cpu::rms_norm(x.data(), rows, dim, weight, 1e-5f, got.data());
      EXPECT_LE(relative_l2(got, want), 1e-6) << "rms_norm " << dim << " " << hwy::TargetName(target);

      ref::silu_mul(x.data(), y.data(), rows * dim, want.data());
      cpu::silu_mul(x.data(), y.data(), rows * dim, got.data());
      EXPECT_LE(relative_l2(got, want), 1e-6) << "silu_mul " << dim << " " << hwy::TargetName(target);

      want = x;
      got = x;
      ref::add_in_place(want.data(), y.data(), rows * dim);
      cpu::add_in_place(got.data(), y.data(), rows * dim);
      EXPECT_EQ(got, want) << "add " << dim;

      if (dim % 2 == 0) {  // RoPE: dim = head_dim, two heads per row
        const int64_t heads = 2, half = dim / 2;
        auto qr = random_floats(rng, rows * heads * dim);
        const auto angles = random_floats(rng, rows * half, 3.0f);
        std::vector<float> cos(rows * half), sin(rows * half);
        for (size_t i = 0; i < angles.size(); ++i) cos[i] = std::cos(angles[i]), sin[i] = std::sin(angles[i]);
        std::vector<float> a = qr, b = qr;
        ref::apply_rope(a.data(), rows, heads, dim, cos.data(), sin.data());
        cpu::apply_rope(b.data(), rows, heads, dim, cos.data(), sin.data());
        EXPECT_LE(relative_l2(b, a), 1e-6) << "rope " << dim << " " << hwy::TargetName(target);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace petrel
