// `petrel run`: genie-t2t-run's output contract, Genie's profile JSON, and its errors.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace petrel {
namespace {

using testing::data_dir;
using testing::run_command;
using testing::TempDir;
namespace fs = std::filesystem;

using testing::cli;

class Run : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("run");
    const std::string tiny = (data_dir() / "models/tiny-llama31").string();
    auto r = run_command(cli() + " quantize -q --method rtn --checkpoint " + tiny + " --out " + (*dir_ / "q").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (auto [name, context] : {std::pair{"bundle", "2048"}, {"small", "64"}}) {
      r = run_command(cli() + " export -q --force --checkpoint " + (*dir_ / "q").string() + " --out " +
                      (*dir_ / name).string() + " --context-length " + context);
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    // Greedy sampling, so that run and generate must agree token for token.
    auto config = nlohmann::ordered_json::parse(*read_text_file(*dir_ / "bundle/config.json"));
    config["dialog"]["sampler"]["greedy"] = true;
    ASSERT_TRUE(write_file_atomic(*dir_ / "bundle/config.json", config.dump(2)).ok());
    std::ofstream(*dir_ / "prompt_tokens.txt") << "4080 424 1413 276 289 311 3585 303";
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path path(const std::string& name) { return *dir_ / name; }
  static TempDir* dir_;
};
TempDir* Run::dir_ = nullptr;

TEST_F(Run, GreedyOutputEqualsTheReferencePathBetweenBeginAndEnd) {
  auto run = run_command(cli() + " run -c " + path("bundle/config.json").string() + " --tokens_file " +
                             path("prompt_tokens.txt").string() + " -n 24",
                         /*with_stderr=*/false);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto gen = run_command(cli() + " generate --greedy --model " + path("q").string() + " --tokens \"$(cat " +
                             path("prompt_tokens.txt").string() + ")\" -n 24",
                         /*with_stderr=*/false);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  ASSERT_FALSE(gen.output.empty());
  const std::string text = gen.output.substr(0, gen.output.size() - 1);  // generate ends with a newline
  EXPECT_EQ(run.output, "[BEGIN]: " + text + "[END]\n");
}

TEST_F(Run, ProfileHasGeniesEventsFieldsAndUnits) {
  const fs::path profile = path("profile.json");
  fs::remove(profile);
  auto r = run_command(cli() + " run -c " + path("bundle").string() + " -p '<|begin_of_text|>The history of' -n 16 --profile " +
                       profile.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(*read_text_file(profile));
  EXPECT_EQ(j["header"]["artifact_type"], "GENIE_PROFILE");
  ASSERT_EQ(j["components"].size(), 1u);
  const auto& events = j["components"][0]["events"];
  ASSERT_EQ(events.size(), 2u);
  const auto& create = events[0];
  EXPECT_EQ(create["type"], "GenieDialog_create");
  EXPECT_EQ(create["init-time"]["unit"], "us");
  EXPECT_GT(create["init-time"]["value"].get<double>(), 0);
  EXPECT_EQ(create["duration"].get<int64_t>(), create["stop"].get<int64_t>() - create["start"].get<int64_t>());
  const auto& q = events[1];
  EXPECT_EQ(q["type"], "GenieDialog_query");
  const std::pair<const char*, const char*> fields[] = {
      {"num-prompt-tokens", ""},        {"prompt-processing-rate", "toks/sec"}, {"time-to-first-token", "us"},
      {"num-generated-tokens", ""},     {"token-generation-rate", "toks/sec"},  {"token-generation-time", "us"}};
  for (auto [field, unit] : fields) {
    ASSERT_TRUE(q.contains(field)) << field;
    EXPECT_EQ(q[field]["unit"], unit) << field;
    EXPECT_TRUE(q[field]["value"].is_number()) << field;
  }
  EXPECT_EQ(q["num-prompt-tokens"]["value"], 4);  // <|begin_of_text|> The history of
  EXPECT_EQ(q["num-generated-tokens"]["value"], 16);
  const double ttft_s = q["time-to-first-token"]["value"].get<double>() / 1e6;
  const double gen_s = q["token-generation-time"]["value"].get<double>() / 1e6;
  EXPECT_NEAR(q["prompt-processing-rate"]["value"].get<double>(), 4 / ttft_s, 1e-6 * (4 / ttft_s));
  // Genie's quirk: the count includes the first token, the time does not.
  EXPECT_NEAR(q["token-generation-rate"]["value"].get<double>(), 16 / gen_s, 1e-6 * (16 / gen_s));
}

TEST_F(Run, RefusesAProfilePathThatExists) {
  const fs::path profile = path("existing.json");
  std::ofstream(profile) << "keep me";
  auto r = run_command(cli() + " run -c " + path("bundle").string() + " -p hi -n 2 --profile " + profile.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("already exists"), std::string::npos) << r.output;
  EXPECT_EQ(*read_text_file(profile), "keep me");
}

TEST_F(Run, PromptOverTheContextIsAClearError) {
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "424 ";
  std::ofstream(path("long.txt")) << long_prompt;
  auto r = run_command(cli() + " run -c " + path("small/config.json").string() + " --tokens_file " + path("long.txt").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("Context Size was exceeded"), std::string::npos) << r.output;
}

TEST_F(Run, CorruptedBundleIsAClearError) {
  const fs::path bundle = path("corrupt");
  fs::remove_all(bundle);
  fs::copy(path("small"), bundle);
  {
    std::fstream io(bundle / "part_2_of_5.bin", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(1000);
    io.put('\x77');
  }
  auto r = run_command(cli() + " run -c " + bundle.string() + " -p hi -n 2");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("part_2_of_5.bin"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksum"), std::string::npos) << r.output;
}

TEST_F(Run, ArgumentErrorsNameTheProblem) {
  auto r = run_command(cli() + " run -p hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--config"), std::string::npos) << r.output;
  r = run_command(cli() + " run -c " + path("bundle").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--prompt"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace petrel
