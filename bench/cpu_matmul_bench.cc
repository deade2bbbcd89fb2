// Speed of the CPU W4A16 matrix products on Llama-3.1-8B shapes: the token generator's GEMV (bytes of weights
// read per second, against the machine's read bandwidth measured in the same run) and the prompt processor's
// GEMM over a 128-row chunk (multiply-accumulates per second). Random codes: speed does not depend on values.
//
//   build/bench/petrel_bench_cpu_matmul [--threads N] [--reps N] [--group G]
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

Matrix make_matrix(int64_t rows, int64_t cols, int bits, int64_t group, std::mt19937& rng) {
  Matrix m;
  m.view = petrel::ref::GptqMatrix{};
  const int64_t groups = cols / group;
  m.qweight.resize(cols * bits / 32 * rows);
  m.qzeros.resize(groups * rows * bits / 32);
  m.scales.assign(groups * rows, 0x2000);  // fp16 ~0.0078
  for (int32_t& v : m.qweight) v = static_cast<int32_t>(rng());
  for (int32_t& v : m.qzeros) v = static_cast<int32_t>(bits == 4 ? 0x77777777u : 0x7F7F7F7Fu);
  m.view.bits = bits;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.group_size = group;
  m.view.qweight = m.qweight.data();
  m.view.scales = m.scales.data();
  m.view.qzeros = m.qzeros.data();
  m.bytes = static_cast<int64_t>(m.qweight.size() * 4 + m.qzeros.size() * 4 + m.scales.size() * 2);
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 9;
  int64_t group = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--group")) group = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps N] [--group G (-1: per channel)]\n", argv[0]);
      return 2;
    }
  }
  if (threads > 0) petrel::ThreadPool::set_global_threads(threads);
  std::printf("kernel: %s; threads %d\n", petrel::cpu::gptq_matmul_variant(), petrel::ThreadPool::global().size());
  std::printf("read bandwidth (1 GiB, all threads): %.1f GB/s\n", petrel::measure_read_bandwidth_gbs());
  std::mt19937 rng(1);
  struct Shape { const char* name; int64_t rows, cols; int bits; };
  // q/o with 16 and 64 more output channels: the same work with a row stride that is not a multiple of 4 KiB
  // (GPTQ's layout puts word row k at k * out * 4 bytes; at 4096 a sweep's rows share cache sets).
  const Shape shapes[] = {{"q/o 4096x4096", 4096, 4096, 4}, {"q/o+16 4112x4096", 4112, 4096, 4},
                          {"q/o+64 4160x4096", 4160, 4096, 4}, {"k/v 1024x4096", 1024, 4096, 4},
                          {"gate/up 14336x4096", 14336, 4096, 4}, {"down 4096x14336", 4096, 14336, 4},
                          {"lm_head 8-bit 128256x4096", 128256, 4096, 8}};
  std::printf("| matrix | GEMV us | GEMV GB/s | GEMM-128 ms | GEMM GMAC/s |\n|---|---:|---:|---:|---:|\n");
  for (const Shape& s : shapes) {
    const int64_t g = s.bits == 8 || group <= 0 ? s.cols : group;
    // GEMV: cycle through copies totalling >= 1 GiB so that weights come from DRAM, not the last-level cache,
    // as in a real decode step (8B: ~4 GB of weights per token).
    const Matrix first = make_matrix(s.rows, s.cols, s.bits, g, rng);
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
    std::printf("| %s | %.0f | %.1f | %.1f | %.1f |\n", s.name, tv * 1e6, first.bytes / tv / 1e9, tm * 1e3,
                128.0 * s.rows * s.cols / tm / 1e9);
  }
  return 0;
}
