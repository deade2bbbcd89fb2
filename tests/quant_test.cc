// W4A16 formats, packing, RTN and GPTQ against direct computations.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "petrel/kernels/ref/ops.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"

namespace petrel::quant {
namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed, float scale = 0.05f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> w(rows * cols);
  for (float& v : w) v = normal(rng);
  return w;
}

// Calibration inputs with correlated features, so that GPTQ has structure to exploit.
std::vector<float> correlated_inputs(int64_t n, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> base(n * 8), x(n * dim);
  for (float& v : base) v = normal(rng);
  std::vector<float> mix(8 * dim);
  for (float& v : mix) v = normal(rng);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      float v = 0.3f * normal(rng);
      for (int k = 0; k < 8; ++k) v += base[t * 8 + k] * mix[k * dim + d];
      x[t * dim + d] = v;
    }
  return x;
}

TEST(QuantFormat, PackedGptqTensorsDequantizeLikeTheCodes) {
  for (QuantScheme scheme : {QuantScheme{4, -1, true}, QuantScheme{4, 64, false}, QuantScheme{8, -1, true},
                             QuantScheme{4, 32, true}}) {
    const int64_t rows = 48, cols = 128;
    auto w = random_matrix(rows, cols, 1);
    QuantizedMatrix q = quantize_rtn(w.data(), rows, cols, scheme);
    auto packed = pack_gptq(q);
    ASSERT_TRUE(packed.ok()) << packed.status().to_string();
    ref::GptqMatrix view = packed->view();
    EXPECT_EQ(static_cast<int64_t>(packed->qweight.size()), cols * scheme.bits / 32 * rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(view.at(r, c), q.dequantized(r, c)) << scheme.to_string();
  }
}

TEST(QuantFormat, GptqNibbleOrderIsInputMajorLowBitsFirst) {
  // One output row, 8 inputs with codes 0..7: word 0 of qweight must read 0x76543210.
  QuantizedMatrix q;
  q.scheme = QuantScheme{4, -1, true};
  q.rows = 8;
  q.cols = 8;
  q.group_size = 8;
  q.codes.assign(64, 0);
  for (int c = 0; c < 8; ++c) q.codes[c] = static_cast<uint8_t>(c);  // row 0
  q.scales.assign(8, f32_to_f16(1.0f));
  q.zeros.assign(8, 8);
  auto packed = pack_gptq(q);
  ASSERT_TRUE(packed.ok());
  EXPECT_EQ(static_cast<uint32_t>(packed->qweight[0]), 0x76543210u);
  // Zeros of 8 are stored as 7 (GPTQ v1), eight per word along the output dimension.
  EXPECT_EQ(static_cast<uint32_t>(packed->qzeros[0]), 0x77777777u);
}

TEST(QuantFormat, RtnErrorIsWithinHalfAStep) {
  QuantScheme scheme{4, 128, true, /*clip_search=*/false};
  const int64_t rows = 16, cols = 256;
  auto w = random_matrix(rows, cols, 2);
  QuantizedMatrix q = quantize_rtn(w.data(), rows, cols, scheme);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = f16_to_f32(q.scales[(c / 128) * rows + r]);
      // Half a step, plus the fp16 rounding of the scale at the clipped positive extreme (+7 steps of 7.5).
      EXPECT_LE(std::fabs(q.dequantized(r, c) - w[r * cols + c]), 0.51f * scale);
    }
}

TEST(QuantFormat, ClipSearchNeverIncreasesGroupError) {
  auto w = random_matrix(1, 4096, 3);
  w[17] = 0.9f;  // an outlier that min/max would fit
  for (bool sym : {true, false}) {
    QuantScheme plain{4, 64, sym, false}, searched{4, 64, sym, true};
    auto a = quantize_rtn(w.data(), 1, 4096, plain), b = quantize_rtn(w.data(), 1, 4096, searched);
    double ea = 0, eb = 0;
    for (int64_t c = 0; c < 4096; ++c) {
      ea += std::pow(a.dequantized(0, c) - w[c], 2.0);
      eb += std::pow(b.dequantized(0, c) - w[c], 2.0);
    }
    EXPECT_LE(eb, ea * (1 + 1e-6));
  }
}

TEST(Gptq, HessianAccumulatorMatchesDirectSum) {
  const int64_t n = 37, dim = 24;
  auto x = random_matrix(n, dim, 4, 1.0f);
  HessianAccumulator acc(dim);
  acc.add(x.data(), 20);
  acc.add(x.data() + 20 * dim, n - 20);
  auto h = acc.to_matrix();
  for (int64_t i = 0; i < dim; ++i)
    for (int64_t j = 0; j < dim; ++j) {
      double want = 0;
      for (int64_t t = 0; t < n; ++t) want += double(x[t * dim + i]) * x[t * dim + j];
      EXPECT_NEAR(h[i * dim + j], want, 1e-3 * (1 + std::fabs(want)));
    }
}

TEST(Gptq, BeatsRoundToNearestOnOutputError) {
  const int64_t rows = 64, cols = 256, n = 2048;
  auto w = random_matrix(rows, cols, 5);
  auto x = correlated_inputs(n, cols, 6);
  HessianAccumulator acc(cols);
  acc.add(x.data(), n);
  const auto h = acc.to_matrix();
  for (QuantScheme scheme : {QuantScheme{4, -1, true}, QuantScheme{4, 128, true}, QuantScheme{4, 64, false}}) {
    QuantizedMatrix rtn = quantize_rtn(w.data(), rows, cols, scheme);
    GptqReport report;
    auto gptq = quantize_gptq(w, rows, cols, h, scheme, {}, &report);
    ASSERT_TRUE(gptq.ok()) << gptq.status().to_string();
    const double e_rtn = output_error(w.data(), rtn, h), e_gptq = output_error(w.data(), *gptq, h);
    std::printf("[ gptq ] %-18s output error RTN %.4g, GPTQ %.4g (ratio %.2f)\n", scheme.to_string().c_str(), e_rtn,
                e_gptq, e_gptq / e_rtn);
    EXPECT_LT(e_gptq, 0.8 * e_rtn) << scheme.to_string();
  }
}

TEST(Gptq, HandlesDeadInputsAndRejectsBadShapes) {
  const int64_t rows = 16, cols = 64;
  auto w = random_matrix(rows, cols, 7);
  auto x = random_matrix(128, cols, 8, 1.0f);
  for (int64_t t = 0; t < 128; ++t) x[t * cols + 5] = 0.0f;  // input 5 never active
  HessianAccumulator acc(cols);
  acc.add(x.data(), 128);
  GptqReport report;
  auto q = quantize_gptq(w, rows, cols, acc.to_matrix(), QuantScheme{}, {}, &report);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(report.dead_columns, 1);
  auto bad = quantize_gptq(w, rows, cols + 1, acc.to_matrix(), QuantScheme{});
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  auto bad_group = quantize_gptq(w, rows, cols, acc.to_matrix(), QuantScheme{4, 48, true});
  EXPECT_FALSE(bad_group.ok());
}

}  // namespace
}  // namespace petrel::quant

#include "petrel/quant/calibration.h"
#include "test_util.h"

namespace petrel::quant {
namespace {

TEST(Calibration, TextFractionCutsByCharactersWithUniversalNewlines) {
  petrel::testing::TempDir dir("calib_text");
  // 10 characters, one of them two bytes (é), and a \r\n pair that reads as one \n.
  ASSERT_TRUE(write_file_atomic(dir / "t.txt", "ab\r\ncdé fgh").ok());
  auto head = read_text_fraction(dir / "t.txt", 0.5, true), tail = read_text_fraction(dir / "t.txt", 0.5, false);
  ASSERT_TRUE(head.ok() && tail.ok());
  EXPECT_EQ(*head, "ab\ncd");  // "ab\ncdé fgh" has 10 characters; int(10 * 0.5) = 5
  EXPECT_EQ(*tail, "é fgh");
  EXPECT_FALSE(read_text_fraction(dir / "t.txt", 0.0, true).ok());
}

TEST(Calibration, HeldOutTailMatchesTheLlamaCppProtocolTokenCount) {
  // DESIGN.md's llama.cpp table scores 19,431 tokens on the last 10% of wiki.test.raw with 256-token
  // windows: 153 windows of 127 scored tokens, i.e. 39,329 text tokens plus BOS.
  auto tokenizer = Tokenizer::load(petrel::testing::data_dir() / "models/tiny-llama31");
  ASSERT_TRUE(tokenizer.ok());
  auto tail = read_text_fraction(petrel::testing::data_dir() / "corpora/wiki.test.raw", 0.9, false);
  ASSERT_TRUE(tail.ok());
  auto ids = tokenizer->encode(*tail, EncodeOptions{.add_special = false, .parse_special = false, .untrusted_ranges = {}});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 39329u);
}

}  // namespace
}  // namespace petrel::quant
