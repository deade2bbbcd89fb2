// kernels/cpu against kernels/ref, on every Highway target this CPU supports, with random and awkward shapes.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <random>

#include "petrel/kernels/cpu/gemv_w4.h"
#include "petrel/quant/format.h"
#include "petrel/quant/gptq.h"

namespace petrel {
namespace {

// Relative L2 error the SIMD GEMV may differ from the reference by: float32 sums in another order.
constexpr double kTolerance = 1e-5;

TEST(KernelsCpu, GemvW4MatchesReferenceOnEveryTarget) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape { int64_t rows, cols, group; bool sym; int bits; };
  const Shape shapes[] = {{64, 256, -1, true, 4}, {72, 128, 64, false, 4}, {8, 8, -1, true, 4},
                          {200, 1024, 128, true, 4}, {24, 64, 32, false, 4}, {136, 512, -1, false, 4},
                          {4, 4, -1, true, 8},     {52, 256, -1, true, 8},  {36, 128, 64, false, 8}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Shape& s : shapes) {
      std::vector<float> w(s.rows * s.cols), x(s.cols);
      for (float& v : w) v = 0.05f * normal(rng);
      for (float& v : x) v = normal(rng);
      quant::QuantScheme scheme{s.bits, s.group, s.sym, false};
      auto packed = quant::pack_gptq(quant::quantize_rtn(w.data(), s.rows, s.cols, scheme));
      ASSERT_TRUE(packed.ok()) << packed.status().to_string();
      const ref::GptqMatrix m = packed->view();
      ASSERT_TRUE(cpu::gemv_w4_gptq_supports(m));
      std::vector<float> want(s.rows), got(s.rows, -1.0f);
      ref::matmul(x.data(), 1, m, want.data());
      cpu::gemv_w4_gptq(x.data(), m, got.data());
      double diff = 0, norm = 0;
      for (int64_t o = 0; o < s.rows; ++o) {
        diff += (got[o] - want[o]) * double(got[o] - want[o]);
        norm += double(want[o]) * want[o];
      }
      EXPECT_LE(std::sqrt(diff / norm), kTolerance)
          << hwy::TargetName(target) << " bits " << s.bits << " rows " << s.rows << " cols " << s.cols << " group " << s.group;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(KernelsCpu, GemvW4RefusesWhatItDoesNotHandle) {
  ref::GptqMatrix m;
  m.bits = 2;
  m.cols = 64;
  m.group_size = 64;
  EXPECT_FALSE(cpu::gemv_w4_gptq_supports(m));
  m.bits = 4;
  EXPECT_TRUE(cpu::gemv_w4_gptq_supports(m));
  int32_t g_idx[64] = {};
  m.g_idx = g_idx;
  EXPECT_FALSE(cpu::gemv_w4_gptq_supports(m));
}

}  // namespace
}  // namespace petrel
