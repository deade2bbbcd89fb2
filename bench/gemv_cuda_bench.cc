// petrel_bench_gemv_cuda: the CUDA W4A16 GEMV on Llama-3.1-8B's decode shapes, against the device's own
// copy bandwidth measured in the same run.
//
//   petrel_bench_gemv_cuda [--sweep] [--l2-hot] [--uniform-zeros] [--tma S,...] [--tma-splits K,...] [--reps N] [--calls N]
//                          [--json FILE] [--shapes RxC[:G],...]
//
// For each shape: random GPTQ tensors (speed does not depend on the values), checked once against
// ref::matmul (x rounded to fp16, as the tensor-core kernel multiplies it); then the median over --reps of
// the time per call of --calls back-to-back calls, timed with CUDA events, launched on a stream and replayed
// from a CUDA graph. The calls rotate over enough copies of the weights (>= 256 MB) that they come from
// device memory, not the 50-60 MB L2. GB/s counts the weight bytes (qweight, scales, zeros) over the time;
// "% copy" compares that with a device-to-device cudaMemcpy of 1 GiB, counting its bytes read plus written.
// --l2-hot reads one copy each call (from L2 where it fits: what the kernel does when memory is not the limit).
// --uniform-zeros gives every group the zero of a symmetric grid (what `petrel quantize` writes by default), so
// that group-128 shapes run the kernels' uniform-zeros builds, as the decode step does (random zeros otherwise).
// --sweep also times the tensor-core kernel at fixed k_splits, to check the planner's choice. --shapes replaces
// the Llama shapes with 4-bit rows x cols matrices (":128" for group 128), e.g. to see how a GEMV's time
// follows its grid: 28672x4096 is 448 blocks of 64 steps, 33792x3456 the same bytes in 528 blocks of 54.
// --tma S,... (4-bit per-channel shapes, and group shapes with --uniform-zeros) also times the tensor-copy-fed GEMV (gemv_tma.h) with S stages a warp,
// and beside it the tensor-core kernel with atomic split-K sums (the decode step's epilogue, which gemv_tma has):
// both add into y, so their rows compare loops and first loads, not epilogues. --tma-splits K,... gives gemv_tma
// those input slices (0, the default: the planner's, as the tensor-core kernel).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_bench_util.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/gemv_tma.h"
#include "petrel/kernels/ref/ops.h"
#include "petrel/quant/format.h"
#include "petrel/util/dtype.h"

// read_bandwidth.cu: a streaming read kernel, the ceiling for a kernel that only reads.
double read_bandwidth_gbs(const void* data, size_t bytes, int multiprocessors, cudaStream_t stream, int reps);
double pattern_read_gbs(const void* buffer, size_t buffer_bytes, int64_t rows, int64_t words, int splits, bool tiled, int in_flight,
                        cudaStream_t stream, int reps, int calls);

namespace {

using namespace petrel;
using petrel::bench::check;
using petrel::bench::copy_bandwidth_gbs;
using petrel::bench::median;
using petrel::bench::take;
#define CHECK_CUDA PETREL_BENCH_CHECK_CUDA

struct Shape {
  const char* name;
  int64_t rows, cols;
  int bits;
  int64_t group;  // -1: per-channel
};

// Random GPTQ tensors of the right shape, packed as quant::pack_gptq would (v1 zeros).
quant::GptqTensors random_gptq(const Shape& s, std::mt19937& rng, bool uniform_zeros) {
  quant::GptqTensors t;
  t.bits = s.bits;
  t.rows = s.rows;
  t.cols = s.cols;
  t.group_size = s.group < 0 ? s.cols : s.group;
  t.zero_offset = 1;
  const int64_t groups = s.cols / t.group_size;
  t.qweight.resize(s.cols * s.bits / 32 * s.rows);
  t.scales.resize(groups * s.rows);
  t.qzeros.resize(groups * s.rows * s.bits / 32);
  std::uniform_int_distribution<uint32_t> word;
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  for (int32_t& w : t.qweight) w = static_cast<int32_t>(word(rng));
  for (int32_t& w : t.qzeros) w = static_cast<int32_t>(word(rng));
  if (uniform_zeros) {  // zero 2^(bits-1), stored minus zero_offset, in every packed field
    const uint32_t stored = (1u << (s.bits - 1)) - 1;
    uint32_t packed = 0;
    for (int i = 0; i < 32; i += s.bits) packed |= stored << i;
    for (int32_t& w : t.qzeros) w = static_cast<int32_t>(packed);
  }
  for (uint16_t& h : t.scales) h = f32_to_f16(scale(rng));
  return t;
}

struct Timing {
  double stream_us = 0, graph_us = 0;
};

// Median time per call of `calls` calls (launch(c) the c-th) over `reps` repetitions, on a stream and as a
// replayed graph.
template <typename Launch>
Timing time_calls(cudaStream_t stream, int reps, int calls, const Launch& launch) {
  auto launch_all = [&] {
    for (int c = 0; c < calls; ++c) launch(c);
  };
  Timing t;
  t.stream_us = petrel::bench::median_event_us(stream, reps, launch_all) / calls;

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch_all();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  t.graph_us = petrel::bench::median_event_us(stream, reps, [&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }) / calls;
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaGetLastError());
  return t;
}

const char* algorithm_name(cuda::GemvAlgorithm a) {
  switch (a) {
    case cuda::GemvAlgorithm::kTensorCore: return "tensor core";
    case cuda::GemvAlgorithm::kCudaCore: return "cuda core";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30, calls = 50;
  bool sweep = false;
  bool l2_hot = false;  // --l2-hot: one copy of the weights, so that calls read them from L2 where they fit
  bool uniform_zeros = false;  // --uniform-zeros: the zeros of a symmetric grid
  std::vector<int> tma_stages;  // --tma: gemv_tma's stages a warp to time
  std::vector<int> tma_splits = {0};  // --tma-splits: and its input slices (0: the planner's)
  std::string json_path;
  std::vector<Shape> custom;
  std::deque<std::string> custom_names;  // Shape::name points into these
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--shapes" && i + 1 < argc) {
      for (const std::string& item : petrel::bench::split_list(argv[++i])) {
        long long rows = 0, cols = 0, group = -1;
        const int n = std::sscanf(item.c_str(), "%lldx%lld:%lld", &rows, &cols, &group);
        if (n < 2 || rows <= 0 || cols <= 0 || (n == 3 && group <= 0)) {
          std::fprintf(stderr, "--shapes: '%s' is not ROWSxCOLS or ROWSxCOLS:GROUP\n", item.c_str());
          return 2;
        }
        custom_names.push_back(item);
        custom.push_back({custom_names.back().c_str(), rows, cols, 4, n == 3 ? group : -1});
      }
    } else if (arg == "--sweep") sweep = true;
    else if (arg == "--l2-hot") l2_hot = true;
    else if (arg == "--uniform-zeros") uniform_zeros = true;
    else if (arg == "--tma" && i + 1 < argc) {
      for (const std::string& item : petrel::bench::split_list(argv[++i])) {
        const int stages = std::atoi(item.c_str());
        if (stages < 1 || stages > cuda::kMaxGemvTmaStages) {
          std::fprintf(stderr, "--tma: '%s' is not a stage count from 1 to %d\n", item.c_str(), cuda::kMaxGemvTmaStages);
          return 2;
        }
        tma_stages.push_back(stages);
      }
    } else if (arg == "--tma-splits" && i + 1 < argc) {
      tma_splits.clear();
      for (const std::string& item : petrel::bench::split_list(argv[++i])) tma_splits.push_back(std::max(0, std::atoi(item.c_str())));
    }
    else if (arg == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (arg == "--calls" && i + 1 < argc) calls = std::atoi(argv[++i]);
    else if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--sweep] [--l2-hot] [--uniform-zeros] [--tma S,...] [--tma-splits K,...] [--reps N] [--calls N] [--json FILE] [--shapes RxC[:G],...]\n",
                   argv[0]);
      return 2;
    }
  }
  const cuda::DeviceInfo dev = petrel::bench::open_first_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto ws = take(cuda::GemvWorkspace::create(), "workspace");

  const double copy_gbs = copy_bandwidth_gbs(stream, 20);
  double read_gbs = 0;
  {
    auto buffer = take(cuda::DeviceBuffer::allocate(size_t{1} << 30), "alloc");
    check(buffer.fill_bytes(3), "memset");
    read_gbs = read_bandwidth_gbs(buffer.data(), buffer.size(), dev.multiprocessors, stream, 20);
    if (sweep) {
      // The GEMV's loads alone, in the GPTQ layout and in a tiled one (each block's bytes contiguous), launched
      // on a stream (so about 1 us per call of launch gap is included, as in the "stream" column below).
      std::printf("| loads only: rows x words (int32) | k_splits | GPTQ layout GB/s | same, 16 loads in flight | tiled layout GB/s |\n"
                  "|---|---|---|---|---|\n");
      const int64_t cases[][3] = {{4096, 512, 16}, {14336, 512, 4}, {14336, 512, 16}, {4096, 1792, 16},
                                  {128256, 1024, 1}, {128256, 1024, 4}};
      for (const auto& c : cases) {
        const double gptq = pattern_read_gbs(buffer.data(), buffer.size(), c[0], c[1], int(c[2]), false, 8, stream, 20, 50);
        const double deep = pattern_read_gbs(buffer.data(), buffer.size(), c[0], c[1], int(c[2]), false, 16, stream, 20, 50);
        const double tiled = pattern_read_gbs(buffer.data(), buffer.size(), c[0], c[1], int(c[2]), true, 8, stream, 20, 50);
        std::printf("| %lld x %lld | %lld | %.0f | %.0f | %.0f |\n", (long long)c[0], (long long)c[1], (long long)c[2], gptq,
                    deep, tiled);
      }
      std::printf("\n");
    }
  }
  std::printf("device: %s, %d SMs, %.0f MiB L2, CUDA runtime %s, driver %s\n", dev.name.c_str(), dev.multiprocessors,
              dev.l2_cache_bytes / double(1 << 20), cuda::runtime_version().c_str(), cuda::driver_version().c_str());
  std::printf("device-to-device cudaMemcpy (1 GiB, read + write): %.0f GB/s\n", copy_gbs);
  std::printf("streaming read kernel (1 GiB, 16-byte loads): %.0f GB/s\n\n", read_gbs);
  if (l2_hot) std::printf("--l2-hot: every call reads the same copy of the weights (from L2 where it fits)\n\n");

  const std::vector<Shape> llama_shapes = {
      {"tiny 128x256 (launch cost)", 128, 256, 4, -1},
      {"q/o_proj 4096x4096", 4096, 4096, 4, -1},      {"q/o_proj 4096x4096", 4096, 4096, 4, 128},
      {"k/v_proj 1024x4096", 1024, 4096, 4, -1},      {"k/v_proj 1024x4096", 1024, 4096, 4, 128},
      {"gate/up 14336x4096", 14336, 4096, 4, -1},     {"gate/up 14336x4096", 14336, 4096, 4, 128},
      {"down 4096x14336", 4096, 14336, 4, -1},        {"down 4096x14336", 4096, 14336, 4, 128},
      {"lm_head 128256x4096 (8-bit)", 128256, 4096, 8, -1},
  };
  nlohmann::json results = nlohmann::json::array();
  std::printf("| shape | group | algorithm | k_splits | weight MB | floor us | us/call (stream) | us/call (graph) | "
              "weight GB/s | %% of copy | rel L2 vs ref |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(5);
  for (const Shape& s : custom.empty() ? llama_shapes : custom) {
    const quant::GptqTensors host = random_gptq(s, rng, uniform_zeros);
    const ref::GptqMatrix hm = host.view();
    auto first = take(cuda::DeviceGptqWeights::upload(hm), "upload");
    const int64_t weight_bytes = first.view().weight_bytes();
    // Copies of the weights so that the calls stream from device memory, not L2 (one with --l2-hot).
    const int n_copies = l2_hot ? 1 : static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / weight_bytes + 1, 1, 64));
    std::vector<cuda::DeviceBuffer> owned;
    std::vector<cuda::DeviceGptqMatrix> copies = {first.view()};
    const size_t qweight_bytes = s.cols * s.bits / 32 * s.rows * 4, scales_bytes = hm.n_groups() * s.rows * 2,
                 qzeros_bytes = hm.n_groups() * s.rows * s.bits / 32 * 4;
    auto copy_of = [&](const void* src, size_t bytes) {
      owned.push_back(take(cuda::DeviceBuffer::allocate(bytes), "alloc copy"));
      CHECK_CUDA(cudaMemcpy(owned.back().data(), src, bytes, cudaMemcpyDeviceToDevice));
      return owned.back().data();
    };
    for (int c = 1; c < n_copies; ++c) {
      cuda::DeviceGptqMatrix v = first.view();
      v.qweight = static_cast<const int32_t*>(copy_of(v.qweight, qweight_bytes));
      v.scales = static_cast<const uint16_t*>(copy_of(v.scales, scales_bytes));
      v.qzeros = static_cast<const int32_t*>(copy_of(v.qzeros, qzeros_bytes));
      copies.push_back(v);
    }
    std::vector<float> x(s.cols), x16(s.cols), want(s.rows), got(s.rows);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);
    for (int64_t i = 0; i < s.cols; ++i) x16[i] = f16_to_f32(f32_to_f16(x[i]));
    auto x_dev = take(cuda::DeviceBuffer::allocate(s.cols * 4), "alloc x");
    auto y_dev = take(cuda::DeviceBuffer::allocate(s.rows * 4), "alloc y");
    check(x_dev.upload(x.data(), s.cols * 4), "upload x");
    ref::matmul(x16.data(), 1, hm, want.data());

    std::vector<cuda::GemvOptions> configs = {{cuda::GemvAlgorithm::kTensorCore, 0}, {cuda::GemvAlgorithm::kCudaCore, 0}};
    {
      cuda::GemvOptions cluster{cuda::GemvAlgorithm::kTensorCore, 0};
      cluster.cluster_reduce = true;  // the split-K sums reduced in a thread-block cluster
      configs.insert(configs.begin() + 1, cluster);
    }
    if (sweep) {
      for (int k : {1, 2, 4, 8, 16, 32}) configs.push_back({cuda::GemvAlgorithm::kTensorCore, k});
      for (int k : {2, 4, 8, 16}) {
        cuda::GemvOptions cluster{cuda::GemvAlgorithm::kTensorCore, k};
        cluster.cluster_reduce = true;
        configs.push_back(cluster);
      }
    }
    const int64_t io_bytes = s.cols * 4 + s.rows * 4;
    const std::string group = s.group < 0 ? "channel" : std::to_string(s.group);
    // One row of the table: `launch(w)` runs the product on copy w; `adds` kernels add into y (zeroed for the check).
    auto measure = [&](const std::string& label, const std::string& splits, bool adds, const auto& launch) {
      check(y_dev.fill_bytes(adds ? 0 : 0xFF), "poison y");
      launch(first.view());
      CHECK_CUDA(cudaStreamSynchronize(stream));
      check(y_dev.download(got.data(), s.rows * 4), "download y");
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < s.rows; ++i) {
        diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        norm += double(want[i]) * want[i];
      }
      const double rel = std::isfinite(diff) ? std::sqrt(diff / norm) : INFINITY;
      const Timing t = time_calls(stream, reps, calls, [&](int c) { launch(copies[c % copies.size()]); });
      const double gbs = weight_bytes / (t.graph_us * 1e-6) / 1e9;
      const double floor_us = (weight_bytes + io_bytes) / (copy_gbs * 1e9) * 1e6;
      std::printf("| %s | %s | %s | %s | %.1f | %.2f | %.2f | %.2f | %.0f | %.0f%% | %.1e |\n", s.name, group.c_str(),
                  label.c_str(), splits.c_str(), weight_bytes / 1e6, floor_us, t.stream_us, t.graph_us, gbs,
                  100.0 * gbs / copy_gbs, rel);
      std::fflush(stdout);
      results.push_back({{"shape", s.name}, {"rows", s.rows}, {"cols", s.cols}, {"bits", s.bits}, {"group", group},
                         {"algorithm", label}, {"k_splits", splits}, {"weight_bytes", weight_bytes}, {"floor_us", floor_us},
                         {"stream_us", t.stream_us}, {"graph_us", t.graph_us}, {"weight_gbs", gbs},
                         {"copy_gbs", copy_gbs}, {"rel_l2", rel}});
    };
    for (const cuda::GemvOptions& options : configs) {
      auto plan = cuda::plan_gemv_gptq(first.view(), ws.multiprocessors(), ws.partial_capacity(), options);
      if (!plan.ok()) continue;  // a fixed split this shape cannot take
      measure(std::string(algorithm_name(options.algorithm)) + (options.cluster_reduce ? " cluster" : ""),
              (options.k_splits == 0 ? "auto " : "") + std::to_string(plan->k_splits), false,
              [&](const cuda::DeviceGptqMatrix& w) {
                check(cuda::gemv_gptq(w, x_dev.as<float>(), y_dev.as<float>(), ws, stream, options), "gemv");
              });
    }
    if (!tma_stages.empty() && cuda::gemv_gptq_tma_supports(first.view()).ok()) {
      cuda::GemvOptions atomic{cuda::GemvAlgorithm::kTensorCore, 0};
      atomic.atomic_reduce = true;
      const int splits = take(cuda::plan_gemv_gptq(first.view(), ws.multiprocessors(), ws.partial_capacity(), atomic),
                              "plan").k_splits;
      measure("tensor core atomic", "auto " + std::to_string(splits), true, [&](const cuda::DeviceGptqMatrix& w) {
        check(cuda::gemv_gptq(w, x_dev.as<float>(), y_dev.as<float>(), ws, stream, atomic), "gemv");
      });
      for (const int k : tma_splits) {
        for (const int stages : tma_stages) {
          cuda::GemvTmaOptions tma;
          tma.stages = stages;
          tma.k_splits = k;
          measure("tma " + std::to_string(stages) + " stages", k == 0 ? "auto " + std::to_string(splits) : std::to_string(k), true,
                  [&](const cuda::DeviceGptqMatrix& w) {
                    check(cuda::gemv_gptq_tma(w, x_dev.as<float>(), y_dev.as<float>(), dev.multiprocessors, stream, tma), "gemv_tma");
                  });
        }
      }
    }
  }
  if (!json_path.empty()) {
    nlohmann::json doc = {{"device", dev.name}, {"copy_gbs", copy_gbs}, {"read_gbs", read_gbs}, {"reps", reps}, {"calls", calls}, {"l2_hot", l2_hot}, {"uniform_zeros", uniform_zeros},
                          {"results", results}};
    std::ofstream(json_path) << doc.dump(2) << "\n";
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
