// The reference forward against Hugging Face transformers (float32, eager attention) on the shipped
// tiny-llama31 and three random-weight configurations (tests/data/parity/make_parity_fixtures.py), through
// the prompt processor (128-token chunks and an odd chunk size) and the token generator (one token at a time).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "petrel/io/npy.h"
#include "petrel/model/llama.h"
#include "petrel/runtime/generate.h"
#include "petrel/runtime/sampler.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::data_dir;

struct ParityCase {
  std::string name;
  std::string model_dir;  // relative to the test data dir
};

void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.name; }

struct Comparison {
  double relative_l2 = 0;
  int64_t argmax_mismatches = 0;
};

Comparison compare(const std::vector<float>& got, const NpyArray& expected, int64_t vocab) {
  Comparison c;
  const float* want = expected.f32();
  double diff = 0, norm = 0;
  const int64_t n = expected.shape[0];
  for (int64_t i = 0; i < n * vocab; ++i) {
    diff += double(got[i] - want[i]) * (got[i] - want[i]);
    norm += double(want[i]) * want[i];
  }
  c.relative_l2 = std::sqrt(diff / norm);
  for (int64_t t = 0; t < n; ++t) {
    std::span<const float> g(got.data() + t * vocab, vocab), w(want + t * vocab, vocab);
    if (argmax(g) != argmax(w)) c.argmax_mismatches++;
  }
  return c;
}

class ModelParity : public ::testing::TestWithParam<ParityCase> {
 protected:
  void SetUp() override {
    auto loaded = LlamaModel::load(data_dir() / GetParam().model_dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    model_ = std::move(*loaded);
    tokens_ = testing::read_ids(data_dir() / ("parity/" + GetParam().name + ".tokens.txt"));
    auto expected = read_npy(data_dir() / ("parity/" + GetParam().name + ".logits.npy"));
    ASSERT_TRUE(expected.ok()) << expected.status().to_string();
    expected_ = std::move(*expected);
    ASSERT_GT(tokens_.size(), 128u) << "the sequence must be longer than one prompt chunk";
    ASSERT_EQ(expected_.shape, (std::vector<int64_t>{int64_t(tokens_.size()), model_->config().vocab_size}));
  }

  void expect_matches(const std::vector<float>& logits, const std::string& path) {
    Comparison c = compare(logits, expected_, model_->config().vocab_size);
    EXPECT_LE(c.relative_l2, 1e-4) << path;
    EXPECT_EQ(c.argmax_mismatches, 0) << path;
    std::printf("[ parity ] %-13s %-22s relative L2 %.2e, argmax mismatches %lld\n", GetParam().name.c_str(),
                path.c_str(), c.relative_l2, static_cast<long long>(c.argmax_mismatches));
  }

  std::unique_ptr<LlamaModel> model_;
  std::vector<int32_t> tokens_;
  NpyArray expected_;
};

TEST_P(ModelParity, PromptProcessorMatchesTransformers) {
  for (int64_t chunk : {128, 37}) {
    auto cache = model_->new_cache(256, KvType::kF32);
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    Status s = model_->process_prompt(tokens_, *cache, chunk, LogitsMode::kAll, &logits);
    ASSERT_TRUE(s.ok()) << s.to_string();
    expect_matches(logits, "prompt chunks of " + std::to_string(chunk));
  }
}

TEST_P(ModelParity, TokenGeneratorMatchesTransformers) {
  auto cache = model_->new_cache(256, KvType::kF32);
  ASSERT_TRUE(cache.ok());
  std::vector<float> all, step;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    Status s = model_->forward(std::span<const int32_t>(&tokens_[i], 1), *cache, LogitsMode::kLast, &step);
    ASSERT_TRUE(s.ok()) << s.to_string();
    all.insert(all.end(), step.begin(), step.end());
  }
  expect_matches(all, "token generator");
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ModelParity,
                         ::testing::Values(ParityCase{"tiny-llama31", "models/tiny-llama31"},
                                           ParityCase{"gqa_llama3", "parity/gqa_llama3"},
                                           ParityCase{"tied_mha", "parity/tied_mha"},
                                           ParityCase{"headdim_1kv", "parity/headdim_1kv"}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(Generation, Aidreams260kGreedyMatchesLlama2cGolden) {
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::vector<int32_t> expected = testing::read_ids(data_dir() / "models/aidreams260k/aidreams260K_greedy_n128.expected_ids.txt");
  ASSERT_EQ(expected.size(), 128u);
  GenerateOptions options;
  options.max_new_tokens = 128;
  options.sampler = SamplerConfig::greedy_config();
  std::vector<int32_t> prompt = {1};
  auto output = generate(**model, prompt, options);
  ASSERT_TRUE(output.ok()) << output.status().to_string();
  EXPECT_EQ(*output, expected);
}

TEST(Generation, TinyLlama31GreedyMatchesTransformersGenerate) {
  auto model = LlamaModel::load(data_dir() / "models/tiny-llama31");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
  std::vector<int32_t> expected = testing::read_ids(data_dir() / "parity/tiny-llama31.greedy.txt");
  ASSERT_EQ(expected.size(), 32u);
  GenerateOptions options;
  options.max_new_tokens = 32;
  options.sampler = SamplerConfig::greedy_config();
  auto output = generate(**model, std::span<const int32_t>(tokens.data(), 16), options);
  ASSERT_TRUE(output.ok()) << output.status().to_string();
  EXPECT_EQ(*output, expected);
}

TEST(Generation, PromptLongerThanContextIsAClearError) {
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> prompt(129, 5);  // context is 128
  GenerateOptions options;
  auto output = generate(**model, prompt, options);
  EXPECT_EQ(output.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(output.status().message().find("Context Size was exceeded"), std::string::npos);
}

TEST(Model, RejectsTokenOutsideVocabularyWithoutTouchingTheCache) {
  auto model = LlamaModel::load(data_dir() / "models/aidreams260k");
  ASSERT_TRUE(model.ok());
  auto cache = (*model)->new_cache(16, KvType::kF32);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> tokens = {1, 512};
  std::vector<float> logits;
  Status s = (*model)->forward(tokens, *cache, LogitsMode::kLast, &logits);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("512"), std::string::npos);
  EXPECT_EQ(cache->n_past, 0);
}

TEST(Model, MissingTensorIsNamed) {
  testing::TempDir dir("missing_tensor");
  const auto src = data_dir() / "models/aidreams260k";
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  // A safetensors file holding only the embedding.
  auto full = SafetensorsFile::open(src / "model.safetensors");
  ASSERT_TRUE(full.ok());
  const TensorView* embed = full->find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  std::string header = R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[512,64],"data_offsets":[0,)" +
                       std::to_string(embed->num_bytes) + "]}}";
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header;
  out.write(static_cast<const char*>(embed->data), static_cast<std::streamsize>(embed->num_bytes));
  out.close();
  auto model = LlamaModel::load(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(model.status().message().find("model.layers.0.input_layernorm.weight"), std::string::npos)
      << model.status().message();
}

}  // namespace
}  // namespace petrel
