// petrel bench: llama-bench's table (model, size, params, backend, threads, test, t/s as mean +- sd) for
// prompt processing (ppN: N tokens through the prompt processor, from an empty context) and token generation
// (tgN: N tokens one at a time, from an empty context), repeated -r times after one warm-up.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "petrel/util/bandwidth.h"
#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/util/parallel.h"

namespace petrel::cli {

namespace {

struct BenchFlags {
  bool bandwidth = false;
  std::string kv_type = "f16";
  std::string model;
  std::string prompt_sizes = "512";
  std::string gen_sizes = "128";
  std::string depths = "0";
  int repetitions = 5;
  int threads = 0;
  std::string output = "md";
  int64_t chunk_size = 128;
  std::string backend = "cpu";  // cpu, or cuda: GPU 0 (model/cuda_model.h)
  std::string prefill_f16_weights = "auto";
  bool deterministic = false;
};

struct BenchRow {
  std::string test;
  int64_t depth = 0;
  double mean = 0, sd = 0;
  std::vector<double> samples;
};

Result<std::vector<int64_t>> parse_sizes(const std::string& text, const std::string& flag) {
  PETREL_ASSIGN_OR_RETURN(auto ids, parse_token_ids(text, flag));
  std::vector<int64_t> sizes;
  for (int32_t v : ids) {
    if (v > 0) sizes.push_back(v);  // 0 disables the test, as in llama-bench
  }
  return sizes;
}

int run_bench(const BenchFlags& f) {
  const char* cmd = "bench";
  ThreadPool::set_global_threads(f.threads);
  if (f.output != "md" && f.output != "json" && f.output != "csv") {
    return report_error(cmd, invalid_argument("-o must be md, json or csv, got '" + f.output + "'"));
  }
  if (f.repetitions <= 0) return report_error(cmd, invalid_argument("-r must be positive"));
  auto pp = parse_sizes(f.prompt_sizes, "-p");
  if (!pp.ok()) return report_error(cmd, pp.status());
  auto tg = parse_sizes(f.gen_sizes, "-n");
  if (!tg.ok()) return report_error(cmd, tg.status());
  auto depth_ids = parse_token_ids(f.depths, "-d");  // 0 is a depth here (no tokens before the test)
  if (!depth_ids.ok()) return report_error(cmd, depth_ids.status());
  const std::vector<int64_t> depths(depth_ids->begin(), depth_ids->end());
  if (depths.empty()) return report_error(cmd, invalid_argument("-d needs at least one depth (0: none)"));
  const int64_t deepest = *std::max_element(depths.begin(), depths.end());
  if (f.backend != "cpu" && f.backend != "cuda") {
    return report_error(cmd, invalid_argument("--backend must be cpu or cuda, got '" + f.backend + "'"));
  }
  auto model = LlamaModel::load(f.model);
  if (!model.ok()) return report_error(cmd, model.status());
  const LlamaConfig& c = (*model)->config();
  int64_t longest = 1;  // the longest test, in tokens
  for (int64_t n : *tg) longest = std::max(longest, n);
  for (int64_t n : *pp) longest = std::max(longest, n);
  if (deepest + longest > c.max_position_embeddings) {
    return report_error(cmd, invalid_argument("-d " + std::to_string(deepest) + " plus a test of " + std::to_string(longest) +
                                              " tokens exceeds the model's " + std::to_string(c.max_position_embeddings) +
                                              " positions"));
  }
  std::unique_ptr<CudaModel> gpu;  // --backend cuda: weights uploaded once, KV cache on the GPU
  if (f.backend == "cuda") {
    CudaModelOptions options;
    options.context_length = deepest + longest;
    // The whole prompt in one chunk (llama-bench's pp is one batch of n tokens), up to 512 at a time.
    options.prefill_chunk = std::min<int64_t>(longest, 512);
    auto f16_weights = parse_prefill_f16_weights(f.prefill_f16_weights);
    if (!f16_weights.ok()) return report_error(cmd, f16_weights.status());
    options.prefill_f16_weights = *f16_weights;
    options.decode_atomic_reduce = !f.deterministic;
    auto created = CudaModel::create(**model, options);
    if (!created.ok()) return report_error(cmd, created.status());
    gpu = std::move(created).value();
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size - 1));

  // `depth` random tokens before a test (llama-bench's -d), untimed: through the prompt processor, into the
  // GPU's cache or the CPU `cache`.
  auto fill = [&](int64_t depth, KvCache* cache) -> Status {
    if (depth == 0) return ok_status();
    std::vector<int32_t> tokens(depth);
    for (auto& t : tokens) t = token(rng);
    std::vector<float> logits;
    if (gpu) return gpu->forward(tokens, LogitsMode::kLast, &logits);
    return (*model)->process_prompt(tokens, *cache, f.chunk_size, LogitsMode::kLast, &logits);
  };
  // Times one run of a test in seconds, after `depth` tokens.
  auto time_pp = [&](int64_t n, int64_t depth) -> Result<double> {
    std::vector<int32_t> tokens(n);
    for (auto& t : tokens) t = token(rng);
    if (gpu) {  // the prompt processor on the GPU; the last row's logits reach the host, as on the CPU
      gpu->reset();
      PETREL_RETURN_IF_ERROR(fill(depth, nullptr));
      std::vector<float> logits;
      const auto start = std::chrono::steady_clock::now();
      PETREL_RETURN_IF_ERROR(gpu->forward(tokens, LogitsMode::kLast, &logits));
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    PETREL_ASSIGN_OR_RETURN(KvCache cache, (*model)->new_cache(std::min<int64_t>(std::max<int64_t>(depth + n, 1), c.max_position_embeddings),
                                                                        kv_type_of(f.kv_type)));
    PETREL_RETURN_IF_ERROR(fill(depth, &cache));
    std::vector<float> logits;
    const auto start = std::chrono::steady_clock::now();
    PETREL_RETURN_IF_ERROR((*model)->process_prompt(tokens, cache, f.chunk_size, LogitsMode::kLast, &logits));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto time_tg = [&](int64_t n, int64_t depth) -> Result<double> {
    if (gpu) {
      gpu->reset();
      PETREL_RETURN_IF_ERROR(fill(depth, nullptr));
      int32_t next = token(rng);
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < n; ++i) {
        // Each token's logits in host memory, as llama-bench's tg leaves them (a view, not a copy).
        PETREL_RETURN_IF_ERROR(gpu->decode_logits(next).status());
        next = token(rng);
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    PETREL_ASSIGN_OR_RETURN(KvCache cache, (*model)->new_cache(std::min<int64_t>(depth + n, c.max_position_embeddings), kv_type_of(f.kv_type)));
    PETREL_RETURN_IF_ERROR(fill(depth, &cache));
    std::vector<float> logits;
    int32_t next = token(rng);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      PETREL_RETURN_IF_ERROR((*model)->forward(std::span<const int32_t>(&next, 1), cache, LogitsMode::kLast, &logits));
      next = token(rng);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  std::vector<BenchRow> rows;
  auto measure = [&](const std::string& name, int64_t n, int64_t depth,
                     const std::function<Result<double>(int64_t, int64_t)>& once) -> Status {
    PETREL_RETURN_IF_ERROR(once(n, depth).status());  // warm-up
    BenchRow row;
    row.test = name + std::to_string(n) + (depth > 0 ? " @ d" + std::to_string(depth) : "");  // llama-bench's label
    row.depth = depth;
    for (int r = 0; r < f.repetitions; ++r) {
      PETREL_ASSIGN_OR_RETURN(double seconds, once(n, depth));
      row.samples.push_back(n / seconds);
    }
    for (double v : row.samples) row.mean += v / row.samples.size();
    for (double v : row.samples) row.sd += (v - row.mean) * (v - row.mean);
    row.sd = row.samples.size() > 1 ? std::sqrt(row.sd / (row.samples.size() - 1)) : 0;
    rows.push_back(row);
    return ok_status();
  };
  for (int64_t depth : depths) {
    for (int64_t n : *pp) {
      Status s = measure("pp", n, depth, time_pp);
      if (!s.ok()) return report_error(cmd, s);
    }
    for (int64_t n : *tg) {
      Status s = measure("tg", n, depth, time_tg);
      if (!s.ok()) return report_error(cmd, s);
    }
  }

  // Weight bytes as stored (codes, not scales), like llama-bench's model size.
  const uint64_t bytes = [&] {
    auto linear_bytes = [](const LinearWeight& l) -> uint64_t {
      return l.kind == LinearWeight::Kind::kGptq ? l.gptq.rows * l.gptq.cols * l.gptq.bits / 8
                                                 : l.dense.rows * l.dense.cols * dtype_size(l.dense.dtype);
    };
    const LlamaWeights& w = (*model)->weights();
    uint64_t total = linear_bytes(w.embed_tokens);
    if (!w.head_is_embedding()) total += linear_bytes(w.lm_head);
    for (const auto& layer : w.layers) {
      for (const LinearWeight* l : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                                    &layer.up_proj, &layer.down_proj}) {
        total += linear_bytes(*l);
      }
    }
    return total;
  }();
  const double n_params = static_cast<double>(c.parameter_count());
  char model_name[96];
  std::snprintf(model_name, sizeof model_name, "llama %.1f%s %s", n_params >= 1e9 ? n_params / 1e9 : n_params / 1e6,
                n_params >= 1e9 ? "B" : "M",
                c.quantization ? ("W" + std::to_string(c.quantization->bits) +
                                  (c.quantization->group_size > 0 ? " g" + std::to_string(c.quantization->group_size) : " per-channel"))
                                     .c_str()
                               : c.torch_dtype.c_str());
  char size[32], params[32];
  if (bytes >= (1ull << 30)) std::snprintf(size, sizeof size, "%.2f GiB", bytes / double(1ull << 30));
  else std::snprintf(size, sizeof size, "%.2f MiB", bytes / double(1ull << 20));
  if (n_params >= 1e9) std::snprintf(params, sizeof params, "%.2f B", n_params / 1e9);
  else std::snprintf(params, sizeof params, "%.2f M", n_params / 1e6);
  const int threads = ThreadPool::global().size();
  // GPTQ matrices run on kernels/cpu (gptq_matmul: GEMV for tg, GEMM for pp); float matrices on kernels/ref.
  const char* backend = gpu ? "cuda" : "cpu";
  // Bytes a generated token reads: every linear weight with its scales and zero points, the norms, one
  // embedding row (the KV cache adds 2 * layers * positions * kv_dim * element bytes, small at these lengths).
  const uint64_t bytes_per_token = [&] {
    auto read_bytes = [](const LinearWeight& l) -> uint64_t {
      if (l.kind != LinearWeight::Kind::kGptq) return l.dense.rows * l.dense.cols * dtype_size(l.dense.dtype);
      const uint64_t groups = l.gptq.n_groups();
      return l.gptq.rows * l.gptq.cols * l.gptq.bits / 8 + groups * l.gptq.rows * (2 + l.gptq.bits / 8.0);
    };
    const LlamaWeights& w = (*model)->weights();
    uint64_t total = read_bytes(w.lm_head) + embedding_row_bytes(w.embed_tokens);
    for (const auto& layer : w.layers) {
      for (const LinearWeight* l : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                                    &layer.up_proj, &layer.down_proj}) {
        total += read_bytes(*l);
      }
      total += 2 * c.hidden_size * dtype_size(layer.input_norm.dtype);
    }
    return total;
  }();
  const double read_gbs = f.bandwidth ? measure_read_bandwidth_gbs() : 0.0;
  if (f.output == "md") {
    std::printf("| model | size | params | backend | threads | test | t/s |\n");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
    for (const auto& r : rows)
      std::printf("| %s | %s | %s | %s | %d | %s | %.2f ± %.2f |\n", model_name, size, params, backend, threads, r.test.c_str(), r.mean, r.sd);
    if (f.bandwidth) {
      std::printf("\n%.3f GB read per generated token; machine read bandwidth now: %.1f GB/s (floor %.2f tok/s)\n",
                  bytes_per_token / 1e9, read_gbs, read_gbs * 1e9 / bytes_per_token);
      for (const auto& r : rows) {
        if (r.test.rfind("tg", 0) == 0) {
          std::printf("%s: %.1f GB/s of weights = %.0f%% of the measured bandwidth\n", r.test.c_str(),
                      r.mean * bytes_per_token / 1e9, 100.0 * r.mean * bytes_per_token / 1e9 / read_gbs);
        }
      }
    }
  } else if (f.output == "csv") {
    std::printf("model,size,params,backend,threads,test,t/s,t/s_sd\n");
    for (const auto& r : rows)
      std::printf("\"%s\",\"%s\",\"%s\",%s,%d,%s,%.4f,%.4f\n", model_name, size, params, backend, threads, r.test.c_str(), r.mean, r.sd);
  } else {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& r : rows) {
      nlohmann::ordered_json row = {{"model", model_name}, {"model_bytes", bytes}, {"params", c.parameter_count()},
                                    {"backend", backend}, {"threads", threads}, {"test", r.test}, {"n_depth", r.depth}, {"avg_ts", r.mean},
                                    {"stddev_ts", r.sd}, {"samples_ts", r.samples}, {"bytes_per_token", bytes_per_token}};
      if (f.bandwidth) row["read_bandwidth_gbs"] = read_gbs;
      out.push_back(row);
    }
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, CliContext& ctx) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "llama-bench style speed table: ppN (prompt processing) and tgN (generation)");
  cmd->add_option("model", f->model, "Bundle, BUNDLE/config.json, or checkpoint directory")->required();
  cmd->add_option("-p,--n-prompt", f->prompt_sizes, "Prompt sizes, comma-separated (0: none)")->capture_default_str();
  cmd->add_option("-n,--n-gen", f->gen_sizes, "Generation lengths, comma-separated (0: none)")->capture_default_str();
  cmd->add_option("-d,--n-depth", f->depths,
                  "Tokens already in the KV cache before each test, comma-separated (llama-bench's -d: \"tg128 @ d4096\"); "
                  "processed untimed")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", f->repetitions, "Timed runs per test (after one warm-up)")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "Worker threads; 0 = all cores")->capture_default_str();
  cmd->add_option("-o,--output", f->output, "md, json or csv")->capture_default_str();
  add_kv_type_option(cmd, f->kv_type);
  cmd->add_flag("--bandwidth", f->bandwidth,
                "Also measure the machine's read bandwidth and report bytes read per generated token against it");
  cmd->add_option("--chunk-size", f->chunk_size, "Prompt processor sequence length")->capture_default_str();
  cmd->add_option("--backend", f->backend, "cpu, or cuda (GPU 0: prompt processor and token generator of model/cuda_model.h)")->capture_default_str();
  cmd->add_option("--prefill-f16-weights", f->prefill_f16_weights,
                  "cuda: fp16 copies of the 4-bit linears for prompts over 160 tokens: auto, on, off (CudaModelOptions)")
      ->capture_default_str();
  add_deterministic_option(cmd, f->deterministic);
  cmd->callback([f, &ctx] { ctx.exit_code = run_bench(*f); });
}

}  // namespace petrel::cli
