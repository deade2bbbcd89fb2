// Helpers shared by petrel's tests.
#pragma once

#include <cstdio>
#include <filesystem>
#include <random>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <memory>

#include "petrel/model/llama.h"
#include "petrel/quant/quantize_checkpoint.h"
#include "petrel/runtime/session.h"
#include "petrel/util/file.h"

namespace petrel::testing {

inline std::filesystem::path data_dir() { return PETREL_TEST_DATA_DIR; }

// tiny-llama31 loaded once for the whole test binary (CPU backend); null, with a failure recorded, if it cannot be.
inline std::shared_ptr<Engine> tiny_engine() {
  static std::shared_ptr<Engine> engine = [] {
    auto e = Engine::load(data_dir() / "models/tiny-llama31");
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? *e : nullptr;
  }();
  return engine;
}
inline std::filesystem::path cli_path() { return PETREL_CLI_PATH; }
// The CLI binary as a command-line prefix.
inline std::string cli() { return cli_path().string(); }

// A fresh empty directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ = std::filesystem::temp_directory_path() / ("petrel_test_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line and captures its stdout, and its stderr too unless `with_stderr` is false.
inline CommandResult run_command(const std::string& command, bool with_stderr = true) {
  CommandResult result;
  std::FILE* pipe = ::popen((command + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::vector<int32_t> read_ids(const std::filesystem::path& path) {
  std::vector<int32_t> ids;
  auto text = read_text_file(path);
  if (!text.ok()) return ids;
  size_t pos = 0;
  const std::string& s = *text;
  while (pos < s.size()) {
    while (pos < s.size() && (std::isspace(static_cast<unsigned char>(s[pos])) || s[pos] == ',')) ++pos;
    if (pos >= s.size()) break;
    size_t end = pos;
    while (end < s.size() && !std::isspace(static_cast<unsigned char>(s[end])) && s[end] != ',') ++end;
    ids.push_back(std::stoi(s.substr(pos, end - pos)));
    pos = end;
  }
  return ids;
}

// Relative L2 distance of `got` from `want`; infinity when `got` holds a NaN or infinity (an unwritten or
// broken output), so that a tolerance check fails.
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// n normally distributed floats with standard deviation `scale`.
inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// tiny-llama31 quantized with RTN into `out` (4-bit per channel when group < 0, else groups of `group`;
// 8-bit LM head) and loaded: the GPU tests' small quantized model.
// embedding_bits 16 keeps the float embedding table; 4 or 8 quantize it per token row (embedding_group -1) or
// in groups along the hidden size.
inline Result<std::unique_ptr<LlamaModel>> rtn_tiny_llama(const std::filesystem::path& out, int64_t group,
                                                          int embedding_bits = 16, int64_t embedding_group = -1) {
  quant::QuantizeOptions q;
  q.method = quant::QuantMethod::kRtn;
  q.scheme.group_size = group;
  q.quantize_embedding = embedding_bits != 16;
  q.embedding_scheme.bits = embedding_bits;
  q.embedding_scheme.group_size = embedding_group;
  q.show_progress = false;
  PETREL_RETURN_IF_ERROR(quant::quantize_checkpoint(data_dir() / "models/tiny-llama31", out, q));
  return LlamaModel::load(out);
}

}  // namespace petrel::testing
