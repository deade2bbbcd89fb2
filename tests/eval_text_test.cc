// petrel eval ppl / kld: llama-perplexity's protocol on tiny-llama31, against llama.cpp's own figures for the
// float model (DESIGN.md: llama-perplexity -c 256 -b 256 on the last 10% of wiki.test.raw gives PPL 117.14 over
// 19,431 scored tokens with F32 weights).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "petrel/kernels/cuda/device.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::cli;
using testing::data_dir;
using testing::run_command;

TEST(EvalText, PerplexityMatchesLlamaCppOnTheFloatModel) {
  testing::TempDir dir("eval_ppl");
  const auto r = run_command(cli() + " eval ppl -q -t 2 --model " + (data_dir() / "models/tiny-llama31").string() + " -o " +
                             (dir / "ppl.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"((\d+) scored positions: PPL = ([0-9.]+) \+/- ([0-9.]+))"))) << r.output;
  EXPECT_EQ(std::stoll(m[1]), 19431);
  EXPECT_NEAR(std::stod(m[2]), 117.14, 0.01);  // llama.cpp F32: 117.14
  EXPECT_GT(std::stod(m[3]), 0.1);
  EXPECT_LT(std::stod(m[3]), 5.0);
  const auto report = nlohmann::json::parse(std::ifstream(dir / "ppl.json"));
  EXPECT_EQ(report["positions"], 19431);
  EXPECT_EQ(report["path"], "prompt processor");
}

TEST(EvalText, KlOfAModelAgainstItselfIsZeroAndBadFlagsAreRefused) {
  const std::string tiny = (data_dir() / "models/tiny-llama31").string();
  const auto r = run_command(cli() + " eval kld -q -t 2 --max-windows 3 --kv-type f32 --path token --model " + tiny + " --reference " + tiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"((\d+) scored positions: KL mean ([0-9.e-]+) .* top-1 ([0-9.]+)%)"))) << r.output;
  EXPECT_EQ(std::stoll(m[1]), 3 * 127);
  EXPECT_LT(std::stod(m[2]), 1e-6);
  EXPECT_EQ(std::stod(m[3]), 100.0);
  EXPECT_EQ(run_command(cli() + " eval ppl --model " + tiny + " --window 3").exit_code, 2);
  EXPECT_EQ(run_command(cli() + " eval ppl --model " + tiny + " --path sideways").exit_code, 2);
  const auto missing = run_command(cli() + " eval ppl --model " + tiny + " --text /nonexistent.txt");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("/nonexistent.txt"), std::string::npos) << missing.output;
}

// The same protocol on the GPU (skipped without one): the float model's perplexity through the CUDA prompt
// processor and token generator agrees with the CPU's to fp16 rounding.
TEST(EvalText, PerplexityOnTheGpuAgreesWithTheCpu) {
  auto devices = cuda::list_devices();
  if (!devices.ok() || devices->empty()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  const std::string tiny = (data_dir() / "models/tiny-llama31").string();
  auto ppl = [&](const std::string& extra) {
    const auto r = run_command(cli() + " eval ppl -q --max-windows 20 --model " + tiny + " " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.output, m, std::regex(R"(PPL = ([0-9.]+))"))) << r.output;
    return m.size() > 1 ? std::stod(m[1]) : 0.0;
  };
  const double cpu = ppl("--backend cpu --kv-type f32");
  EXPECT_NEAR(ppl("--backend cuda"), cpu, cpu * 2e-3);
  EXPECT_NEAR(ppl("--backend cuda --path token"), cpu, cpu * 2e-3);
  const auto kld = run_command(cli() + " eval kld -q --max-windows 5 --backend cuda --model " + tiny + " --reference " + tiny);
  ASSERT_EQ(kld.exit_code, 0) << kld.output;
  EXPECT_NE(kld.output.find("top-1 100.00%"), std::string::npos) << kld.output;
}

}  // namespace
}  // namespace petrel
