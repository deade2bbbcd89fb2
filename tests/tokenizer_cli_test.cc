// petrel tokenize / detokenize, run as a user would.
#include <gtest/gtest.h>

#include "test_util.h"

namespace petrel {
namespace {

using testing::cli_path;
using testing::data_dir;
using testing::run_command;

std::string llama31() { return (data_dir() / "tokenizers" / "llama-3.1").string(); }

TEST(TokenizerCliTest, TokenizePrintsIdsOnOneLine) {
  auto result = run_command(cli_path().string() + " tokenize --tokenizer " + llama31() + " --text 'Hello world'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "9906 1917\n");
  result = run_command(cli_path().string() + " tokenize --tokenizer " + llama31() +
                       " --text 'Hello<|eot_id|>' --add-special");
  EXPECT_EQ(result.output, "128000 9906 128009\n");
  result = run_command(cli_path().string() + " tokenize --tokenizer " + llama31() +
                       " --text '<|eot_id|>' --no-parse-special");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.output.find("128009"), std::string::npos) << result.output;
  result = run_command(cli_path().string() + " tokenize --tokenizer " + llama31() + " --text ''");
  EXPECT_EQ(result.output, "\n");
}

TEST(TokenizerCliTest, TokenizeFileAndDetokenizeRoundTrip) {
  testing::TempDir dir("tokenizer_cli");
  const std::string text = "Café 🦙 ok\n  second line\n";
  ASSERT_TRUE(write_file_atomic(dir / "in.txt", text).ok());
  auto ids = run_command(cli_path().string() + " tokenize --tokenizer " + llama31() + " --file " +
                         (dir / "in.txt").string());
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  std::string id_list = ids.output.substr(0, ids.output.size() - 1);
  auto back = run_command(cli_path().string() + " detokenize --tokenizer " + llama31() + " --ids '" + id_list + "'");
  EXPECT_EQ(back.exit_code, 0);
  EXPECT_EQ(back.output, text);
  // Commas work as separators too.
  back = run_command(cli_path().string() + " detokenize --tokenizer " + llama31() + " --ids '9906, 1917,128009'");
  EXPECT_EQ(back.output, "Hello world<|eot_id|>");
  back = run_command(cli_path().string() + " detokenize --tokenizer " + llama31() +
                     " --ids '128000 9906 128009' --skip-special");
  EXPECT_EQ(back.output, "Hello");
}

TEST(TokenizerCliTest, ErrorsAreReported) {
  // The small tiny-llama31 vocabulary loads fastest; these cases do not depend on the ids.
  const std::string tiny = (data_dir() / "models" / "tiny-llama31").string();
  auto result = run_command(cli_path().string() + " tokenize --tokenizer /no/such/dir --text hi");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("petrel tokenize: error:"), std::string::npos) << result.output;
  result = run_command(cli_path().string() + " tokenize --tokenizer " + tiny);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("--text or --file"), std::string::npos) << result.output;
  testing::TempDir dir("tokenizer_cli_errors");
  ASSERT_TRUE(write_file_atomic(dir / "bad.txt", "bad \xFF byte").ok());
  result = run_command(cli_path().string() + " tokenize --tokenizer " + tiny + " --file " + (dir / "bad.txt").string());
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("offset 4"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("bad.txt"), std::string::npos) << result.output;
  result = run_command(cli_path().string() + " detokenize --tokenizer " + tiny + " --ids '1 two 3'");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("two"), std::string::npos) << result.output;
  result = run_command(cli_path().string() + " detokenize --tokenizer " + tiny + " --ids '999999'");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("999999"), std::string::npos) << result.output;
}

TEST(TokenizerCliTest, BenchReportsThroughput) {
  auto result = run_command(cli_path().string() + " tokenize --tokenizer " +
                            (data_dir() / "models" / "tiny-llama31").string() + " --text 'a short text to time' --bench 3");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("median_MB/s="), std::string::npos) << result.output;
}

}  // namespace
}  // namespace petrel
