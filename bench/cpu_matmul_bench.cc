// Speed of the CPU W4A16 matrix products on Llama-3.1-8B shapes (or Llama-3.2-1B's with --model 1b): the token generator's GEMV (bytes of weights
// read per second, against the machine's read bandwidth measured in the same run) and the prompt processor's
// GEMM over a 128-row chunk (multiply-accumulates per second). Random codes: speed does not depend on values.
// Each matrix runs at GPTQ's dense word-row stride (out words) and, where it differs, at the padded stride that
// `petrel export --backend cpu` writes (cpu::preferred_word_row_stride); GB/s counts the matrix's own bytes.
//
//   build/bench/petrel_bench_cpu_matmul [--threads N] [--reps N] [--group G] [--model 8b|1b]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/util/bandwidth.h"
#include "petrel/util/parallel.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Matrix {
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  petrel::ref::GptqMatrix view;
  int64_t bytes = 0;
};

Matrix make_matrix(int64_t rows, int64_t cols, int bits, int64_t group, int64_t stride, std::mt19937& rng) {
  Matrix m;
  m.view = petrel::ref::GptqMatrix{};
  const int64_t groups = cols / group;
  m.qweight.resize(cols * bits / 32 * stride);
  m.qzeros.resize(groups * rows * bits / 32);
  m.scales.assign(groups * rows, 0x2000);  // fp16 ~0.0078
  for (int32_t& v : m.qweight) v = static_cast<int32_t>(rng());
  for (int32_t& v : m.qzeros) v = static_cast<int32_t>(bits == 4 ? 0x77777777u : 0x7F7F7F7Fu);
  m.view.bits = bits;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.group_size = group;
  m.view.qweight = m.qweight.data();
  m.view.word_row_stride = stride;
  m.view.scales = m.scales.data();
  m.view.qzeros = m.qzeros.data();
  m.bytes = static_cast<int64_t>(cols * bits / 32 * rows * 4 + m.qzeros.size() * 4 + m.scales.size() * 2);
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  int bits;
};

// One table row: the GEMV's median over `reps` passes through >= 1 GiB of copies, the GEMM-128's median.
void run(const Shape& s, int64_t group, int64_t stride, int reps, std::mt19937& rng) {
  const int64_t g = s.bits == 8 || group <= 0 ? s.cols : group;
  // GEMV: cycle through copies totalling >= 1 GiB so that weights come from DRAM, not the last-level cache,
  // as in a real decode step (8B: ~4 GB of weights per token).
  const Matrix first = make_matrix(s.rows, s.cols, s.bits, g, stride, rng);
  const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t(1) << 30) / first.bytes + 1));
  std::vector<Matrix> pool;
  for (int i = 0; i < copies; ++i) {  // same values, distinct memory
    pool.push_back(first);
    Matrix& m = pool.back();
    m.view.qweight = m.qweight.data();
    m.view.scales = m.scales.data();
    m.view.qzeros = m.qzeros.data();
  }
  std::vector<float> x(128 * s.cols), y(128 * s.rows);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  std::vector<double> gemv, gemm;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (const Matrix& m : pool) petrel::cpu::gptq_matmul(x.data(), 1, m.view, y.data());
    gemv.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / copies);
  }
  const int gemm_reps = s.bits == 8 ? 1 : std::max(1, reps / 3);
  for (int r = 0; r < gemm_reps; ++r) {
    const auto t0 = Clock::now();
    petrel::cpu::gptq_matmul(x.data(), 128, pool[r % copies].view, y.data());
    gemm.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double tv = median(gemv), tm = median(gemm);
  std::printf("| %s | %lld | %.0f | %.1f | %.1f | %.1f |\n", s.name, static_cast<long long>(stride), tv * 1e6,
              first.bytes / tv / 1e9, tm * 1e3, 128.0 * s.rows * s.cols / tm / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 9;
  int64_t group = -1;
  bool small = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--group")) group = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--model") && (!std::strcmp(argv[i + 1], "8b") || !std::strcmp(argv[i + 1], "1b"))) {
      small = !std::strcmp(argv[i + 1], "1b");
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps N] [--group G (-1: per channel)] [--model 8b|1b]\n", argv[0]);
      return 2;
    }
  }
  if (threads > 0) petrel::ThreadPool::set_global_threads(threads);
  std::printf("kernel: %s; threads %d\n", petrel::cpu::gptq_matmul_variant(), petrel::ThreadPool::global().size());
  std::printf("read bandwidth (1 GiB, all threads): %.1f GB/s\n", petrel::measure_read_bandwidth_gbs());
  std::mt19937 rng(1);
  const std::vector<Shape> shapes =
      small ? std::vector<Shape>{{"q/o 2048x2048", 2048, 2048, 4}, {"k/v 512x2048", 512, 2048, 4},
                                 {"gate/up 8192x2048", 8192, 2048, 4}, {"down 2048x8192", 2048, 8192, 4},
                                 {"lm_head 8-bit 128256x2048", 128256, 2048, 8}}
            : std::vector<Shape>{{"q/o 4096x4096", 4096, 4096, 4}, {"k/v 1024x4096", 1024, 4096, 4},
                                 {"gate/up 14336x4096", 14336, 4096, 4}, {"down 4096x14336", 4096, 14336, 4},
                                 {"lm_head 8-bit 128256x4096", 128256, 4096, 8}};
  std::printf("| matrix | word-row stride | GEMV us | GEMV GB/s | GEMM-128 ms | GEMM GMAC/s |\n"
              "|---|---:|---:|---:|---:|---:|\n");
  for (const Shape& s : shapes) {
    run(s, group, s.rows, reps, rng);
    const int64_t padded = petrel::cpu::preferred_word_row_stride(s.rows);
    if (padded != s.rows) run(s, group, padded, reps, rng);
  }
  return 0;
}
