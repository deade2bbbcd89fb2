// Choosing the backend (runtime/session.h: Engine::load with EngineOptions, `--backend` of run/chat/generate),
// `petrel export --backend cuda`, and the errors for a missing GPU, a bundle exported for the GPU on a machine
// without one, and too little GPU memory. The CPU tests run everywhere (CI: nvcc, no GPU); the GPU tests skip
// without a CUDA device and check that the cuda backend gives the CPU's greedy tokens through the same CLI and
// runtime paths (run, generate, Session with prefix reuse and reset) and the same profile JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "petrel/io/bundle.h"
#include "petrel/io/bundle_config.h"
#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/model/cuda_model.h"
#include "petrel/runtime/session.h"
#include "petrel/util/dtype.h"
#include "test_util.h"

namespace petrel {
namespace {

using testing::cli;
using testing::data_dir;
using testing::run_command;
using testing::TempDir;
namespace fs = std::filesystem;

bool have_gpu() {
  auto devices = cuda::list_devices();
  return devices.ok() && !devices->empty();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// tiny-llama31 quantized with RTN (4-bit per-channel, 8-bit head), exported for each backend; greedy sampling.
class Backend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("backend");
    const std::string tiny = (data_dir() / "models/tiny-llama31").string();
    auto r = run_command(cli() + " quantize -q --method rtn --checkpoint " + tiny + " --out " + (*dir_ / "q").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* backend : {"cpu", "cuda"}) {
      const fs::path out = *dir_ / (std::string(backend) + "_bundle");
      r = run_command(cli() + " export -q --force --backend " + backend + " --checkpoint " + (*dir_ / "q").string() +
                      " --out " + out.string() + " --context-length 512");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      auto config = nlohmann::ordered_json::parse(*read_text_file(out / "config.json"));
      config["dialog"]["sampler"]["greedy"] = true;
      ASSERT_TRUE(write_file_atomic(out / "config.json", config.dump(2)).ok());
    }
    std::ofstream(*dir_ / "prompt_tokens.txt") << "4080 424 1413 276 289 311 3585 303";
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path path(const std::string& name) { return *dir_ / name; }
  // The cpu bundle on `backend` (the GPU's cache 512 positions).
  static Result<std::shared_ptr<Engine>> load_engine(petrel::Backend backend) {
    EngineOptions options;
    options.backend = backend;
    if (backend == petrel::Backend::kCuda) options.context_length = 512;
    return Engine::load(path("cpu_bundle"), options);
  }
  // Greedy answers of max_new_tokens, no stop ids (the backends compared token for token).
  static GenerationConfig greedy(int64_t max_new_tokens) {
    GenerationConfig config;
    config.sampler.greedy = true;
    config.max_new_tokens = max_new_tokens;
    config.stop_token_ids = std::vector<int32_t>{};
    return config;
  }
  static std::string run_tokens(const std::string& bundle, const std::string& extra) {
    return cli() + " run -c " + path(bundle).string() + " --tokens_file " + path("prompt_tokens.txt").string() + " -n 24 " + extra;
  }
  static TempDir* dir_;
};
TempDir* Backend::dir_ = nullptr;

TEST_F(Backend, ExportRecordsTheBackendInGeniesField) {
  auto cpu = load_bundle_config(path("cpu_bundle"));
  auto cuda = load_bundle_config(path("cuda_bundle"));
  ASSERT_TRUE(cpu.ok() && cuda.ok());
  EXPECT_EQ(cpu->backend, BundleBackend::kCpu);
  EXPECT_EQ(cuda->backend, BundleBackend::kCuda);
  auto json = nlohmann::json::parse(*read_text_file(path("cuda_bundle/config.json")));
  EXPECT_EQ(json["dialog"]["engine"]["backend"]["type"], "petrel-cuda");
  auto manifest = nlohmann::json::parse(*read_text_file(path("cuda_bundle/manifest.json")));
  EXPECT_EQ(manifest["backend"], "petrel-cuda");
}

// The cuda bundle holds the checkpoint's tensors as stored; the cpu bundle the same tensors, except qweight
// matrices whose word rows the CPU kernels read faster padded (tiny-llama31: gate/up with 768 rows and the
// 4096-row head; not the 256- and 64-row ones): same rows, zero padding, at cpu::preferred_word_row_stride.
TEST_F(Backend, TheCpuExportPadsQweightRowsWhereItsKernelsReadThemFaster) {
  auto cpu = Bundle::open(path("cpu_bundle"));
  auto cuda = Bundle::open(path("cuda_bundle"));
  ASSERT_TRUE(cpu.ok() && cuda.ok());
  ASSERT_EQ(cpu->tensor_names(), cuda->tensor_names());
  int padded = 0;
  for (const std::string& name : cuda->tensor_names()) {
    const BundleTensor* c = *cuda->tensor(name);
    const BundleTensor* p = *cpu->tensor(name);
    EXPECT_TRUE(c->is_plain()) << name;
    EXPECT_EQ(p->dtype, c->dtype) << name;
    EXPECT_EQ(p->shape, c->shape) << name;
    const bool is_qweight = name.ends_with(".qweight");
    const int64_t stride = is_qweight ? cpu::preferred_word_row_stride(c->shape[1]) : 0;
    if (!is_qweight || stride == c->shape[1]) {
      EXPECT_TRUE(p->is_plain()) << name;
      EXPECT_EQ(p->checksum, c->checksum) << name;
      continue;
    }
    ++padded;
    EXPECT_EQ(p->layout, "padded_rows") << name;
    auto view = p->padded_rows_view();
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    ASSERT_EQ(view->row_stride, stride) << name;
    const int32_t* dense = reinterpret_cast<const int32_t*>(c->data);
    const int32_t* rows = static_cast<const int32_t*>(view->data);
    bool same = true, zero_padding = true;
    for (int64_t k = 0; k < c->shape[0]; ++k) {
      same = same && std::equal(dense + k * c->shape[1], dense + (k + 1) * c->shape[1], rows + k * stride);
      zero_padding = zero_padding && std::all_of(rows + k * stride + c->shape[1], rows + (k + 1) * stride,
                                                 [](int32_t v) { return v == 0; });
    }
    EXPECT_TRUE(same) << name;
    EXPECT_TRUE(zero_padding) << name;
  }
  EXPECT_EQ(padded, 6 * 2 + 1);  // gate_proj and up_proj of the 6 layers, lm_head
  // `petrel inspect` says so.
  auto inspected = run_command(cli() + " inspect " + path("cpu_bundle").string(), /*with_stderr=*/false);
  ASSERT_EQ(inspected.exit_code, 0) << inspected.output;
  EXPECT_NE(inspected.output.find("layouts:         padded_rows 13, plain "), std::string::npos) << inspected.output;
  inspected = run_command(cli() + " inspect " + path("cuda_bundle").string(), /*with_stderr=*/false);
  EXPECT_NE(inspected.output.find("layouts:         plain "), std::string::npos) << inspected.output;
  EXPECT_EQ(inspected.output.find("padded_rows"), std::string::npos) << inspected.output;
}

// A padded_rows tensor whose attributes do not fit its bytes is refused with the tensor's name.
TEST(BundleLayout, PaddedRowsWithALyingStrideIsRefused) {
  BundleTensor t;
  t.name = "model.layers.0.mlp.up_proj.qweight";
  t.dtype = DType::kI32;
  t.shape = {4, 100};
  t.layout = "padded_rows";
  t.attrs = {{"row_stride", 112}};
  t.num_bytes = 4 * 112 * 4;
  EXPECT_TRUE(t.padded_rows_view().ok());
  t.attrs = {{"row_stride", 96}};  // shorter than a row
  t.num_bytes = 4 * 96 * 4;
  auto r = t.padded_rows_view();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("up_proj.qweight"), std::string::npos) << r.status().message();
  t.attrs = {{"row_stride", 112}};
  t.num_bytes = 4 * 112 * 4 - 4;  // the size does not match
  EXPECT_FALSE(t.padded_rows_view().ok());
  t.attrs = {{"row_stride", "112"}};
  t.num_bytes = 4 * 112 * 4;
  EXPECT_FALSE(t.padded_rows_view().ok());
  t.layout = "w4-tiles";
  EXPECT_EQ(t.padded_rows_view().status().code(), ErrorCode::kUnsupported);
}

TEST_F(Backend, AutoTakesTheBundlesBackendAndCpuForACheckpoint) {
  EXPECT_EQ(*resolve_backend(path("cpu_bundle"), petrel::Backend::kAuto), petrel::Backend::kCpu);
  EXPECT_EQ(*resolve_backend(path("cuda_bundle/config.json"), petrel::Backend::kAuto), petrel::Backend::kCuda);
  EXPECT_EQ(*resolve_backend(path("q"), petrel::Backend::kAuto), petrel::Backend::kCpu);
  EXPECT_EQ(*resolve_backend(path("cuda_bundle"), petrel::Backend::kCpu), petrel::Backend::kCpu);
  EXPECT_EQ(*resolve_backend(path("cpu_bundle"), petrel::Backend::kCuda), petrel::Backend::kCuda);
  EXPECT_FALSE(parse_backend("gpu").ok());
}

TEST_F(Backend, ACudaBundleRunsOnTheCpuWhenAskedWithTheSameOutput) {
  auto cpu = run_command(run_tokens("cpu_bundle", ""), /*with_stderr=*/false);
  auto cuda_on_cpu = run_command(run_tokens("cuda_bundle", "--backend cpu"), /*with_stderr=*/false);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(cuda_on_cpu.exit_code, 0) << cuda_on_cpu.output;
  EXPECT_EQ(cpu.output, cuda_on_cpu.output);
}

TEST_F(Backend, ACudaBundleWithoutAGpuIsAClearError) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  auto r = run_command(run_tokens("cuda_bundle", ""));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, path("cuda_bundle").string() + " was exported for petrel-cuda")) << r.output;
  EXPECT_TRUE(contains(r.output, "no CUDA device") || contains(r.output, "not built")) << r.output;
  EXPECT_TRUE(contains(r.output, "--backend cpu")) << r.output;
}

TEST_F(Backend, BackendCudaWithoutAGpuIsAClearErrorInRunChatAndGenerate) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  const std::string why = cuda::built_with_cuda() ? "no CUDA device" : "the CUDA backend is not built";
  for (const std::string& command :
       {run_tokens("cpu_bundle", "--backend cuda"), cli() + " generate --backend cuda --model " + path("q").string() + " --tokens 1,2,3",
        "echo hi | " + cli() + " chat --backend cuda " + path("cpu_bundle").string()}) {
    auto r = run_command(command);
    EXPECT_EQ(r.exit_code, 3) << command << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "error: unsupported: backend cuda was asked for, but " +
                                       std::string(cuda::built_with_cuda() ? "there is no CUDA device" : "the CUDA backend is not built")))
        << r.output;
    EXPECT_TRUE(contains(r.output, why)) << r.output;
    EXPECT_FALSE(contains(r.output, "[BEGIN]")) << r.output;
  }
  auto r = run_command(run_tokens("cpu_bundle", "--backend gpu"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "--backend must be cpu, cuda or auto, got 'gpu'")) << r.output;
}

TEST(GpuMemory, TooLittleFreeMemoryNamesBothNumbers) {
  GpuMemoryNeed need;
  need.weight_bytes = int64_t{4} << 30;
  need.kv_cache_bytes = int64_t{512} << 20;
  need.scratch_bytes = int64_t{64} << 20;
  need.context_length = 4096;
  EXPECT_TRUE(check_gpu_memory(need, int64_t{8} << 30, int64_t{80} << 30, "CUDA device 0 (test)").ok());
  Status s = check_gpu_memory(need, int64_t{2} << 30, int64_t{80} << 30, "CUDA device 0 (test)");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(s.message(), "not enough GPU memory on CUDA device 0 (test)")) << s.message();
  EXPECT_TRUE(contains(s.message(), std::to_string(need.total()) + " bytes")) << s.message();
  EXPECT_TRUE(contains(s.message(), "2147483648 bytes) is free of 80.00 GiB")) << s.message();
  EXPECT_TRUE(contains(s.message(), "4096 positions")) << s.message();
}

// ---- On a GPU --------------------------------------------------------------------------------------------

std::vector<int32_t> ids_of(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  int32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

TEST_F(Backend, GpuRunAndGenerateGiveTheCpusGreedyTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  // Token ids: generate --print-ids on the bundle, each backend.
  const std::string tokens = "\"$(cat " + path("prompt_tokens.txt").string() + ")\"";
  auto cpu = run_command(cli() + " generate --greedy --print-ids --backend cpu --model " + path("cuda_bundle").string() +
                             " --tokens " + tokens + " -n 32", false);
  auto gpu = run_command(cli() + " generate --greedy --print-ids --backend cuda --model " + path("cpu_bundle").string() +
                             " --tokens " + tokens + " -n 32", false);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  EXPECT_EQ(ids_of(cpu.output), ids_of(gpu.output)) << "cpu: " << cpu.output << "gpu: " << gpu.output;
  EXPECT_EQ(ids_of(gpu.output).size(), 32u);
  // --deterministic: the token generator's sums in a fixed order; the same tokens.
  auto ordered = run_command(cli() + " generate --greedy --print-ids --deterministic --backend cuda --model " +
                                 path("cpu_bundle").string() + " --tokens " + tokens + " -n 32", false);
  ASSERT_EQ(ordered.exit_code, 0) << ordered.output;
  EXPECT_EQ(ids_of(ordered.output), ids_of(cpu.output)) << "gpu --deterministic: " << ordered.output;
  // The Genie contract: the cuda bundle picks the GPU by itself; same text as the CPU.
  auto run_cpu = run_command(run_tokens("cpu_bundle", ""), false);
  auto run_gpu = run_command(run_tokens("cuda_bundle", "--log info"));
  ASSERT_EQ(run_gpu.exit_code, 0) << run_gpu.output;
  EXPECT_TRUE(contains(run_gpu.output, "on cuda")) << run_gpu.output;
  auto run_gpu_text = run_command(run_tokens("cuda_bundle", ""), false);
  EXPECT_EQ(run_cpu.output, run_gpu_text.output);
}

TEST_F(Backend, GpuProfileJsonIsComplete) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  const fs::path profile = path("gpu_profile.json");
  fs::remove(profile);
  auto r = run_command(cli() + " run --backend cuda -c " + path("cpu_bundle").string() +
                       " -p '<|begin_of_text|>The history of' -n 16 --profile " + profile.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(*read_text_file(profile));
  EXPECT_EQ(j["header"]["artifact_type"], "GENIE_PROFILE");
  const auto& events = j["components"][0]["events"];
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "GenieDialog_create");
  EXPECT_GT(events[0]["init-time"]["value"].get<double>(), 0);
  const auto& q = events[1];
  EXPECT_EQ(q["type"], "GenieDialog_query");
  for (const char* field : {"num-prompt-tokens", "prompt-processing-rate", "time-to-first-token", "num-generated-tokens",
                            "token-generation-rate", "token-generation-time"}) {
    ASSERT_TRUE(q.contains(field)) << field;
    EXPECT_TRUE(q[field]["value"].is_number()) << field;
    EXPECT_GT(q[field]["value"].get<double>(), 0) << field;
  }
  EXPECT_EQ(q["num-prompt-tokens"]["value"], 4);
  EXPECT_EQ(q["num-generated-tokens"]["value"], 16);
}

TEST_F(Backend, GpuSessionReusesThePrefixResetsAndRefusesWhatItCannotDo) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto cpu_engine = load_engine(petrel::Backend::kCpu);
  auto gpu_engine = load_engine(petrel::Backend::kCuda);
  ASSERT_TRUE(cpu_engine.ok()) << cpu_engine.status().to_string();
  ASSERT_TRUE(gpu_engine.ok()) << gpu_engine.status().to_string();
  ASSERT_EQ((*gpu_engine)->backend(), petrel::Backend::kCuda);
  // What the cuda backend cannot do yet is refused, not done otherwise.
  EXPECT_EQ(Session::create(*gpu_engine, 512, KvType::kQ8).status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(Session::create(*gpu_engine, 513, KvType::kF16).status().code(), ErrorCode::kInvalidArgument);
  auto gpu = Session::create(*gpu_engine, 512);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Session cpu(*cpu_engine, 512);

  const GenerationConfig config = greedy(12);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if ((*cpu_engine)->templates()) {
    messages.push_back({{"role", "user"}, {"content", "Tell me about rivers."}});
    for (int turn = 0; turn < 2; ++turn) {
      auto a = cpu.query(messages, config);
      auto b = (*gpu)->query(messages, config);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
      EXPECT_EQ(a->tokens, b->tokens) << "turn " << turn;
      EXPECT_EQ(a->stats.reused_tokens, b->stats.reused_tokens);
      if (turn == 1) {
        EXPECT_GT(b->stats.reused_tokens, 0);
      }
      EXPECT_EQ(cpu.position(), (*gpu)->position());
      messages.push_back({{"role", "assistant"}, {"content", a->text}});
      messages.push_back({{"role", "user"}, {"content", "And lakes?"}});
    }
  }
  const std::vector<int32_t> prompt = {4080, 424, 1413, 276, 289, 311, 3585, 303};
  cpu.reset();
  (*gpu)->reset();
  EXPECT_EQ((*gpu)->position(), 0);
  for (int turn = 0; turn < 2; ++turn) {  // a continued dialog of raw tokens
    auto a = cpu.query_tokens(prompt, config);
    auto b = (*gpu)->query_tokens(prompt, config);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(a->tokens, b->tokens) << "turn " << turn;
    EXPECT_EQ(cpu.position(), (*gpu)->position());
  }
  // The memory estimate covers what was allocated.
  const GpuMemoryNeed need = gpu_memory_need((*gpu_engine)->model(), 512);
  EXPECT_GE(need.total(), (*gpu_engine)->cuda_model()->device_bytes());
}

// Sessions of one cuda engine take turns on its GPU (Session::take_gpu): each continues its own dialog as a CPU
// session of its own does, whatever ran in between, on one thread or on several.
TEST_F(Backend, GpuSessionsShareTheEngineInTurns) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto cpu_engine = load_engine(petrel::Backend::kCpu);
  auto gpu_engine = load_engine(petrel::Backend::kCuda);
  ASSERT_TRUE(cpu_engine.ok() && gpu_engine.ok());
  const GenerationConfig config = greedy(8);
  // Dialogs of different lengths, so that the set-aside rows grow past what they held.
  const std::vector<std::vector<int32_t>> prompts = {
      {4080, 424, 1413, 276, 289, 311, 3585, 303}, {311, 3585}, {289, 311, 3585, 303, 4080, 424, 1413, 276, 289, 311, 3585, 303, 424}};
  constexpr int kSessions = 3;
  std::vector<std::unique_ptr<Session>> gpu, cpu;
  for (int i = 0; i < kSessions; ++i) {
    auto g = Session::create(*gpu_engine, 512);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    gpu.push_back(std::move(g).value());
    cpu.push_back(std::make_unique<Session>(*cpu_engine, 512));
    EXPECT_EQ(gpu.back()->position(), 0);
  }
  // Interleaved turns, each session's prompts in order: 0, 1, 0, 2, 1, 0, 2, 2, 1.
  const int order[] = {0, 1, 0, 2, 1, 0, 2, 2, 1};
  int turn_of[kSessions] = {};
  for (int s : order) {
    const std::vector<int32_t>& prompt = prompts[(s + turn_of[s]++) % prompts.size()];
    auto a = cpu[s]->query_tokens(prompt, config);
    auto b = gpu[s]->query_tokens(prompt, config);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(a->tokens, b->tokens) << "session " << s << ", turn " << turn_of[s];
    for (int i = 0; i < kSessions; ++i) {
      EXPECT_EQ(gpu[i]->position(), cpu[i]->position()) << "session " << i;
      EXPECT_EQ(gpu[i]->history(), cpu[i]->history()) << "session " << i;
    }
  }
  // A session saved while another owns the GPU saves its own rows: its file restores into a CPU session that
  // continues as the original does.
  ASSERT_TRUE(gpu[0]->save(path("turns0.kv")).ok());
  Session cpu_restored(*cpu_engine, 512);
  ASSERT_TRUE(cpu_restored.restore(path("turns0.kv")).ok());
  EXPECT_EQ(cpu_restored.history(), cpu[0]->history());
  // Reset while set aside, and the owner destroyed: the others go on.
  gpu[2]->reset();
  cpu[2]->reset();
  EXPECT_EQ(gpu[2]->position(), 0);
  gpu[0].reset();
  cpu[0].reset();
  for (int s : {2, 1, 2}) {
    auto a = cpu[s]->query_tokens(prompts[1], config);
    auto b = gpu[s]->query_tokens(prompts[1], config);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(a->tokens, b->tokens) << "session " << s;
  }
  // Two threads, one session each, querying at once: the turns serialize them; the answers are the CPU's.
  std::vector<std::vector<int32_t>> expected[2], got[2];
  for (int t = 0; t < 2; ++t) {
    for (int k = 0; k < 3; ++k) {
      auto a = cpu[1 + t]->query_tokens(prompts[k], config);
      ASSERT_TRUE(a.ok());
      expected[t].push_back(a->tokens);
    }
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 3; ++k) {
        auto b = gpu[1 + t]->query_tokens(prompts[k], config);
        got[t].push_back(b.ok() ? b->tokens : std::vector<int32_t>{-1});
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(got[0], expected[0]);
  EXPECT_EQ(got[1], expected[1]);
}

// A state file's KV rows as floats (the f16 elements after the header and the tokens).
std::vector<float> state_rows(const std::string& bytes, int64_t n_tokens) {
  const size_t start = 8 + 4 + 6 * sizeof(int64_t) + n_tokens * sizeof(int32_t);
  std::vector<float> rows;
  for (size_t i = start; i + 2 <= bytes.size(); i += 2) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + i, 2);
    rows.push_back(f16_to_f32(bits));
  }
  return rows;
}

TEST_F(Backend, GpuSessionSavesAndRestoresItsKvCacheInTheCpusFormat) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto cpu_engine = load_engine(petrel::Backend::kCpu);
  auto gpu_engine = load_engine(petrel::Backend::kCuda);
  ASSERT_TRUE(cpu_engine.ok() && gpu_engine.ok());
  auto gpu = Session::create(*gpu_engine, 512);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Session cpu(*cpu_engine, 512);
  const GenerationConfig config = greedy(6);
  const std::vector<int32_t> prompt = {4080, 424, 1413, 276, 289, 311, 3585, 303}, more = {424, 1413};

  ASSERT_TRUE((*gpu)->query_tokens(prompt, config).ok());
  ASSERT_TRUE(cpu.query_tokens(prompt, config).ok());
  ASSERT_EQ((*gpu)->history(), cpu.history());  // the greedy tokens agree (GpuSessionReusesThePrefix... checks more)
  ASSERT_TRUE((*gpu)->save(path("gpu.kv")).ok());
  ASSERT_TRUE(cpu.save(path("cpu.kv")).ok());
  // The same file on both backends: equal sizes, headers and tokens; the rows as close as the two forwards are.
  auto gpu_bytes = read_text_file(path("gpu.kv"));
  auto cpu_bytes = read_text_file(path("cpu.kv"));
  ASSERT_TRUE(gpu_bytes.ok() && cpu_bytes.ok());
  ASSERT_EQ(gpu_bytes->size(), cpu_bytes->size());
  const int64_t n = (*gpu)->position();
  const size_t head = 8 + 4 + 6 * sizeof(int64_t) + n * sizeof(int32_t);
  int64_t header[6];
  std::memcpy(header, gpu_bytes->data() + 12, sizeof header);
  EXPECT_EQ(header[2], 512);  // the context
  EXPECT_EQ(header[3], n);
  EXPECT_EQ(gpu_bytes->substr(0, head), cpu_bytes->substr(0, head));
  const std::vector<float> g = state_rows(*gpu_bytes, n), c = state_rows(*cpu_bytes, n);
  ASSERT_EQ(g.size(), c.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    scale = std::max(scale, std::abs(c[i]));
    worst = std::max(worst, std::abs(g[i] - c[i]));
  }
  EXPECT_GT(scale, 0.0f);
  EXPECT_LT(worst, 2e-2f * scale) << "keys and values saved on the GPU are not the CPU's (layout or rotation?)";

  // Each backend continues from the other's state with the tokens it gives from its own.
  auto gpu_continued = (*gpu)->query_tokens(more, config);
  ASSERT_TRUE(gpu_continued.ok());
  Session cpu_restored(*cpu_engine, 512);
  ASSERT_TRUE(cpu_restored.restore(path("gpu.kv")).ok());
  EXPECT_EQ(cpu_restored.position(), n);
  auto cpu_continued = cpu_restored.query_tokens(more, config);
  ASSERT_TRUE(cpu_continued.ok());
  EXPECT_EQ(cpu_continued->tokens, gpu_continued->tokens);
  (*gpu)->reset();
  ASSERT_TRUE((*gpu)->restore(path("cpu.kv")).ok());
  EXPECT_EQ((*gpu)->position(), n);
  EXPECT_EQ((*gpu)->history(), cpu.history());
  auto gpu_from_cpu = (*gpu)->query_tokens(more, config);
  ASSERT_TRUE(gpu_from_cpu.ok());
  EXPECT_EQ(gpu_from_cpu->tokens, gpu_continued->tokens);
  // And from its own state, after other positions were written past it (they are not read again).
  ASSERT_TRUE((*gpu)->restore(path("gpu.kv")).ok());
  auto gpu_again = (*gpu)->query_tokens(more, config);
  ASSERT_TRUE(gpu_again.ok());
  EXPECT_EQ(gpu_again->tokens, gpu_continued->tokens);

  // Bad files change nothing: truncated, or saved with another KV type.
  const int64_t before = (*gpu)->position();
  std::ofstream(path("cut.kv"), std::ios::binary) << gpu_bytes->substr(0, gpu_bytes->size() - 100);
  Status cut = (*gpu)->restore(path("cut.kv"));
  EXPECT_EQ(cut.code(), ErrorCode::kInvalidData);
  EXPECT_NE(cut.message().find("truncated"), std::string::npos) << cut.message();
  Session q8(*cpu_engine, 512, KvType::kQ8);
  ASSERT_TRUE(q8.query_tokens(prompt, config).ok());
  ASSERT_TRUE(q8.save(path("q8.kv")).ok());
  Status typed = (*gpu)->restore(path("q8.kv"));
  EXPECT_EQ(typed.code(), ErrorCode::kInvalidData);
  EXPECT_NE(typed.message().find("q8"), std::string::npos) << typed.message();
  EXPECT_EQ((*gpu)->position(), before);
}

}  // namespace
}  // namespace petrel
