// quantize -> validate -> export -> load, through the CLI on tiny-llama31, and the ways each stage must fail.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "petrel/eval/fidelity.h"
#include "petrel/io/bundle.h"
#include "petrel/io/export.h"
#include "petrel/io/safetensors.h"
#include "petrel/model/llama.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::data_dir;
using testing::run_command;
using testing::TempDir;
namespace fs = std::filesystem;

using testing::cli;
std::string tiny() { return (data_dir() / "models/tiny-llama31").string(); }

// One RTN and one small GPTQ checkpoint shared by the tests of this file.
class Pipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("pipeline");
    auto r = run_command(cli() + " quantize -q --checkpoint " + tiny() + " --out " + rtn().string() + " --method rtn");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command(cli() + " quantize -q --checkpoint " + tiny() + " --out " + gptq().string() +
                    " --method gptq --group-size 128 --num-samples 16 --calib-seq-len 128");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path rtn() { return *dir_ / "rtn"; }
  static fs::path gptq() { return *dir_ / "gptq"; }
  static fs::path work(const std::string& name) { return *dir_ / name; }

  static testing::CommandResult validate(const fs::path& checkpoint, const std::string& extra = "") {
    return run_command(cli() + " validate -q --checkpoint " + checkpoint.string() + " --reference " + tiny() +
                       " --max-windows 3 " + extra);
  }

  static TempDir* dir_;
};
TempDir* Pipeline::dir_ = nullptr;

std::vector<float> last_logits(const LlamaModel& model, const std::vector<int32_t>& tokens) {
  auto cache = model.new_cache(64);
  std::vector<float> logits;
  EXPECT_TRUE(cache.ok());
  EXPECT_TRUE(model.process_prompt(tokens, *cache, 128, LogitsMode::kAll, &logits).ok());
  return logits;
}

TEST_F(Pipeline, QuantizedCheckpointIsGptqAndCloseToTheFloatModel) {
  auto config = nlohmann::json::parse(*read_text_file(rtn() / "config.json"));
  const auto& q = config["quantization_config"];
  EXPECT_EQ(q["quant_method"], "gptq");
  EXPECT_EQ(q["bits"], 4);
  EXPECT_EQ(q["group_size"], -1);
  EXPECT_EQ(q["checkpoint_format"], "gptq");
  EXPECT_EQ(q["dynamic"]["+:lm_head"]["bits"], 8);
  auto ckpt = SafetensorsCheckpoint::open(rtn());
  ASSERT_TRUE(ckpt.ok());
  auto qweight = ckpt->tensor("model.layers.0.mlp.down_proj.qweight");
  ASSERT_TRUE(qweight.ok());
  EXPECT_EQ(qweight->shape, (std::vector<int64_t>{768 / 8, 256}));
  EXPECT_EQ(ckpt->tensor("lm_head.qweight")->shape, (std::vector<int64_t>{256 / 4, 4096}));  // 8-bit head

  auto quantized = LlamaModel::load(rtn());
  auto reference = LlamaModel::load(tiny());
  ASSERT_TRUE(quantized.ok() && reference.ok()) << quantized.status().to_string();
  std::vector<int32_t> tokens = testing::read_ids(data_dir() / "parity/tiny-llama31.tokens.txt");
  tokens.resize(48);
  auto q_logits = last_logits(**quantized, tokens), f_logits = last_logits(**reference, tokens);
  eval::FidelityAccumulator acc;
  for (size_t t = 0; t < tokens.size(); ++t) {
    acc.add(std::span<const float>(f_logits.data() + t * 4096, 4096), std::span<const float>(q_logits.data() + t * 4096, 4096), -1);
  }
  EXPECT_LT(acc.summary().kl_mean, 0.1);
  EXPECT_GT(acc.summary().top1_agreement, 0.7);
}

TEST_F(Pipeline, ValidatePassesAndBothPathsAgree) {
  for (const fs::path& ckpt : {rtn(), gptq()}) {
    auto r = validate(ckpt);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("validate: PASSED"), std::string::npos);
    auto report = nlohmann::json::parse(*read_text_file(ckpt / "validation.json"));
    EXPECT_TRUE(report["passed"].get<bool>());
    EXPECT_EQ(report["windows"], 3);
    EXPECT_LE(report["paths_agreement"]["kl_mean"].get<double>(), 1e-6);
    EXPECT_GE(report["prompt_processor"]["top1_agreement"].get<double>(), 0.75);
  }
}

// Copies the RTN checkpoint and corrupts the bytes of the named tensors with `mutate`.
fs::path broken_copy(const fs::path& src, const fs::path& dst, const std::vector<std::string>& tensors,
                     const std::function<void(uint8_t*, size_t)>& mutate);

fs::path broken_copy(const fs::path& src, const fs::path& dst, const std::string& tensor,
                     const std::function<void(uint8_t*, size_t)>& mutate, bool fresh = true) {
  if (fresh) {
    fs::remove_all(dst);
    fs::create_directories(dst);
    for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dst / e.path().filename());
    fs::remove(dst / "validation.json");
  }
  size_t offset = 0, size = 0;
  {
    auto f = SafetensorsFile::open(dst / "model.safetensors");
    EXPECT_TRUE(f.ok());
    const TensorView* v = f->find(tensor);
    EXPECT_NE(v, nullptr);
    offset = static_cast<const uint8_t*>(v->data) - f->map().data();
    size = v->num_bytes;
  }
  std::vector<uint8_t> bytes(size);
  std::fstream io(dst / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset));
  io.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  mutate(bytes.data(), size);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
  return dst;
}

fs::path broken_copy(const fs::path& src, const fs::path& dst, const std::vector<std::string>& tensors,
                     const std::function<void(uint8_t*, size_t)>& mutate) {
  for (size_t i = 0; i < tensors.size(); ++i) broken_copy(src, dst, tensors[i], mutate, /*fresh=*/i == 0);
  return dst;
}

TEST_F(Pipeline, ValidateFailsOnAWrongScale) {
  auto dir = broken_copy(rtn(), work("bad_scale"), "model.layers.2.mlp.down_proj.scales", [](uint8_t* p, size_t n) {
    uint16_t* h = reinterpret_cast<uint16_t*>(p);
    for (size_t i = 0; i < n / 2; ++i) h[i] = f32_to_f16(-8.0f * f16_to_f32(h[i]));  // wrong sign and size
  });
  auto r = validate(dir);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("FAILED: prompt processor"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FAILED: token generator"), std::string::npos) << r.output;
  auto report = nlohmann::json::parse(*read_text_file(dir / "validation.json"));
  EXPECT_FALSE(report["passed"].get<bool>());
}

TEST_F(Pipeline, ValidateFailsOnAWrongNibbleOrder) {
  // Reverse the eight 4-bit codes of every qweight word of the decoder, as a packer with the wrong nibble
  // order would.
  std::vector<std::string> qweights;
  for (int l = 0; l < 6; ++l)
    for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      qweights.push_back("model.layers." + std::to_string(l) + "." + proj + ".qweight");
  auto dir = broken_copy(rtn(), work("bad_nibbles"), qweights, [](uint8_t* p, size_t n) {
    uint32_t* w = reinterpret_cast<uint32_t*>(p);
    for (size_t i = 0; i < n / 4; ++i) {
      uint32_t v = w[i], r = 0;
      for (int k = 0; k < 8; ++k) r |= ((v >> (4 * k)) & 0xF) << (4 * (7 - k));
      w[i] = r;
    }
  });
  auto r = validate(dir);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("FAILED"), std::string::npos) << r.output;
}

TEST_F(Pipeline, ExportedBundleRunsExactlyLikeTheCheckpoint) {
  ASSERT_EQ(validate(gptq()).exit_code, 0);
  const fs::path bundle = work("bundle");
  auto r = run_command(cli() + " export -q --checkpoint " + gptq().string() + " --out " + bundle.string() +
                       " --context-length 2048 --parts 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"config.json", "manifest.json", "model_config.json", "tokenizer.json", "tokenizer_config.json",
                        "part_1_of_3.bin", "part_2_of_3.bin", "part_3_of_3.bin"}) {
    EXPECT_TRUE(fs::exists(bundle / f)) << f;
  }
  auto manifest = nlohmann::json::parse(*read_text_file(bundle / "manifest.json"));
  EXPECT_TRUE(manifest["validation"]["passed"].get<bool>());
  EXPECT_EQ(manifest["parts"].size(), 3u);
  EXPECT_EQ(manifest["recipe"]["group_size"], 128);
  auto opened = Bundle::open(bundle);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_NE(opened->part_of("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(opened->part_of("model.embed_tokens.weight")->part_index(), 1);
  EXPECT_EQ(opened->part_of("lm_head.qweight")->part_index(), 3);

  auto from_bundle = LlamaModel::load(bundle / "config.json");
  auto from_checkpoint = LlamaModel::load(gptq());
  ASSERT_TRUE(from_bundle.ok()) << from_bundle.status().to_string();
  ASSERT_TRUE(from_checkpoint.ok());
  std::vector<int32_t> tokens = {4080, 424, 1413, 276, 289, 311};
  EXPECT_EQ(last_logits(**from_bundle, tokens), last_logits(**from_checkpoint, tokens));

  r = run_command(cli() + " inspect " + bundle.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("part_3_of_3.bin"), std::string::npos);
  EXPECT_NE(r.output.find("checksum ok"), std::string::npos);
}

TEST_F(Pipeline, ExportRefusesUnvalidatedOrFailedCheckpointsUnlessForced) {
  auto dir = broken_copy(rtn(), work("unvalidated"), "model.norm.weight", [](uint8_t*, size_t) {});
  auto r = run_command(cli() + " export -q --checkpoint " + dir.string() + " --out " + work("b_unval").string() +
                       " --context-length 2048");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run `petrel validate"), std::string::npos) << r.output;
  ASSERT_TRUE(write_file_atomic(dir / "validation.json", R"({"passed": false, "failures": ["token generator: mean KL 3 exceeds 0.1"]})").ok());
  r = run_command(cli() + " export -q --checkpoint " + dir.string() + " --out " + work("b_unval").string() +
                  " --context-length 2048");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("token generator: mean KL 3"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(work("b_unval")));
  r = run_command(cli() + " export -q --force --checkpoint " + dir.string() + " --out " + work("b_unval").string() +
                  " --context-length 2048");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(Pipeline, KilledExportLeavesNoBundleUnderTheFinalName) {
  ASSERT_EQ(validate(rtn()).exit_code, 0);
  const fs::path bundle = work("killed");
  auto r = run_command("PETREL_TEST_KILL_EXPORT_AFTER_PART=2 " + cli() + " export -q --checkpoint " + rtn().string() +
                       " --out " + bundle.string() + " --context-length 2048 --parts 5");
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_FALSE(fs::exists(bundle));
  r = run_command(cli() + " export -q --checkpoint " + rtn().string() + " --out " + bundle.string() + " --context-length 2048");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Bundle::open(bundle).ok());
}

TEST_F(Pipeline, CorruptedPartFailsToLoadNamingThePartAndTheChecksum) {
  ASSERT_EQ(validate(rtn()).exit_code, 0);
  const fs::path bundle = work("corrupt");
  ASSERT_EQ(run_command(cli() + " export -q --checkpoint " + rtn().string() + " --out " + bundle.string() +
                        " --context-length 2048").exit_code, 0);
  {
    std::fstream io(bundle / "part_4_of_5.bin", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(4096);
    io.put('\x5a');
  }
  auto model = LlamaModel::load(bundle);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("part_4_of_5.bin"), std::string::npos) << model.status().message();
  EXPECT_NE(model.status().message().find("checksum"), std::string::npos) << model.status().message();
  auto r = run_command(cli() + " generate --model " + bundle.string() + " --tokens 4080 -n 2");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.output.find("part_4_of_5.bin"), std::string::npos);
}

TEST_F(Pipeline, BundleConfigPathOutsideTheBundleIsRejected) {
  ASSERT_EQ(validate(rtn()).exit_code, 0);
  const fs::path bundle = work("escape");
  ASSERT_EQ(run_command(cli() + " export -q --checkpoint " + rtn().string() + " --out " + bundle.string() +
                        " --context-length 2048").exit_code, 0);
  auto config = nlohmann::ordered_json::parse(*read_text_file(bundle / "config.json"));
  config["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1] = "../part_2_of_5.bin";
  ASSERT_TRUE(write_file_atomic(bundle / "config.json", config.dump(2)).ok());
  auto model = LlamaModel::load(bundle);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("../part_2_of_5.bin"), std::string::npos) << model.status().message();
}

TEST_F(Pipeline, QuantizeNamesAMissingTensor) {
  const fs::path src = work("missing_src");
  fs::create_directories(src);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) fs::copy_file(data_dir() / "models/tiny-llama31" / f, src / f);
  // A checkpoint whose only tensor is the embedding.
  auto full = SafetensorsFile::open(data_dir() / "models/tiny-llama31/model.safetensors");
  ASSERT_TRUE(full.ok());
  const TensorView* embed = full->find("model.embed_tokens.weight");
  std::string header = R"({"model.embed_tokens.weight":{"dtype":"BF16","shape":[4096,256],"data_offsets":[0,)" +
                       std::to_string(embed->num_bytes) + "]}}";
  std::ofstream out(src / "model.safetensors", std::ios::binary);
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header;
  out.write(static_cast<const char*>(embed->data), static_cast<std::streamsize>(embed->num_bytes));
  out.close();
  auto r = run_command(cli() + " quantize -q --method rtn --checkpoint " + src.string() + " --out " + work("missing_out").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.layers.0.input_layernorm.weight"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(work("missing_out")));
}

TEST_F(Pipeline, GptqIsDeterministicForASeed) {
  const fs::path again = work("gptq_again");
  auto r = run_command(cli() + " quantize -q --checkpoint " + tiny() + " --out " + again.string() +
                       " --method gptq --group-size 128 --num-samples 16 --calib-seq-len 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = read_text_file(gptq() / "model.safetensors"), b = read_text_file(again / "model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b) << "two GPTQ runs with the same seed wrote different weights";
}

TEST_F(Pipeline, ReadsGptqV2CheckpointsOfOtherTools) {
  // GPTQModel's gptq_v2 stores the real zero point: rewrite our v1 checkpoint that way and expect the same model.
  const fs::path v2 = work("v2");
  fs::remove_all(v2);
  fs::create_directories(v2);
  for (const auto& e : fs::directory_iterator(rtn())) fs::copy_file(e.path(), v2 / e.path().filename());
  auto config = nlohmann::ordered_json::parse(*read_text_file(v2 / "config.json"));
  config["quantization_config"]["checkpoint_format"] = "gptq_v2";
  ASSERT_TRUE(write_file_atomic(v2 / "config.json", config.dump(2)).ok());
  std::vector<std::string> qzeros;
  for (int l = 0; l < 6; ++l)
    for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      qzeros.push_back("model.layers." + std::to_string(l) + "." + proj + ".qzeros");
  for (size_t i = 0; i < qzeros.size(); ++i) {
    broken_copy(v2, v2, qzeros[i], [](uint8_t* p, size_t n) {
      uint32_t* w = reinterpret_cast<uint32_t*>(p);
      for (size_t k = 0; k < n / 4; ++k) w[k] = 0x88888888u;  // symmetric 4-bit: real zero 8 (v1 stores 7)
    }, /*fresh=*/false);
  }
  broken_copy(v2, v2, "lm_head.qzeros", [](uint8_t* p, size_t n) {
    uint32_t* w = reinterpret_cast<uint32_t*>(p);
    for (size_t k = 0; k < n / 4; ++k) w[k] = 0x80808080u;  // 8-bit: real zero 128
  }, /*fresh=*/false);
  auto a = LlamaModel::load(rtn()), b = LlamaModel::load(v2);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  std::vector<int32_t> tokens = {4080, 424, 1413, 276};
  EXPECT_EQ(last_logits(**a, tokens), last_logits(**b, tokens));
}

// Quantized embeddings (--embedding-bits): the table is stored as GPTQ tensors with one row per token. The rows
// the model looks up are decoded here from the stored words, independently of petrel's GptqMatrix, and checked
// against the float table (round to nearest: within half a step) and against the model's own embedding output.
TEST(QuantizedEmbedding, RowsAreTheStoredCodesWithinHalfAStepOfTheFloatTable) {
  TempDir dir("quant_embedding");
  quant::QuantizeOptions o;
  o.method = quant::QuantMethod::kRtn;
  o.show_progress = false;
  o.quantize_embedding = true;
  o.embedding_scheme = quant::QuantScheme{4, 64, true, /*clip_search=*/false};
  ASSERT_TRUE(quant::quantize_checkpoint(tiny(), dir / "q", o).ok());

  auto config = nlohmann::json::parse(*read_text_file(dir / "q/config.json"));
  EXPECT_EQ(config["quantization_config"]["dynamic"]["+:model.embed_tokens"]["bits"], 4);
  EXPECT_EQ(config["quantization_config"]["dynamic"]["+:model.embed_tokens"]["group_size"], 64);
  EXPECT_EQ(config["quantization_config"]["petrel"]["embedding"], "w4 sym g64 rtn");
  auto ckpt = SafetensorsCheckpoint::open(dir / "q");
  auto source = SafetensorsCheckpoint::open(tiny());
  ASSERT_TRUE(ckpt.ok() && source.ok());
  EXPECT_FALSE(ckpt->has("model.embed_tokens.weight"));
  const int64_t vocab = 4096, hidden = 256, groups = hidden / 64;
  auto qweight = ckpt->tensor("model.embed_tokens.qweight", {hidden / 8, vocab});
  auto scales = ckpt->tensor("model.embed_tokens.scales", {groups, vocab});
  auto qzeros = ckpt->tensor("model.embed_tokens.qzeros", {groups, vocab / 8});
  auto table = source->tensor("model.embed_tokens.weight", {vocab, hidden});
  ASSERT_TRUE(qweight.ok() && scales.ok() && qzeros.ok() && table.ok()) << qweight.status().to_string();
  const auto* words = static_cast<const uint32_t*>(qweight->data);
  const auto* zero_words = static_cast<const uint32_t*>(qzeros->data);
  const auto* scale_bits = static_cast<const uint16_t*>(scales->data);
  auto decoded = [&](int64_t token, int64_t c) {  // GPTQ v1: codes along the input, zeros stored minus one
    const int64_t g = c / 64;
    const int code = static_cast<int>((words[(c / 8) * vocab + token] >> (4 * (c % 8))) & 0xF);
    const int zero = static_cast<int>((zero_words[g * (vocab / 8) + token / 8] >> (4 * (token % 8))) & 0xF) + 1;
    return f16_to_f32(scale_bits[g * vocab + token]) * static_cast<float>(code - zero);
  };
  double worst = 0;
  for (int64_t t = 0; t < vocab; ++t) {
    for (int64_t c = 0; c < hidden; ++c) {
      const float step = f16_to_f32(scale_bits[(c / 64) * vocab + t]);
      const double err = std::abs(decoded(t, c) - table->element(t * hidden + c));
      worst = std::max(worst, err / step);
    }
  }
  // Round to nearest is within half a step, plus the scale's rounding to fp16 (relative 2^-11) at the extreme
  // code: symmetric 4-bit maps the largest magnitude to 7.5 steps, clamped to 7.
  EXPECT_LE(worst, 0.5 + 7.5 / 2048.0) << "round to nearest is within half a step of the float table";

  auto model = LlamaModel::load(dir / "q");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_EQ((*model)->weights().embed_tokens.kind, LinearWeight::Kind::kGptq);
  const std::vector<int32_t> tokens = {4080, 424, 1413, 276, 4095, 0};
  std::vector<float> embedded;
  (*model)->set_observer([&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
    if (name == "embed") embedded.assign(data, data + rows * cols);
  });
  auto cache = (*model)->new_cache(16);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*model)->forward(tokens, *cache, LogitsMode::kLast, &logits).ok());
  ASSERT_EQ(embedded.size(), tokens.size() * hidden);
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int64_t c = 0; c < hidden; ++c) ASSERT_EQ(embedded[i * hidden + c], decoded(tokens[i], c)) << "token " << tokens[i];
  }
}

TEST(QuantizedEmbedding, ValidatesExportsAndRunsFromTheBundleLikeTheCheckpoint) {
  TempDir dir("quant_embedding_cli");
  const fs::path q = dir / "q", bundle = dir / "bundle";
  auto r = run_command(cli() + " quantize -q --method rtn --embedding-bits 8 --checkpoint " + tiny() + " --out " + q.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(cli() + " validate -q --checkpoint " + q.string() + " --reference " + tiny() + " --max-windows 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto report = nlohmann::json::parse(*read_text_file(q / "validation.json"));
  // 8-bit rows cost almost nothing over the float table (RTN per channel: mean KL ~0.025 either way).
  EXPECT_LT(report["prompt_processor"]["kl_mean"].get<double>(), 0.05);
  EXPECT_LE(report["paths_agreement"]["kl_mean"].get<double>(), 1e-6);
  r = run_command(cli() + " export -q --checkpoint " + q.string() + " --out " + bundle.string() + " --context-length 2048 --parts 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto opened = Bundle::open(bundle);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ASSERT_NE(opened->part_of("model.embed_tokens.qweight"), nullptr);
  EXPECT_EQ(opened->part_of("model.embed_tokens.qweight")->part_index(), 1);
  auto from_bundle = LlamaModel::load(bundle), from_checkpoint = LlamaModel::load(q);
  ASSERT_TRUE(from_bundle.ok() && from_checkpoint.ok()) << from_bundle.status().to_string();
  EXPECT_EQ((*from_bundle)->weights().embed_tokens.gptq.bits, 8);
  std::vector<int32_t> tokens = {4080, 424, 1413, 276, 289, 311};
  EXPECT_EQ(last_logits(**from_bundle, tokens), last_logits(**from_checkpoint, tokens));
  r = run_command(cli() + " run -c " + (bundle / "config.json").string() + " --prompt 'Hello' -n 4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(QuantizedEmbedding, BadOptionsAreRefusedNamingTheTable) {
  TempDir dir("quant_embedding_bad");
  auto r = run_command(cli() + " quantize -q --method rtn --embedding-bits 3 --checkpoint " + tiny() + " --out " + (dir / "a").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--embedding-bits"), std::string::npos) << r.output;
  r = run_command(cli() + " quantize -q --method rtn --embedding-bits 4 --embedding-group-size 96 --checkpoint " + tiny() +
                  " --out " + (dir / "b").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.embed_tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("96"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "a"));
  EXPECT_FALSE(fs::exists(dir / "b"));
}

// --more-bits: 8-bit v and down projections in llama.cpp Q4_K_M's layers, declared per module in GPTQModel's
// `dynamic` overrides; read back by the loader, which refuses a file whose bits its config does not declare.
TEST(MoreBits, EightBitModulesWhereQ4KMPutsThemDeclaredAndReadBack) {
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < 32; ++l) {
    if (quant::more_bits_layer(l, 32)) layers.push_back(l);
  }
  // llama.cpp's use_more_bits for 32 layers: 0-3, 28-31 and 6, 9, ..., 27.
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));

  TempDir dir("more_bits");
  const fs::path q = dir / "q";
  auto r = run_command(cli() + " quantize -q --method rtn --more-bits v_proj,down_proj --checkpoint " + tiny() + " --out " + q.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ckpt = SafetensorsCheckpoint::open(q);
  ASSERT_TRUE(ckpt.ok());
  for (int l = 0; l < 6; ++l) {  // 6 layers: layers 2 and 5 get more bits
    const int bits = (l == 2 || l == 5) ? 8 : 4;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(ckpt->tensor(p + "self_attn.v_proj.qweight")->shape, (std::vector<int64_t>{256 * bits / 32, 64})) << l;
    EXPECT_EQ(ckpt->tensor(p + "mlp.down_proj.qweight")->shape, (std::vector<int64_t>{768 * bits / 32, 256})) << l;
    EXPECT_EQ(ckpt->tensor(p + "self_attn.q_proj.qweight")->shape, (std::vector<int64_t>{256 * 4 / 32, 256})) << l;
  }
  auto config = nlohmann::ordered_json::parse(*read_text_file(q / "config.json"));
  EXPECT_EQ(config["quantization_config"]["dynamic"]["+:model\\.layers\\.5\\.mlp\\.down_proj"]["bits"], 8);
  r = run_command(cli() + " validate -q --checkpoint " + q.string() + " --reference " + tiny() + " --max-windows 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto model = LlamaModel::load(q);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->weights().layers[2].down_proj.gptq.bits, 8);
  EXPECT_EQ((*model)->weights().layers[3].down_proj.gptq.bits, 4);

  // A config that does not declare the 8-bit modules: refused, naming the tensor and both widths.
  config["quantization_config"]["dynamic"].erase("+:model\\.layers\\.2\\.self_attn\\.v_proj");
  ASSERT_TRUE(write_file_atomic(q / "config.json", config.dump(2)).ok());
  auto lying = LlamaModel::load(q);
  ASSERT_FALSE(lying.ok());
  EXPECT_NE(lying.status().message().find("model.layers.2.self_attn.v_proj"), std::string::npos) << lying.status().message();
  EXPECT_NE(lying.status().message().find("stored with 8 bits, config.json says 4"), std::string::npos) << lying.status().message();

  r = run_command(cli() + " quantize -q --method rtn --more-bits v_prj --checkpoint " + tiny() + " --out " + (dir / "bad").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'v_prj' is not one of"), std::string::npos) << r.output;
}

TEST(ExportBalance, SplitsContiguousGroupsMinimisingTheLargestPart) {
  auto starts = balance_parts({10, 3, 3, 3, 3, 3, 3, 10}, 3);
  ASSERT_TRUE(starts.ok());
  EXPECT_EQ(*starts, (std::vector<size_t>{0, 2, 6}));  // 13 / 12 / 13
  EXPECT_FALSE(balance_parts({1, 2}, 3).ok());
}

}  // namespace
}  // namespace petrel
