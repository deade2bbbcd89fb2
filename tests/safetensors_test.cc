#include "petrel/io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "petrel/io/hf_config.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::TempDir;

// Writes a safetensors file with the given JSON header and `data_bytes` zero bytes of data.
void write_safetensors(const std::filesystem::path& path, const std::string& header, size_t data_bytes,
                       int64_t lie_about_header_len = -1) {
  std::ofstream out(path, std::ios::binary);
  uint64_t len = lie_about_header_len >= 0 ? static_cast<uint64_t>(lie_about_header_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header;
  out << std::string(data_bytes, '\0');
}

Status open_status(const std::filesystem::path& path) { return SafetensorsFile::open(path).status(); }

TEST(Safetensors, ReadsValidFileZeroCopy) {
  TempDir dir("st_valid");
  write_safetensors(dir / "a.safetensors",
                    R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                    20);
  auto f = SafetensorsFile::open(dir / "a.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorView* w = f->find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kBF16);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->num_bytes, 12u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(Safetensors, RejectsTruncatedFile) {
  TempDir dir("st_trunc");
  write_safetensors(dir / "a.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  Status s = open_status(dir / "a.safetensors");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("outside the data region"), std::string::npos) << s.message();
}

TEST(Safetensors, RejectsHeaderLengthBeyondFile) {
  TempDir dir("st_hlen");
  write_safetensors(dir / "a.safetensors", "{}", 0, 1 << 20);
  EXPECT_EQ(open_status(dir / "a.safetensors").code(), ErrorCode::kInvalidData);
  std::ofstream(dir / "tiny.safetensors") << "abc";
  EXPECT_EQ(open_status(dir / "tiny.safetensors").code(), ErrorCode::kInvalidData);
}

TEST(Safetensors, RejectsMalformedJson) {
  TempDir dir("st_json");
  write_safetensors(dir / "a.safetensors", R"({"w":{"dtype":"F32","shape":[1],)", 4);
  Status s = open_status(dir / "a.safetensors");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("JSON"), std::string::npos);
}

TEST(Safetensors, RejectsSizeThatLiesAboutShape) {
  TempDir dir("st_size");
  write_safetensors(dir / "a.safetensors", R"({"w":{"dtype":"F16","shape":[3,3],"data_offsets":[0,16]}})", 16);
  Status s = open_status(dir / "a.safetensors");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("needs 18"), std::string::npos) << s.message();
}

TEST(Safetensors, RejectsOverlappingTensors) {
  TempDir dir("st_overlap");
  write_safetensors(dir / "a.safetensors",
                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12);
  Status s = open_status(dir / "a.safetensors");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("overlap"), std::string::npos);
}

TEST(Safetensors, RejectsUnknownDtypeAndBadShape) {
  TempDir dir("st_dtype");
  write_safetensors(dir / "a.safetensors", R"({"w":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_EQ(open_status(dir / "a.safetensors").code(), ErrorCode::kUnsupported);
  write_safetensors(dir / "b.safetensors", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  EXPECT_EQ(open_status(dir / "b.safetensors").code(), ErrorCode::kInvalidData);
}

TEST(Safetensors, OpensShardedCheckpointWithIndex) {
  auto ckpt = SafetensorsCheckpoint::open(testing::data_dir() / "parity/tied_mha");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_GT(ckpt->files().size(), 1u);
  auto t = ckpt->tensor("model.layers.1.mlp.down_proj.weight", {96, 256});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->dtype, DType::kF16);
  auto missing = ckpt->tensor("lm_head.weight");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  auto wrong = ckpt->tensor("model.norm.weight", {97});
  EXPECT_EQ(wrong.status().code(), ErrorCode::kInvalidData);
  EXPECT_NE(wrong.status().message().find("[96]"), std::string::npos);
  EXPECT_NE(wrong.status().message().find("[97]"), std::string::npos);
}

TEST(Safetensors, RejectsIndexPointingOutsideTheCheckpoint) {
  TempDir dir("st_index");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map":{"w":"../evil.safetensors"}})";
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_EQ(ckpt.status().code(), ErrorCode::kInvalidData);
  EXPECT_NE(ckpt.status().message().find("leaves the checkpoint directory"), std::string::npos);
}

TEST(Dtype, ConversionsRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.0009765625f, std::ldexp(1.0f, -24), std::ldexp(3.0f, -24), std::ldexp(1.0f, -14)}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), f32_to_bf16(1.0f));  // ties round to even
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

// --- config.json ---

nlohmann::json base_config() {
  return nlohmann::json::parse(R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,
    "max_position_embeddings":256,"rms_norm_eps":1e-5,"rope_theta":500000.0,"bos_token_id":1,
    "eos_token_id":[2,3]})");
}

TEST(LlamaConfig, ParsesClassicLayoutWithLlama3Scaling) {
  auto c = load_llama_config(testing::data_dir() / "models/tiny-llama31");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->rope.scaling, RopeScalingType::kLlama3);
  EXPECT_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 256);
  EXPECT_EQ(c->bos_token_id, 4080);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{4089, 4081}));  // config's, then generation_config's
}

TEST(LlamaConfig, ParsesRopeParametersLayout) {
  auto c = load_llama_config(testing::data_dir() / "parity/headdim_1kv");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 40);
  EXPECT_EQ(c->rope.scaling, RopeScalingType::kLinear);
  EXPECT_EQ(c->rope.factor, 2.0);
  auto g = load_llama_config(testing::data_dir() / "parity/gqa_llama3");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->rope.scaling, RopeScalingType::kLlama3);
  EXPECT_EQ(g->rope.theta, 500000.0);
}

TEST(LlamaConfig, DerivesHeadDimAndAcceptsScalarEos) {
  auto j = base_config();
  j["eos_token_id"] = 7;
  auto c = parse_llama_config(j, "config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(c->rope.scaling, RopeScalingType::kNone);
}

TEST(LlamaConfig, RefusesWhatItCannotRunExactly) {
  auto expect_refused = [](nlohmann::json j, ErrorCode code, const std::string& needle) {
    auto c = parse_llama_config(j, "config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), code);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  };
  auto j = base_config();
  j["model_type"] = "mistral";
  expect_refused(j, ErrorCode::kUnsupported, "mistral");
  j = base_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_refused(j, ErrorCode::kUnsupported, "yarn");
  j = base_config();
  j["num_key_value_heads"] = 3;
  expect_refused(j, ErrorCode::kInvalidData, "multiple");
  j = base_config();
  j.erase("hidden_size");
  expect_refused(j, ErrorCode::kInvalidData, "hidden_size");
  j = base_config();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_refused(j, ErrorCode::kInvalidData, "low_freq_factor");
  j = base_config();
  j["attention_bias"] = true;
  expect_refused(j, ErrorCode::kUnsupported, "attention_bias");
  j = base_config();
  j["vocab_size"] = "big";
  expect_refused(j, ErrorCode::kInvalidData, "vocab_size");
}

}  // namespace
}  // namespace petrel
