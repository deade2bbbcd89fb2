// The CLI contracts later checks rely on, exercised through the real binary.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "petrel/io/npy.h"
#include "petrel/io/safetensors.h"
#include "petrel/model/llama.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::cli_path;
using testing::data_dir;
using testing::run_command;
using testing::TempDir;

using testing::cli;

TEST(Cli, LogitsMatchTransformersThroughBothPaths) {
  TempDir dir("cli_logits");
  const auto tokens = data_dir() / "parity/gqa_llama3.tokens.txt";
  auto expected = read_npy(data_dir() / "parity/gqa_llama3.logits.npy");
  ASSERT_TRUE(expected.ok());
  // f32 KV cache: the reference numerics; f16 (the default) adds the rounding of the cached keys and values.
  for (std::string extra : {" --kv-type f32", " --token-generator --kv-type f32", "", " --token-generator"}) {
    const auto out = dir / "logits.npy";
    auto r = run_command(cli() + " logits --model " + (data_dir() / "parity/gqa_llama3").string() +
                         " --tokens-file " + tokens.string() + " --out " + out.string() + extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto got = read_npy(out);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->shape, expected->shape);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < got->num_elements(); ++i) {
      const double d = got->f32()[i] - expected->f32()[i];
      diff += d * d;
      norm += double(expected->f32()[i]) * expected->f32()[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), extra.find("f32") != std::string::npos ? 1e-5 : 1e-3) << extra;
  }
}

TEST(Cli, GeneratePrintsIdsOnOneLine) {
  auto r = run_command(cli() + " generate --model " + (data_dir() / "models/aidreams260k").string() +
                       " --tokens 1 -n 128 --greedy --print-ids", /*with_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto expected = testing::read_ids(data_dir() / "models/aidreams260k/aidreams260K_greedy_n128.expected_ids.txt");
  std::string want;
  for (size_t i = 0; i < expected.size(); ++i) want += (i ? " " : "") + std::to_string(expected[i]);
  EXPECT_EQ(r.output, want + "\n");
  // --deterministic (the cuda backend's bitwise-reproducible decode) is accepted and changes nothing on the CPU.
  auto d = run_command(cli() + " generate --deterministic --model " + (data_dir() / "models/aidreams260k").string() +
                       " --tokens 1 -n 128 --greedy --print-ids", /*with_stderr=*/false);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_EQ(d.output, want + "\n");
}

TEST(Cli, ErrorsAreOneClearLineWithNonZeroExit) {
  auto r = run_command(cli() + " generate --model /nonexistent --tokens 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("petrel generate: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent"), std::string::npos) << r.output;
  r = run_command(cli() + " generate --model " + (data_dir() / "models/aidreams260k").string() + " --tokens 1,x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("'x'"), std::string::npos) << r.output;
  r = run_command(cli() + " generate --model " + (data_dir() / "models/aidreams260k").string() + " --tokens 1,9999");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("9999"), std::string::npos) << r.output;
}

// llama.cpp's `-np N` (serve's slots) is read as --parallel, whose range is checked before any model loads; bad
// arguments exit 2 (README), unknown flags and missing values too, --help 0.
TEST(Cli, ServeTakesLlamaCppsNpFlagAndBadArgumentsExit2) {
  for (const std::string flag : {"-np", "--parallel"}) {
    auto r = run_command(cli() + " serve /nonexistent " + flag + " 65");
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find("--parallel: Value 65 not in range 1 to 64"), std::string::npos) << r.output;
  }
  EXPECT_EQ(run_command(cli() + " bench --bogus").exit_code, 2);
  EXPECT_EQ(run_command(cli() + " generate").exit_code, 2);  // --model is required
  EXPECT_EQ(run_command(cli() + " serve --help").exit_code, 0);
  EXPECT_EQ(run_command(cli() + " --version").exit_code, 0);
}

TEST(Cli, InspectShowsArchitecture) {
  auto r = run_command(cli() + " inspect " + (data_dir() / "models/tiny-llama31").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("6 layers, hidden 256"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("8 query heads, 2 KV heads, head_dim 32"), std::string::npos);
  EXPECT_NE(r.output.find("llama3"), std::string::npos);
  EXPECT_NE(r.output.find("BF16 6622464"), std::string::npos);
  EXPECT_NE(r.output.find("parameters:      6622464 (0.007 B); files 16.01 bits per weight"), std::string::npos) << r.output;
}

TEST(Cli, MakeRandomWritesALoadableShardedCheckpoint) {
  TempDir dir("cli_random");
  const auto out = dir / "ckpt";
  auto r = run_command(cli() + " make-random --preset llama-3.1-8b --layers 2 --out " + out.string() +
                       " --max-shard-gb 0.00005 --set '{\"hidden_size\": 64, \"intermediate_size\": 128, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300}'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out / "model.safetensors.index.json"));
  auto model = LlamaModel::load(out);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->config().eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ((*model)->config().rope.original_max_position_embeddings, 8192);
  // Deterministic for a seed: a second run writes the same bytes.
  const auto out2 = dir / "ckpt2";
  r = run_command(cli() + " make-random --preset llama-3.1-8b --layers 2 --out " + out2.string() +
                  " --max-shard-gb 0.00005 --set '{\"hidden_size\": 64, \"intermediate_size\": 128, "
                  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300}'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = SafetensorsCheckpoint::open(out), b = SafetensorsCheckpoint::open(out2);
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& name : a->tensor_names()) {
    auto ta = a->tensor(name), tb = b->tensor(name);
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->num_bytes), 0) << name;
  }
  // Refuses to overwrite without --force, and leaves no temporary directory behind.
  r = run_command(cli() + " make-random --preset llama-3.2-1b --out " + out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("already exists"), std::string::npos);
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  r = run_command(cli() + " make-random --preset llama-9-huge --out " + (dir / "x").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("known presets"), std::string::npos);
}

}  // namespace
}  // namespace petrel

namespace petrel {
namespace {

TEST(Cli, BenchPrintsLlamaBenchStyleResults) {
  const std::string model = (testing::data_dir() / "models/tiny-llama31").string();
  auto r = testing::run_command(testing::cli_path().string() + " bench " + model + " -p 16 -n 4 -r 2 -o json",
                                /*with_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rows = nlohmann::json::parse(r.output);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["test"], "pp16");
  EXPECT_EQ(rows[1]["test"], "tg4");
  for (const auto& row : rows) {
    EXPECT_EQ(row["samples_ts"].size(), 2u);
    EXPECT_GT(row["avg_ts"].get<double>(), 0);
    EXPECT_EQ(row["params"], 6622464);
  }
  r = testing::run_command(testing::cli_path().string() + " bench " + model + " -p 8 -n 0 -r 1", /*with_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("| model | size | params | backend | threads | test | t/s |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| pp8 |"), std::string::npos) << r.output;
  // -d (llama-bench's depth): each test again after that many tokens in the cache, labelled "@ dN".
  r = testing::run_command(testing::cli_path().string() + " bench " + model + " -p 8 -n 4 -d 0,24 -r 1 -o json",
                           /*with_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  rows = nlohmann::json::parse(r.output);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["test"], "pp8");
  EXPECT_EQ(rows[1]["test"], "tg4");
  EXPECT_EQ(rows[2]["test"], "pp8 @ d24");
  EXPECT_EQ(rows[3]["test"], "tg4 @ d24");
  EXPECT_EQ(rows[0]["n_depth"], 0);
  EXPECT_EQ(rows[3]["n_depth"], 24);
  for (const auto& row : rows) EXPECT_GT(row["avg_ts"].get<double>(), 0);
  r = testing::run_command(testing::cli_path().string() + " bench " + model + " -p 8 -n 4 -d 100000000 -r 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("exceeds the model's"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace petrel

namespace petrel {
namespace {

TEST(Cli, ChatReusesTheKvCacheAcrossTurns) {
  const std::string model = (testing::data_dir() / "models/tiny-llama31").string();
  auto r = testing::run_command("printf 'Tell me about the city.\\nAnd the king?\\n/exit\\n' | " + testing::cli_path().string() +
                                " chat " + model + " --greedy -n 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", 0 reused"), std::string::npos) << r.output;        // first turn
  const size_t second = r.output.find("reused", r.output.find(", 0 reused") + 10);
  ASSERT_NE(second, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(", 0 reused", r.output.find(", 0 reused") + 10), std::string::npos) << r.output;
}

TEST(Cli, ChatSavesAndResumesInAnotherProcess) {
  const std::string model = (testing::data_dir() / "models/tiny-llama31").string();
  testing::TempDir dir("chat_save");
  const std::string file = (dir / "chat.kv").string();
  const std::string chat = testing::cli_path().string() + " chat " + model + " --greedy -n 8";
  // One process: a turn, /save, a second turn. Another: /load, the same second turn. stdout only (the stats go
  // to stderr, which a pipe may interleave differently).
  auto one = testing::run_command("printf 'Tell me about the city.\\n/save " + file + "\\nAnd the king?\\n/exit\\n' | " + chat, false);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two = testing::run_command("printf '/load " + file + "\\nAnd the king?\\n/exit\\n' | " + chat, false);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto after = [](const std::string& out, const std::string& marker) {
    const size_t at = out.find(marker);
    if (at == std::string::npos) return std::string("<no '" + marker + "'>");
    return out.substr(out.find('\n', at) + 1);
  };
  EXPECT_NE(one.output.find("(saved to " + file + ": "), std::string::npos) << one.output;
  EXPECT_NE(two.output.find("(loaded from " + file + ": "), std::string::npos) << two.output;
  EXPECT_NE(two.output.find(" 2 messages)"), std::string::npos) << two.output;  // the user's and the answer
  EXPECT_EQ(after(one.output, "(saved to"), after(two.output, "(loaded from"));  // the same second answer
  // The loaded cache is reused: the second turn processes only its new tokens.
  auto stats = testing::run_command("printf '/load " + file + "\\nAnd the king?\\n/exit\\n' | " + chat);
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_NE(stats.output.find(" reused"), std::string::npos) << stats.output;
  EXPECT_EQ(stats.output.find(", 0 reused"), std::string::npos) << stats.output;

  // Bad input is named and changes nothing: the chat goes on.
  std::ofstream(dir / "bad.kv.json") << "{\"format\": \"petrel-chat\", \"messages\": [{\"role\": 1}]}";
  std::ofstream(dir / "junk.kv.json") << "not json";
  std::ofstream(dir / "typed.kv.json") << "{\"format\": 1, \"messages\": []}";
  auto bad = testing::run_command("printf '/load " + (dir / "missing.kv").string() + "\\n/load " + (dir / "bad.kv").string() +
                                  "\\n/load " + (dir / "junk.kv").string() + "\\n/load " + (dir / "typed.kv").string() +
                                  "\\n/save\\nHello\\n/exit\\n' | " + chat);
  ASSERT_EQ(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("missing.kv.json"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("messages[0] needs a string \"role\""), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("junk.kv.json: not a petrel chat file"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("typed.kv.json: not a petrel chat file"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("/save needs a file name"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find(", 0 reused"), std::string::npos) << bad.output;  // "Hello" still answered, from scratch
}

TEST(Cli, DoctorReportsCpuAndKernels) {
  auto r = testing::run_command(testing::cli_path().string() + " doctor");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cpu:"), std::string::npos);
  EXPECT_NE(r.output.find("kernels:"), std::string::npos);
  EXPECT_NE(r.output.find("gpus:"), std::string::npos);
}

}  // namespace
}  // namespace petrel
