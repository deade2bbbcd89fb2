// petrel_bench_decode_cuda: the GPU token generator (model/cuda_model.h), tokens per second of tg128 as
// llama-bench counts it (128 decode steps after an empty prompt, logits of every step copied to the host).
//
//   petrel_bench_decode_cuda [--preset llama-3.1-8b] [--layers N] [--group -1|128] [--model DIR] [--reps N]
//
// Without --model the weights are random GPTQ tensors made in memory with the preset's exact shapes
// (4-bit decoder linears per-channel or group 128, 8-bit per-channel LM head, bf16 embedding and norms):
// speed does not depend on the values, and no 16 GB float checkpoint has to be written and quantized first.
// Each case runs with the step replayed from a CUDA graph and launched kernel by kernel. "weight GB/s" is
// the bytes of weights read per token (all linears and the LM head, one embedding row) over the time per token.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/io/hf_config.h"
#include "petrel/io/tensor_source.h"
#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/model/random_checkpoint.h"

namespace {

using namespace petrel;

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

// Random GPTQ tensors held in memory, named as a GPTQ checkpoint names them.
class RandomGptqSource : public TensorSource {
 public:
  RandomGptqSource(const LlamaConfig& c, int64_t group) {
    const int64_t h = c.hidden_size;
    add_dense("model.embed_tokens.weight", {c.vocab_size, h}, false);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add_dense(p + "input_layernorm.weight", {h}, true);
      add_dense(p + "post_attention_layernorm.weight", {h}, true);
      add_gptq(p + "self_attn.q_proj", c.q_dim(), h, 4, group);
      add_gptq(p + "self_attn.k_proj", c.kv_dim(), h, 4, group);
      add_gptq(p + "self_attn.v_proj", c.kv_dim(), h, 4, group);
      add_gptq(p + "self_attn.o_proj", h, c.q_dim(), 4, group);
      add_gptq(p + "mlp.gate_proj", c.intermediate_size, h, 4, group);
      add_gptq(p + "mlp.up_proj", c.intermediate_size, h, 4, group);
      add_gptq(p + "mlp.down_proj", h, c.intermediate_size, 4, group);
    }
    add_dense("model.norm.weight", {h}, true);
    add_gptq("lm_head", c.vocab_size, h, 8, -1);
  }

  Result<TensorView> tensor(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return not_found("random GPTQ source: no tensor '" + name + "'");
    const Stored& s = it->second;
    TensorView view;
    view.name = name;
    view.dtype = s.dtype;
    view.shape = s.shape;
    view.data = s.bytes.data();
    view.num_bytes = s.bytes.size();
    return view;
  }
  bool has(const std::string& name) const override { return tensors_.count(name) != 0; }
  std::string describe() const override { return "random GPTQ weights"; }

 private:
  struct Stored {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };

  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::vector<uint8_t>& make(const std::string& name, DType dtype, std::vector<int64_t> shape, size_t bytes) {
    Stored& s = tensors_[name];
    s.dtype = dtype;
    s.shape = std::move(shape);
    s.bytes.resize(bytes);
    return s.bytes;
  }

  // bf16: norms 1.0, other values +-[2^-7, 2^-6).
  void add_dense(const std::string& name, std::vector<int64_t> shape, bool ones) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& b = make(name, DType::kBF16, shape, static_cast<size_t>(n) * 2);
    uint16_t* v = reinterpret_cast<uint16_t*>(b.data());
    for (int64_t i = 0; i < n; i += 4) {
      const uint64_t r = next();
      for (int64_t j = 0; j < 4 && i + j < n; ++j) {
        const uint16_t bits = static_cast<uint16_t>(r >> (16 * j));
        v[i + j] = ones ? uint16_t{0x3F80} : static_cast<uint16_t>((bits & 0x8000) | 0x3C00 | (bits & 0x7F));
      }
    }
  }

  void add_gptq(const std::string& name, int64_t rows, int64_t cols, int bits, int64_t group) {
    const int64_t groups = group < 0 ? 1 : cols / group;
    auto& q = make(name + ".qweight", DType::kI32, {cols * bits / 32, rows}, static_cast<size_t>(cols * bits / 32 * rows) * 4);
    uint64_t* words = reinterpret_cast<uint64_t*>(q.data());
    for (size_t i = 0; i < q.size() / 8; ++i) words[i] = next();
    auto& s = make(name + ".scales", DType::kF16, {groups, rows}, static_cast<size_t>(groups * rows) * 2);
    uint16_t* scales = reinterpret_cast<uint16_t*>(s.data());
    for (int64_t i = 0; i < groups * rows; ++i) scales[i] = static_cast<uint16_t>(0x2000 | (next() & 0x3FF));  // ~2^-7
    auto& z = make(name + ".qzeros", DType::kI32, {groups, rows * bits / 32}, static_cast<size_t>(groups * rows * bits / 32) * 4);
    std::fill_n(reinterpret_cast<uint32_t*>(z.data()), z.size() / 4, bits == 4 ? 0x77777777u : 0x7F7F7F7Fu);  // v1 symmetric
  }

  uint64_t state_ = 42;
  std::map<std::string, Stored> tensors_;
};

struct Options {
  std::string preset = "llama-3.1-8b";
  int64_t layers = -1;
  int64_t group = -1;
  std::string model;
  int reps = 3;
  int n_gen = 128;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--preset") o.preset = value();
    else if (a == "--layers") o.layers = std::stoll(value());
    else if (a == "--group") o.group = std::stoll(value());
    else if (a == "--model") o.model = value();
    else if (a == "--reps") o.reps = std::stoi(value());
    else if (a == "-n") o.n_gen = std::stoi(value());
    else {
      std::fprintf(stderr, "usage: petrel_bench_decode_cuda [--preset P] [--layers N] [--group -1|128] [--model DIR] [--reps N] [-n N]\n");
      return 2;
    }
  }

  std::unique_ptr<LlamaModel> model;
  std::string name;
  const auto t_load = std::chrono::steady_clock::now();
  if (!o.model.empty()) {
    auto loaded = LlamaModel::load(o.model);
    check(loaded.status(), "loading the model");
    model = std::move(loaded).value();
    name = o.model;
  } else {
    auto preset = random_checkpoint_preset_config(o.preset);
    check(preset.status(), "preset");
    nlohmann::json j = nlohmann::json::parse(preset->dump());
    if (o.layers > 0) j["num_hidden_layers"] = o.layers;
    j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", o.group}, {"sym", true},
                                {"desc_act", false}, {"lm_head", true}};
    auto config = parse_llama_config(j, o.preset);
    check(config.status(), "config");
    auto source = std::make_unique<RandomGptqSource>(*config, o.group);
    auto built = LlamaModel::from_source(*config, std::move(source));
    check(built.status(), "binding the random weights");
    model = std::move(built).value();
    name = o.preset + " (" + std::to_string(config->num_hidden_layers) + " layers) W4 " +
           (o.group < 0 ? "per-channel" : "g" + std::to_string(o.group)) + ", 8-bit head, random";
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  // Bytes of weights one token reads: every linear, plus one embedding row.
  const LlamaConfig& c = model->config();
  auto linear_bytes = [](const LinearWeight& w) -> double {
    if (w.kind == LinearWeight::Kind::kGptq) {
      const auto& g = w.gptq;
      return double(g.rows) * g.cols * g.bits / 8 + double(g.n_groups()) * g.rows * (2 + g.bits / 8.0);
    }
    return double(w.dense.rows) * w.dense.cols * dtype_size(w.dense.dtype);
  };
  double token_bytes = double(c.hidden_size) * dtype_size(model->weights().embed_tokens.dtype);
  for (const LlamaLayerWeights& l : model->weights().layers) {
    for (const LinearWeight* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      token_bytes += linear_bytes(*w);
    }
  }
  token_bytes += linear_bytes(model->weights().lm_head);

  std::printf("model: %s (host build %.1f s); weights read per token %.3f GB\n\n", name.c_str(), load_s, token_bytes / 1e9);
  std::printf("| graph | test | upload s | t/s | ms/token | weight GB/s |\n|---|---|---|---|---|---|\n");
  for (bool graph : {true, false}) {
    CudaModelOptions options;
    options.context_length = std::min<int64_t>(4096, c.max_position_embeddings);
    options.use_graph = graph;
    const auto t0 = std::chrono::steady_clock::now();
    auto gpu = CudaModel::create(*model, options);
    check(gpu.status(), "CudaModel::create");
    const double upload_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<float> logits;
    std::vector<double> rates;
    for (int rep = -1; rep < o.reps; ++rep) {  // rep -1: warm-up (graph capture, first touches)
      (*gpu)->reset();
      const auto start = std::chrono::steady_clock::now();
      for (int t = 0; t < o.n_gen; ++t) check((*gpu)->decode(static_cast<int32_t>((t * 7919 + 1) % c.vocab_size), &logits), "decode");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rep >= 0) rates.push_back(o.n_gen / s);
    }
    double mean = 0;
    for (double r : rates) mean += r / rates.size();
    std::printf("| %s | tg%d | %.2f | %.1f | %.3f | %.0f |\n", graph ? "yes" : "no", o.n_gen, upload_s, mean, 1e3 / mean,
                token_bytes * mean / 1e9);
    std::fflush(stdout);
  }
  return 0;
}
