// petrel eval ppl / kld: llama-perplexity's protocol on tiny-llama31, against llama.cpp's own figures for the
// float model (DESIGN.md: llama-perplexity -c 256 -b 256 on the last 10% of wiki.test.raw gives PPL 117.14 over
// 19,431 scored tokens with F32 weights).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace petrel
